"""End-to-end tool calling and thinking through `peregrine serve` on the demo model (real DeepSeek-V4 tokenizer
with ｜DSML｜, <think>, </think> as added tokens), driven by the official openai and anthropic clients.

The completions are forced with `--scripted-output` (a testing aid: each generating request emits the next
scripted text token by token through the normal engine path), so tool calls and reasoning occur for sure
and the assertions check the server's protocol handling, not the model's choices."""
import http.client
import json
import os
import re
import subprocess
import tempfile

import anthropic
import openai
import pytest

BIN = os.environ.get("PEREGRINE_BINARY", os.path.join(os.path.dirname(__file__), "../../build/peregrine"))
MODEL = os.environ.get("PEREGRINE_DEMO_MODEL", os.path.join(os.path.dirname(__file__), "../../models/peregrine-demo-v4"))
NAME = "demo"
D = "｜DSML｜"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                     "opts": {"type": "object"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
A_WEATHER = {"name": "get_weather", "description": "Weather forecast",
             "input_schema": WEATHER["function"]["parameters"]}
A_SEARCH = {"name": "search", "description": "Search the web", "input_schema": SEARCH["function"]["parameters"]}
TOOLS = [WEATHER, SEARCH]
A_TOOLS = [A_WEATHER, A_SEARCH]


def param(name, value, v41=False):
    sp = " " if v41 else ""
    if isinstance(value, str):
        return f'<{D}{sp}parameter name="{name}" string="true">{value}</{D}{sp}parameter>'
    return f'<{D}{sp}parameter name="{name}" string="false">{json.dumps(value, ensure_ascii=False)}</{D}{sp}parameter>'


def dsml(calls, v41=False):
    """A tool-call block: V4 tags (tool_calls / invoke / parameter) or the V4.1 form ("｜DSML｜ calls")."""
    sp = " " if v41 else ""
    block = " calls" if v41 else "tool_calls"
    out = f"\n\n<{D}{block}>\n"
    for name, args in calls:
        out += f'<{D}{sp}invoke name="{name}">\n'
        out += "".join(param(k, v, v41) + "\n" for k, v in args.items())
        out += f"</{D}{sp}invoke>\n"
    return out + f"</{D}{block}>"


class Server:
    def __init__(self, script=None):
        args = [BIN, "serve", "--model", MODEL, "--port", "0", "--served-model-name", NAME,
                "--kv-memory", "64M", "--context-length", "4096"]
        self.script_file = None
        if script is not None:
            self.script_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
            json.dump(script, self.script_file, ensure_ascii=False)
            self.script_file.close()
            args += ["--scripted-output", self.script_file.name]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"http://([\d.]+):(\d+)", line)
        assert m, f"server did not start: {line!r}"
        self.url = f"http://127.0.0.1:{m.group(2)}"

    def openai(self):
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=60)

    def anthropic(self):
        return anthropic.Anthropic(base_url=self.url, api_key="none", max_retries=0, timeout=60)

    def post(self, path, body):
        c = http.client.HTTPConnection(self.url.split("//")[1].split(":")[0], int(self.url.rsplit(":", 1)[1]), timeout=60)
        c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = json.loads(r.read())
        c.close()
        return r.status, data

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self.script_file:
            os.unlink(self.script_file.name)



# One server for the module, so that the long tool-listing prompt is prefilled once and then served from the
# prefix cache (every request lists the same tools and uses effort "low", which V4 does not write). The script
# holds every test's completions in the order the tests run (pytest runs a file top to bottom).
SCRIPT = []


def script(*completions):
    SCRIPT.extend(completions)
    return completions


@pytest.fixture(scope="module")
def server():
    s = Server(SCRIPT)
    yield s
    s.stop()


NESTED = {"city": "Zürich 😀 \"q\" \\", "opts": {"u": ["C", "F"], "d": {"x": None, "y": 1.5, "z": True}}}
PARALLEL = [("get_weather", NESTED), ("search", {"query": "日本"}), ("get_weather", {"city": "Oslo", "days": 1})]
SHORT = [("search", {"query": "日本"}), ("get_weather", {"city": "Oslo", "days": 1})]
USER = [{"role": "user", "content": "Weather?"}]


def check_calls(calls, expected):
    assert [c.function.name for c in calls] == [n for n, _ in expected]
    assert [json.loads(c.function.arguments) for c in calls] == [a for _, a in expected]
    ids = [c.id for c in calls]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == len(ids)


script("Checking." + dsml(PARALLEL), "Checking." + dsml(SHORT, v41=True))


@pytest.mark.parametrize("v41", [False, True])
def test_openai_parallel_tool_calls_non_streaming(server, v41):
    r = server.openai().chat.completions.create(model=NAME, messages=USER, tools=TOOLS, max_tokens=400)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content == "Checking."
    check_calls(c.message.tool_calls, SHORT if v41 else PARALLEL)


script(dsml(PARALLEL))


def test_openai_tool_calls_streaming(server):
    chunks = list(server.openai().chat.completions.create(model=NAME, messages=USER, tools=TOOLS,
                                                          max_tokens=400, stream=True))
    deltas = [tc for ch in chunks for c in ch.choices for tc in (c.delta.tool_calls or [])]
    assert deltas, "no tool-call deltas streamed"
    calls = {}
    fragments = {}
    for tc in deltas:
        if tc.index not in calls:  # the first delta of a call names it
            assert tc.id and tc.function.name and tc.type == "function"
            calls[tc.index] = {"id": tc.id, "name": tc.function.name, "args": ""}
        else:
            assert tc.id is None and tc.function.name is None
        calls[tc.index]["args"] += tc.function.arguments or ""
        fragments[tc.index] = fragments.get(tc.index, 0) + 1
    assert sorted(calls) == [0, 1, 2]
    assert max(fragments.values()) > 2, "arguments should arrive in several fragments"
    assert [(calls[i]["name"], json.loads(calls[i]["args"])) for i in range(3)] == PARALLEL
    finishes = [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason]
    assert finishes == ["tool_calls"]


script("Let me think about 日本.\n</think>\n\nIt is sunny.", "Plan 😀</think>Done.")


def test_openai_thinking_split(server):
    c = server.openai()
    kw = dict(model=NAME, messages=USER, tools=TOOLS, max_tokens=100, reasoning_effort="low")
    r = c.chat.completions.create(**kw)
    m = r.choices[0].message
    assert m.content == "It is sunny." and m.reasoning_content == "Let me think about 日本."
    assert r.choices[0].finish_reason == "stop"
    chunks = list(c.chat.completions.create(stream=True, **kw))
    reasoning = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in chunks if ch.choices)
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert (reasoning, content) == ("Plan 😀", "Done.")


script(f'Hi <{D}tool_calls>\n<{D}bogus name="x">')


def test_openai_malformed_dsml_is_text(server):
    r = server.openai().chat.completions.create(model=NAME, messages=USER, tools=TOOLS, max_tokens=200)
    m = r.choices[0].message
    assert not m.tool_calls and r.choices[0].finish_reason == "stop"
    assert m.content.startswith("Hi") and D in m.content


INVOKE = dsml([("search", {"query": "x"})])
AFTER_OPEN = INVOKE[INVOKE.index(">\n") + 2:]  # the prompt already opened the block
script(AFTER_OPEN, AFTER_OPEN, INVOKE)


def test_openai_tool_choice(server):
    c = server.openai()
    r = c.chat.completions.create(model=NAME, messages=USER, tools=TOOLS, tool_choice="required", max_tokens=200)
    check_calls(r.choices[0].message.tool_calls, [("search", {"query": "x"})])
    r = c.chat.completions.create(model=NAME, messages=USER, tools=TOOLS,
                                  tool_choice={"type": "function", "function": {"name": "search"}}, max_tokens=200)
    check_calls(r.choices[0].message.tool_calls, [("search", {"query": "x"})])
    r = c.chat.completions.create(model=NAME, messages=USER, tools=TOOLS, tool_choice="none", max_tokens=200)
    assert not r.choices[0].message.tool_calls and D in r.choices[0].message.content
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=NAME, messages=USER, tools=TOOLS, tool_choice="required",
                                  reasoning_effort="low", max_tokens=10)


script(AFTER_OPEN, AFTER_OPEN, AFTER_OPEN)


def test_budget_ends_inside_a_call(server):
    """max_tokens running out inside a required call gives finish_reason "length" with what was produced, never
    "tool_calls" with a call that misses its required arguments."""
    c = server.openai()
    kw = dict(model=NAME, messages=USER, tools=TOOLS, tool_choice="required", max_tokens=20)  # inside the call
    r = c.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 20
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["search"]  # what was produced
    chunks = list(c.chat.completions.create(stream=True, **kw))
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["length"]
    r = server.anthropic().messages.create(model=NAME, max_tokens=20, messages=USER, tools=A_TOOLS,
                                           tool_choice={"type": "any"})
    assert r.stop_reason == "max_tokens"


script("Thinking it over.</think>" + dsml([("get_weather", {"city": "Paris", "days": 2})]),
       "Sunny, 20 degrees.</think>It will be sunny.")


def test_openai_agent_loop_hits_prefix_cache(server):
    c = server.openai()
    kw = dict(model=NAME, tools=TOOLS, max_tokens=300, reasoning_effort="low", parallel_tool_calls=True)
    r1 = c.chat.completions.create(messages=[{"role": "user", "content": "Paris?"}], **kw)
    m = r1.choices[0].message
    assert r1.choices[0].finish_reason == "tool_calls" and m.reasoning_content == "Thinking it over."
    history = [{"role": "user", "content": "Paris?"},
               {"role": "assistant", "content": m.content, "reasoning_content": m.reasoning_content,
                "tool_calls": [t.model_dump() for t in m.tool_calls]},
               {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "sunny, 20 C"}]
    r2 = c.chat.completions.create(messages=history, **kw)
    assert r2.choices[0].message.content == "It will be sunny."
    cached = r2.usage.prompt_tokens_details.cached_tokens
    # Turn 1's prompt and completion come back re-encoded token for token, so all but the last page hit.
    assert cached >= r1.usage.prompt_tokens + r1.usage.completion_tokens - 16, (cached, r1.usage)


# ---- Anthropic Messages API -------------------------------------------------------------------------------

script("I should check.</think>Let me look." + dsml([("get_weather", NESTED)]), "Fine.</think>It is sunny in Zürich.")


def test_anthropic_tool_use_round_trip(server):
    c = server.anthropic()
    kw = dict(model=NAME, max_tokens=2000, tools=A_TOOLS, thinking={"type": "enabled", "budget_tokens": 1024})
    msgs = [{"role": "user", "content": "Weather in Zürich?"}]
    r1 = c.messages.create(messages=msgs, **kw)
    assert r1.stop_reason == "tool_use"
    assert [b.type for b in r1.content] == ["thinking", "text", "tool_use"]
    assert r1.content[0].thinking == "I should check." and r1.content[1].text == "Let me look."
    tu = r1.content[2]
    assert tu.name == "get_weather" and tu.input == NESTED and tu.id.startswith("toolu_")
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r1.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id, "content": "sunny"}]}]
    r2 = c.messages.create(messages=msgs, **kw)
    assert r2.stop_reason == "end_turn" and r2.content[-1].text == "It is sunny in Zürich."
    r1_tokens = r1.usage.input_tokens + r1.usage.cache_read_input_tokens + r1.usage.output_tokens
    assert r2.usage.cache_read_input_tokens >= r1_tokens - 16
    count = c.messages.count_tokens(model=NAME, messages=msgs, tools=A_TOOLS, thinking=kw["thinking"])
    assert count.input_tokens == r2.usage.input_tokens + r2.usage.cache_read_input_tokens


script("Hmm 日本.</think>Here:" + dsml(SHORT))


def test_anthropic_streaming_blocks(server):
    with server.anthropic().messages.stream(model=NAME, max_tokens=4000, tools=A_TOOLS,
                                            thinking={"type": "enabled", "budget_tokens": 2000},
                                            messages=[{"role": "user", "content": [{"type": "text", "text": "Go"}]}]) as st:
        events = list(st)
        final = st.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use", "tool_use"]
    assert kinds.count("content_block_stop") == 4
    json_deltas = [e for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert len(json_deltas) > 4
    delta = [e for e in events if e.type == "message_delta"][0]
    assert delta.delta.stop_reason == "tool_use" and delta.usage.output_tokens > 10
    assert final.content[0].thinking == "Hmm 日本." and final.content[1].text == "Here:"
    assert [(b.name, b.input) for b in final.content[2:]] == SHORT


A_INVOKE = dsml([("get_weather", {"city": "Rome"})])
script("one two STOP three", "a b c d e f g h i j k l m n o p", A_INVOKE[A_INVOKE.index(">\n") + 2:], A_INVOKE)


def test_anthropic_stop_reasons_and_choice(server):
    c = server.anthropic()
    msgs = [{"role": "user", "content": "count"}]
    r = c.messages.create(model=NAME, max_tokens=50, messages=msgs, stop_sequences=["STOP"], system="Be brief.")
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "STOP" and r.content[0].text == "one two "
    r = c.messages.create(model=NAME, max_tokens=3, messages=msgs, system=[{"type": "text", "text": "Be brief."}])
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3
    r = c.messages.create(model=NAME, max_tokens=200, messages=msgs, tools=A_TOOLS, tool_choice={"type": "any"})
    assert r.stop_reason == "tool_use" and r.content[0].input == {"city": "Rome"}
    r = c.messages.create(model=NAME, max_tokens=200, messages=msgs, tools=A_TOOLS, tool_choice={"type": "none"})
    assert r.stop_reason == "end_turn" and D in r.content[0].text


def test_anthropic_errors(server):
    c = server.anthropic()
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=NAME, max_tokens=0, messages=[{"role": "user", "content": "x"}])
    body = e.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        c.messages.create(model="other-model", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError) as e:  # a tool_use left unanswered
        c.messages.create(model=NAME, max_tokens=5, tools=A_TOOLS, messages=[
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]},
            {"role": "user", "content": "y"}])
    status, body = server.post("/v1/messages", json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}]}))
    assert status == 400 and body["error"]["message"].startswith("max_tokens")
    status, body = server.post("/v1/messages", "{not json")
    assert status == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


def test_script_used_up_samples_normally(server):
    # Every scripted completion was consumed above; the model samples on its own now.
    r = server.anthropic().messages.create(model=NAME, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert r.stop_reason in ("max_tokens", "end_turn") and 1 <= r.usage.output_tokens <= 4
    assert all(b.type == "text" for b in r.content)
