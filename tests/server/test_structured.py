"""Structured output through a real `peregrine serve` on the tiny random fixture model (byte-level
tokenizer): response_format on /v1/chat/completions and /v1/completions (official openai client), native
regex / ebnf / json_schema in /generate. The model's logits are noise, so every output is what the grammar
mask and the end-of-budget steering make of them: each must be complete (finish_reason "stop") and valid
(jsonschema with format checking, re.fullmatch, a recursive-descent parser per EBNF grammar). Unsupported features are 400s
naming them."""
import json
import os
import re
import socket
import sys
import threading
import time

import jsonschema
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_serve import NAME, Server  # noqa: E402

MAX_TOKENS = 128
NO_THINKING = {"thinking": {"type": "disabled"}}

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "bb", "ccc"]}, "maxItems": 3}},
     "required": ["ok", "tags"]},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"}, "score": {"type": "number", "minimum": -1, "maximum": 1},
                                      "when": {"type": "string", "format": "date"}}, "required": ["id", "score", "when"]},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                        "required": ["v", "next"]}}, "$ref": "#/$defs/node"},
    {"type": "array", "items": {"type": "object", "properties": {"k": {"const": "x"}, "ip": {"type": "string", "format": "ipv4"}}, "required": ["k", "ip"]},
     "minItems": 1, "maxItems": 2},
    {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 5}, {"type": "null"}]},
]
REGEXES = [r"\(\d{3}\) \d{3}-\d{4}", r"[a-z]+@[a-z]+\.(com|org)", r"(yes|no|maybe)( because [a-z ]{1,20})?", r"-?\d+(\.\d+)?"]
EBNFS = [
    'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= factor (("*" | "/") factor)*\nfactor ::= [0-9]+ | "(" expr ")"',
    'root ::= "[" (item ("," item)*)? "]"\nitem ::= "true" | "false" | [a-z]{1,6}',
]


def parses_arithmetic(text):
    """Recursive descent for EBNFS[0]: True when the whole text is one expression."""
    pos = 0

    def number_or_group():
        nonlocal pos
        if pos < len(text) and text[pos] == "(":
            pos += 1
            if not expr() or pos >= len(text) or text[pos] != ")":
                return False
            pos += 1
            return True
        start = pos
        while pos < len(text) and text[pos].isdigit() and text[pos].isascii():
            pos += 1
        return pos > start

    def chain(item, ops):
        nonlocal pos
        if not item():
            return False
        while pos < len(text) and text[pos] in ops:
            pos += 1
            if not item():
                return False
        return True

    def expr():
        return chain(lambda: chain(number_or_group, "*/"), "+-")

    return expr() and pos == len(text)


EBNF_CHECKS = [parses_arithmetic, lambda t: re.fullmatch(r"\[([a-z]{1,6}(,[a-z]{1,6})*)?\]", t) is not None]


@pytest.fixture(scope="module")
def server():
    s = Server("--kv-memory", "64M", "--context-length", "2048")
    yield s
    s.stop()


def validate(schema, text):
    jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_chat_json_schema_outputs_are_valid(server, index):
    schema = SCHEMAS[index]
    r = server.client().chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "answer in json"}], max_tokens=MAX_TOKENS, n=2, seed=index,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}, extra_body=NO_THINKING)
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        validate(schema, c.message.content)


def test_chat_json_object_and_streaming(server):
    c = server.client()
    r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "json please"}], max_tokens=MAX_TOKENS, seed=7,
                                  response_format={"type": "json_object"}, extra_body=NO_THINKING)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    schema = SCHEMAS[0]
    text, finish = "", None
    for chunk in c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "json"}], max_tokens=MAX_TOKENS, seed=3, stream=True,
                                           response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}, extra_body=NO_THINKING):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    validate(schema, text)


def test_completions_response_format(server):
    schema = SCHEMAS[1]
    r = server.client().completions.create(model=NAME, prompt="json: ", max_tokens=MAX_TOKENS, n=2, seed=1,
                                           extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}})
    for c in r.choices:
        assert c.finish_reason == "stop"
        validate(schema, c.text)


def generate(server, sp, text="x"):
    status, data = server.raw("POST", "/generate", {"text": text, "sampling_params": {"max_new_tokens": MAX_TOKENS, **sp}})
    return status, json.loads(data)


@pytest.mark.parametrize("index", range(len(REGEXES)))
def test_generate_regex_fullmatch(server, index):
    for seed in range(2):
        status, out = generate(server, {"regex": REGEXES[index], "seed": seed})
        assert status == 200, out
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        assert re.fullmatch(REGEXES[index], out["text"]), out["text"]


@pytest.mark.parametrize("index", range(len(EBNFS)))
def test_generate_ebnf_parses(server, index):
    for seed in range(3):
        status, out = generate(server, {"ebnf": EBNFS[index], "seed": seed})
        assert status == 200, out
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        assert EBNF_CHECKS[index](out["text"]), out["text"]


def test_generate_json_schema_object_and_string(server):
    schema = SCHEMAS[2]
    for sp in ({"json_schema": schema}, {"json_schema": json.dumps(schema)}):
        status, out = generate(server, {**sp, "seed": 5})
        assert status == 200, out
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        validate(schema, out["text"])


def test_short_budget_still_completes(server):
    # The shortest valid output of SCHEMAS[0] is 20 bytes: steering must land on it within 24 tokens.
    for seed in range(4):
        status, out = generate(server, {"json_schema": SCHEMAS[0], "seed": seed, "max_new_tokens": 24})
        assert status == 200 and out["meta_info"]["finish_reason"]["type"] == "stop", out
        validate(SCHEMAS[0], out["text"])


def error_of(status, data):
    assert status == 400, data
    return json.loads(data)["error"] if isinstance(data, (bytes, str)) else data["error"]


def test_unsupported_features_are_400s_naming_them(server):
    bad = {"type": "object", "patternProperties": {"^x": {"type": "string"}}}
    status, data = server.raw("POST", "/v1/chat/completions", {
        "model": NAME, "messages": [{"role": "user", "content": "json"}], "thinking": {"type": "disabled"},
        "response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": bad}}})
    e = error_of(status, data)
    assert e["param"] == "response_format" and "patternProperties" in e["message"]
    status, data = server.raw("POST", "/v1/completions", {"model": NAME, "prompt": "x",
                                                         "response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": {"not": {}}}}})
    e = error_of(status, data)
    assert e["param"] == "response_format" and "not" in e["message"]
    status, out = generate(server, {"json_schema": {"type": "array", "uniqueItems": True}})
    e = error_of(status, out)
    assert e["param"] == "sampling_params.json_schema" and "uniqueItems" in e["message"]
    status, out = generate(server, {"regex": "a(?=b)"})
    e = error_of(status, out)
    assert e["param"] == "sampling_params.regex" and "lookaround" in e["message"].lower()
    status, out = generate(server, {"ebnf": "root ::= root \"a\""})
    assert error_of(status, out)["param"] == "sampling_params.ebnf"
    status, out = generate(server, {"regex": "a", "ebnf": 'root ::= "a"'})
    assert error_of(status, out)["param"] == "sampling_params"


def test_hostile_nesting_is_a_400_and_the_server_lives(server):
    """Requests that once crashed the server (unbounded recursion) or burnt a core (80,000 keys parse in quadratic
    time): each is a 400 at once, and the server still answers."""
    chat = {"model": NAME, "messages": [{"role": "user", "content": "a"}], "max_tokens": 4, "thinking": {"type": "disabled"}}
    ref_loop = {**chat, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#", "minLength": 1}}}}
    deep_regex = {"text": "a", "sampling_params": {"max_new_tokens": 2, "regex": "(" * 12000 + "a" + ")" * 12000}}
    deep_ebnf = {"text": "a", "sampling_params": {"max_new_tokens": 2, "ebnf": "root ::= " + "(" * 17000 + '"a"' + ")" * 17000}}
    # Python's json cannot build these: the deep part is spliced in as text.
    deep_ignored = json.dumps({"text": "a", "sampling_params": {"max_new_tokens": 2, "ignored": "X"}}).replace(
        '"X"', "[" * 70000 + "]" * 70000)
    deep_tool = json.dumps({**chat, "tools": [{"type": "function", "function": {"name": "f", "parameters": "X"}}]}).replace(
        '"X"', '{"a":' * 44000 + "1" + "}" * 44000)
    for path, body, says in [("/v1/chat/completions", json.dumps(ref_loop), "levels"),
                             ("/generate", json.dumps(deep_regex), "deeper than"),
                             ("/generate", json.dumps(deep_ebnf), "deeper than"),
                             ("/generate", deep_ignored, "deeper than"),
                             ("/v1/chat/completions", deep_tool, "deeper than"),
                             ("/v1/chat/completions", json.dumps({**chat, **{f"k{i}": 0 for i in range(80000)}}),
                              "more than 10000 members")]:
        status, data = server.raw("POST", path, body)
        assert status == 400, (path, status, data[:200])
        assert says in json.loads(data)["error"]["message"], (path, data[:300])
    assert server.raw("GET", "/health")[0] == 200


def test_thinking_with_response_format_is_rejected(server):
    status, data = server.raw("POST", "/v1/chat/completions", {
        "model": NAME, "messages": [{"role": "user", "content": "json"}], "thinking": {"type": "enabled"},
        "response_format": {"type": "json_object"}})
    e = error_of(status, data)
    assert e["param"] == "response_format" and "thinking" in e["message"]


def test_ebnf_checkers_can_fail():
    assert parses_arithmetic("(1+23)*4-5") and not parses_arithmetic("(1+2") and not parses_arithmetic("1+")
    assert EBNF_CHECKS[1]("[ab,true]") and not EBNF_CHECKS[1]("[ab,]")


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                         "unit": {"enum": ["c", "f"]}}, "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_choice_forces_valid_tool_calls(server, choice):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    r = server.client().chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS, tool_choice=choice, max_tokens=400, n=2,
        seed=11, extra_body=NO_THINKING)
    for c in r.choices:
        assert c.finish_reason == "tool_calls", c.message
        assert c.message.tool_calls, c.message
        for call in c.message.tool_calls:
            if isinstance(choice, dict):
                assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


@pytest.fixture(scope="module")
def demo():
    """The embedded demo model: a real byte-level BPE tokenizer (4096 ids, multi-byte tokens, ｜DSML｜ as an
    added token that only the tool-call grammar may spell)."""
    import test_serve
    saved = test_serve.MODEL
    test_serve.MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../models/peregrine-demo-v4")
    try:
        s = Server("--kv-memory", "64M", "--context-length", "2048")
    finally:
        test_serve.MODEL = saved
    yield s
    s.stop()


def test_demo_model_real_tokenizer(demo):
    c = demo.client()
    for schema in (SCHEMAS[2],):
        r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "answer in json"}], max_tokens=MAX_TOKENS, n=2, seed=2,
                                      response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}, extra_body=NO_THINKING)
        for ch in r.choices:
            assert ch.finish_reason == "stop", ch.message.content
            validate(schema, ch.message.content)
    status, out = generate(demo, {"regex": REGEXES[1], "seed": 3}, text="ROMEO:")
    assert status == 200 and out["meta_info"]["finish_reason"]["type"] == "stop", out
    assert re.fullmatch(REGEXES[1], out["text"]), out["text"]
    schema = TOOLS[0]["function"]["parameters"]
    r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS, tool_choice="required",
                                  max_tokens=200, seed=4, extra_body=NO_THINKING)
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls" and ch.message.tool_calls, ch.message
        for call in ch.message.tool_calls:
            if call.function.name == "get_weather":
                jsonschema.validate(json.loads(call.function.arguments), schema)
            else:
                assert call.function.name == "ping" and json.loads(call.function.arguments) == {}


def rule_chain(rules, letter):
    """A chain of EBNF rules, each also recursive (so none is inlined): 10,000 take some 0.2 s to compile, longer
    than the budget of the server below (issue 31's reproducer, a plain 20,000-rule chain, took minutes once)."""
    lines = ["root ::= r0"] + [f'r{i} ::= "{letter}" r{i + 1} | "x" r{i}' for i in range(rules - 1)]
    lines.append(f'r{rules - 1} ::= "{letter}"')
    return json.dumps({"text": "a", "sampling_params": {"max_new_tokens": 2, "ebnf": "\n".join(lines)}})


@pytest.fixture(scope="module")
def one_compile_thread():
    s = Server("--kv-memory", "64M", "--grammar-compile-threads", "1", "--grammar-compile-queue", "0",
               "--grammar-compile-timeout", "0.05")
    yield s
    s.stop()


def test_compile_budget_is_a_400_within_the_budget(one_compile_thread):
    t0 = time.monotonic()
    status, data = one_compile_thread.raw("POST", "/generate", rule_chain(10000, "a"))
    took = time.monotonic() - t0
    e = error_of(status, data)
    assert e["code"] == "grammar_too_complex" and e["param"] == "sampling_params.ebnf", e
    assert "50 ms budget" in e["message"] and "--grammar-compile-timeout" in e["message"], e
    assert took < 0.05 + 1.5, took
    # The verdict is remembered: asking again costs nothing.
    t0 = time.monotonic()
    assert one_compile_thread.raw("POST", "/generate", rule_chain(10000, "a"))[0] == 400
    assert time.monotonic() - t0 < 1


def test_full_compile_queue_is_a_429(one_compile_thread):
    # While a slow grammar's parse and compilation hold the only compile thread (its 50 ms budget), another grammar is
    # refused; until it starts (a loaded machine may take a while to read its body), others compile at once (each a
    # new grammar: a compiled one is served from the cache without the compile thread). A busy machine may let the
    # window pass between two probes: each try takes a new slow grammar (a verdict is cached too).
    status, data, n = 0, b"", 20
    for slow_letter in "bfghijkl":
        slow = threading.Thread(target=one_compile_thread.raw,
                                args=("POST", "/generate", rule_chain(10000, slow_letter)))
        slow.start()
        status = 0
        while status != 429 and (slow.is_alive() or status == 0):
            status, data = one_compile_thread.raw("POST", "/generate", rule_chain(n, "c"))
            assert status in (200, 429), data
            n += 1
        slow.join()
        if status == 429:
            break
    assert status == 429, data
    e = json.loads(data)["error"]
    assert e["code"] == "grammar_queue_full" and "--grammar-compile-queue" in e["message"], e


def test_client_gone_cancels_its_compilation(one_compile_thread):
    body = rule_chain(20000, "d").encode()
    with socket.create_connection(("127.0.0.1", one_compile_thread.port)) as s:
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(0.5)
    # Had it gone on, the only compile thread would be busy for 2.5 s more and this would be a 429.
    time.sleep(0.2)
    status, data = one_compile_thread.raw("POST", "/generate", rule_chain(20, "e"))
    assert status == 200, data
