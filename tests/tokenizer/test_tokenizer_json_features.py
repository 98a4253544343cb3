"""Parity with HF `tokenizers` on variants of the small tokenizer.json that exercise the parts of the
format DeepSeek's file does not use: both merges formats, ignore_merges, every Split behavior and
invert, String patterns, ByteLevel(add_prefix_space, use_regex), normalizers, added-token flags
(lstrip, rstrip, single_word, normalized) and TemplateProcessing for --add-bos."""
import copy
import json

import pytest
from tokenizers import AddedToken, Tokenizer

from corpus import corpus
from test_hf_parity import SMALL, run

BASE = json.load(open(SMALL, encoding="utf-8"))
TEXTS = corpus(700, seed=99)
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_level(prefix=False, regex=False):
    return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True, "use_regex": regex}


def split(pattern, behavior, invert=False, kind="Regex"):
    return {"type": "Split", "pattern": {kind: pattern}, "behavior": behavior, "invert": invert}


def seq(*pre):
    return {"type": "Sequence", "pretokenizers": list(pre)}


def variant(name):
    j = copy.deepcopy(BASE)
    if name == "merges_as_strings":
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    elif name == "ignore_merges":
        j["model"]["ignore_merges"] = True
    elif name == "gpt2_bytelevel":
        j["pre_tokenizer"] = byte_level(prefix=True, regex=True)
    elif name == "bytelevel_regex_noprefix":
        j["pre_tokenizer"] = byte_level(prefix=False, regex=True)
    elif name == "llama3_split":
        j["pre_tokenizer"] = seq(split(LLAMA3, "Isolated"), byte_level())
    elif name.startswith("behavior_"):
        _, behavior, invert = name.split("_")
        j["pre_tokenizer"] = seq(split(r"\s+|\d", behavior, invert == "inv"), split(r"[a-z]+", behavior, invert == "inv"),
                                 byte_level())
    elif name == "deepseek_coder_style":
        j["pre_tokenizer"] = seq(split(r"[\r\n]", "Isolated"), split(r"\s?\p{L}+", "Isolated"),
                                 split(r"\s?\p{P}+", "Isolated"), split("[一-龥ࠀ-一가-퟿]+", "Isolated"),
                                 {"type": "Digits", "individual_digits": True}, byte_level())
    elif name == "digit_runs_punctuation":
        j["pre_tokenizer"] = seq({"type": "Digits", "individual_digits": False},
                                 {"type": "Punctuation", "behavior": "MergedWithNext"}, byte_level(prefix=True))
    elif name == "whitespace":
        j["pre_tokenizer"] = seq({"type": "Whitespace"}, byte_level())
    elif name == "whitespace_split_no_bytelevel":
        j["pre_tokenizer"] = {"type": "WhitespaceSplit"}
    elif name == "bert_pre_tokenizer":
        j["pre_tokenizer"] = seq({"type": "BertPreTokenizer"}, byte_level())
    elif name == "string_pattern":
        j["pre_tokenizer"] = seq(split(" ", "MergedWithNext", kind="String"), split("ab", "Isolated", kind="String"),
                                 byte_level(prefix=True))
    elif name == "norm_nfkc_lower":
        j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}
    elif name == "norm_nfd_strip_accents":
        j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"},
                                                                {"type": "Strip", "strip_left": True, "strip_right": True}]}
    elif name == "norm_replace_prepend":
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            {"type": "Replace", "pattern": {"Regex": r"\d+"}, "content": "#"},
            {"type": "Prepend", "prepend": "▁"}, {"type": "NFC"}, {"type": "NFKD"}]}
    elif name == "added_flags":
        j["normalizer"] = {"type": "Lowercase"}
        extra = [("<mask>", dict(lstrip=True, rstrip=True, single_word=False, normalized=False, special=True)),
                 ("the", dict(lstrip=False, rstrip=False, single_word=True, normalized=True, special=False)),
                 ("ing", dict(lstrip=False, rstrip=True, single_word=False, normalized=True, special=False)),
                 ("HELLO", dict(lstrip=True, rstrip=False, single_word=False, normalized=True, special=False)),
                 ("世界", dict(lstrip=False, rstrip=False, single_word=True, normalized=False, special=False))]
        # Ids as HF assigns them (a content already in the vocabulary keeps its vocabulary id).
        t = Tokenizer.from_str(json.dumps(j))
        for content, flags in extra:
            tok = AddedToken(content, **{k: v for k, v in flags.items() if k != "special"}, special=flags["special"])
            (t.add_special_tokens if flags["special"] else t.add_tokens)([tok])
        j = json.loads(t.to_str())
    elif name == "template_bos":
        j["post_processor"] = {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<｜begin▁of▁sentence｜>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<｜begin▁of▁sentence｜>": {"id": "<｜begin▁of▁sentence｜>", "ids": [0],
                                                                            "tokens": ["<｜begin▁of▁sentence｜>"]}}}
    else:
        raise KeyError(name)
    return j


VARIANTS = ["deepseek_coder_style", "digit_runs_punctuation", "whitespace", "whitespace_split_no_bytelevel",
            "bert_pre_tokenizer", "merges_as_strings", "ignore_merges", "gpt2_bytelevel", "bytelevel_regex_noprefix", "llama3_split",
            "string_pattern", "norm_nfkc_lower", "norm_nfd_strip_accents", "norm_replace_prepend", "added_flags"] + [
    f"behavior_{b}_{i}" for b in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]
    for i in ["inv", "noinv"]]


def ours(path, texts, tmp_path, special, extra=()):
    f = tmp_path / "in.jsonl"
    f.write_text("".join(json.dumps(t) + "\n" for t in texts), encoding="utf-8")
    args = ["tokenize", "--tokenizer", str(path), "--jsonl-file", str(f)] + (["--special"] if special else []) + list(extra)
    return [json.loads(x) for x in run(args).decode().splitlines()]


@pytest.mark.parametrize("name", VARIANTS)
def test_variant(name, tmp_path):
    j = variant(name)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    plain = copy.deepcopy(j)
    plain["added_tokens"] = []
    for special, ref_json in [(True, j), (False, plain)]:
        ref = Tokenizer.from_str(json.dumps(ref_json))
        want = [e.ids for e in ref.encode_batch(TEXTS, add_special_tokens=False)]
        got = ours(path, TEXTS, tmp_path, special)
        bad = [i for i in range(len(TEXTS)) if want[i] != got[i]]
        assert not bad, [(TEXTS[i], want[i], got[i]) for i in bad[:3]]


def test_add_bos_follows_template(tmp_path):
    j = variant("template_bos")
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    ref = Tokenizer.from_str(json.dumps(j))
    want = [e.ids for e in ref.encode_batch(TEXTS[:200], add_special_tokens=True)]
    assert ours(path, TEXTS[:200], tmp_path, True, ["--add-bos"]) == want


def test_add_bos_from_tokenizer_config():
    model_dir = str(SMALL).rsplit("/", 1)[0]
    out = run(["tokenize", "--model", model_dir, "--text", "Hi", "--add-bos", "--json"]).decode()
    ref = Tokenizer.from_file(SMALL).encode("Hi", add_special_tokens=False).ids
    assert json.loads(out) == [0] + ref


@pytest.mark.parametrize("bad,needle", [
    ({"model": {"type": "WordPiece"}}, "WordPiece"),
    ({"normalizer": {"type": "BertNormalizer"}}, "BertNormalizer"),
    ({"pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}},
     "Metaspace"),
])
def test_unsupported_features_are_named(bad, needle, tmp_path):
    j = copy.deepcopy(BASE)
    for k, v in bad.items():
        if k == "model":
            j["model"]["type"] = v["type"]
        else:
            j[k] = v
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    import subprocess
    from test_hf_parity import BINARY
    p = subprocess.run([BINARY, "tokenize", "--tokenizer", str(path), "--text", "x"], capture_output=True)
    assert p.returncode != 0 and needle in p.stderr.decode(), p.stderr
