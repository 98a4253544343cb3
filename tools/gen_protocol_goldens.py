#!/usr/bin/env python3
"""Writes the chat-protocol goldens under tests/server/protocol/golden/ from deepseek-recipe (the oracle).

render.json: OpenAI chat requests and the exact prompt each model format renders (or the 400 it raises), with
             V4's prompt token ids under tests/fixtures/tokenizer-small.
parse.json:  raw completions and the OpenAI assistant message the oracle's stream processor makes of them.
Run: python3 tools/gen_protocol_goldens.py   (needs `pip install deepseek-recipe==0.2.0`)
"""
import json
import os
import re
import sys

import deepseek_recipe as dr

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "server", "protocol", "golden")
MODELS = {"deepseek_v41": "DeepSeek-V4.1-Flash", "deepseek_v4": "DeepSeek-V4-Pro"}
SMALL_TOKENIZER = dr.Tokenizer.from_file(os.path.join(HERE, "..", "tests", "fixtures", "tokenizer-small", "tokenizer.json"))


def convert(body, fmt):
    body = dict(body)
    body["model"] = MODELS[fmt]
    return dr.ChatCompletionRequest(json.dumps(body)).convert(dr.ConversionOptions())


def byte_ranges(prompt, ranges):
    # The oracle reports code-point offsets; the C++ side works in UTF-8 bytes.
    return [[len(prompt[:a].encode()), len(prompt[:b].encode())] for a, b in ranges]


def render(body, fmt):
    try:
        cr = convert(body, fmt)
    except dr.ConversionError as e:
        return {"error": {"status": e.status_code, "body": json.loads(e.body)}}
    except ValueError as e:
        return {"error": {"status": 400, "body": str(e)}}
    enc = dr.DeepseekV41Encoding() if fmt == "deepseek_v41" else dr.DeepseekV4Encoding()
    rp = enc.render_conversation(cr.conversation)
    po = cr.parsing_options
    ids = None
    if fmt == "deepseek_v4":  # the small test tokenizer has V4's special tokens (V4.1's <｜System｜> is missing)
        ids = enc.with_tokenizer(SMALL_TOKENIZER).encode(cr.conversation)
    stage = po.thinking_initial_stage
    return {
        "prompt": rp.prompt,
        "special_ranges": byte_ranges(rp.prompt, rp.special_ranges),
        "parse": {
            "tool_calls": po.parse_tool_calls,
            "starts_in_tool_calls": po.starts_in_tool_calls,
            "thinking_stage": None if stage is None else str(stage).split(".")[-1],
        },
        **({"ids_small_tokenizer": ids} if ids is not None else {}),
    }


def parse(body, fmt, completion):
    cr = convert(body, fmt)
    gen = dr.ChatCompletionRequest.chunk_generator(cr, "id", MODELS[fmt])
    sp = dr.StreamProcessor(gen, cr.parsing_options)
    out = list(sp.push(dr.InferenceChunk.ready()))
    out += sp.push(dr.InferenceChunk.text(completion))
    if not sp.finished:  # a stop sequence ends processing by itself
        out += sp.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop))
    out += sp.finish()
    resp = dr.ChatCompletionResponse("id", MODELS[fmt], 0, 0, 0)
    for c in out:
        resp.accumulate(c)
    choice = json.loads(resp.to_json())["choices"][0]
    msg = choice["message"]
    for i, tc in enumerate(msg.get("tool_calls") or []):
        assert tc["id"].startswith("call_%02d_" % i), tc["id"]
        tc["id"] = None  # random in the oracle; the C++ tests check the format instead
    return {"message": msg, "finish_reason": choice["finish_reason"]}


# ---------------------------------------------------------------- requests

def fn(name, params=None, description=None, strict=None):
    f = {"name": name}
    if description is not None:
        f["description"] = description
    if params is not None:
        f["parameters"] = params
    if strict is not None:
        f["strict"] = strict
    return {"type": "function", "function": f}


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


WEATHER = fn("get_weather", {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                              "days": {"type": "integer", "minimum": 1}},
                             "required": ["city"]}, "Get the weather forecast")
SEARCH = fn("search", {"type": "object", "properties": {"query": {"type": "string"},
                                                        "filters": {"type": "object", "properties": {
                                                            "lang": {"type": "string", "enum": ["en", "日本語"]},
                                                            "max": {"type": "number", "default": 1.5}}},
                                                        "tags": {"type": "array", "items": {"type": "string"}}},
                       "required": ["query"], "additionalProperties": False}, "Search the web — fast.")
NOARGS = fn("now")
STRICT = fn("book", {"type": "object", "properties": {"room": {"type": "string"}, "nights": {"type": "integer"}}},
            "Book a room", strict=True)
TOOLS = [WEATHER, SEARCH]

U = {"role": "user", "content": "What's the weather in Paris?"}
SYS = {"role": "system", "content": "You are a helpful assistant."}

AGENT = [
    SYS, U,
    {"role": "assistant", "content": "Let me check.", "reasoning_content": "Need the weather tool.",
     "tool_calls": [call("call_a", "get_weather", '{"city": "Paris", "days": 3}'),
                    call("call_b", "search", '{"query": "Paris events", "filters": {"lang": "en", "max": 2}, "tags": ["a", "b"]}')]},
    {"role": "tool", "tool_call_id": "call_b", "content": "Concert on Friday."},
    {"role": "tool", "tool_call_id": "call_a", "content": "Sunny, 24°C"},
    {"role": "assistant", "content": "It is sunny and there is a concert.", "reasoning_content": "Summarise both results."},
    {"role": "user", "content": "Thanks! And tomorrow?"},
]
AGENT_OPEN = AGENT[:5]  # ends with tool results: the next generation continues the agent loop

MULTI = [
    {"role": "user", "content": "Q1"},
    {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
    {"role": "user", "content": "Q2"},
    {"role": "assistant", "content": "A2", "reasoning_content": "R2"},
    {"role": "user", "content": "Q3"},
]

NOTHINK = {"thinking": {"type": "disabled"}}


def render_cases():
    c = []
    add = lambda name, body: c.append((name, body))
    add("user_only", {"messages": [U]})
    add("user_only_nothink", {"messages": [U], **NOTHINK})
    add("system_user", {"messages": [SYS, U]})
    add("system_user_nothink", {"messages": [SYS, U], **NOTHINK})
    add("empty_system", {"messages": [{"role": "system", "content": ""}, U]})
    add("two_systems", {"messages": [SYS, {"role": "system", "content": "Answer in French."}, U]})
    add("system_mid_conversation", {"messages": [U, {"role": "assistant", "content": "Sunny."},
                                                 {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sure?"}]})
    add("system_mid_with_tools", {"messages": [U, {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Now."}],
                                  "tools": TOOLS})
    add("multi_turn_thinking", {"messages": MULTI})
    add("multi_turn_nothink", {"messages": MULTI, **NOTHINK})
    add("multi_turn_thinking_tools_no_calls", {"messages": MULTI, "tools": [WEATHER]})
    add("multi_turn_missing_reasoning", {"messages": [MULTI[0], {"role": "assistant", "content": "A1"}, MULTI[2]], "tools": [WEATHER]})
    add("ends_with_assistant", {"messages": MULTI[:4]})
    add("ends_with_assistant_nothink", {"messages": MULTI[:4], **NOTHINK})
    add("assistant_first", {"messages": [{"role": "assistant", "content": "Hi, how can I help?"}, U]})
    add("prefix_content", {"messages": MULTI[:3] + [{"role": "assistant", "content": "The answer is", "prefix": True}]})
    add("prefix_reasoning", {"messages": MULTI[:3] + [{"role": "assistant", "content": "", "reasoning_content": "Let me", "prefix": True}]})
    add("prefix_reasoning_and_content", {"messages": MULTI[:3] + [{"role": "assistant", "content": "So", "reasoning_content": "Done.", "prefix": True}]})
    add("prefix_nothink", {"messages": MULTI[:3] + [{"role": "assistant", "content": "The answer is", "prefix": True}], **NOTHINK})
    add("consecutive_users", {"messages": [{"role": "user", "content": "First."}, {"role": "user", "content": "Second."}]})
    add("content_parts", {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}]})
    add("name_field_ignored", {"messages": [{"role": "user", "content": "Hi", "name": "bob"}]})
    add("unicode", {"messages": [{"role": "system", "content": "Réponds en 日本語 🎌"}, {"role": "user", "content": "héllo\tworld\n«ß» ∑ 😀 \u2028 end"}]})
    add("special_token_text_in_user", {"messages": [{"role": "user", "content": "literal <｜User｜> and </think> and <｜DSML｜ calls>"}]})
    add("latest_reminder", {"messages": [SYS, U, {"role": "latest_reminder", "content": "Today is Monday."}]})
    add("latest_reminder_history", {"messages": [U, {"role": "latest_reminder", "content": "R1"}, {"role": "assistant", "content": "A"},
                                                 {"role": "user", "content": "U2"}]})
    for eff in ["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]:
        add("effort_" + eff, {"messages": [SYS, U], "reasoning_effort": eff})
        add("effort_" + eff + "_tools", {"messages": [U], "tools": [WEATHER], "reasoning_effort": eff})
    add("effort_null", {"messages": [SYS, U], "reasoning_effort": None})
    add("effort_with_thinking_disabled", {"messages": [SYS, U], "reasoning_effort": "max", **NOTHINK})
    add("thinking_enabled", {"messages": [U], "thinking": {"type": "enabled"}})
    add("thinking_enabled_budget", {"messages": [U], "thinking": {"type": "enabled", "budget_tokens": 1024}})
    add("thinking_adaptive", {"messages": [U], "thinking": {"type": "adaptive"}})
    add("tools", {"messages": [SYS, U], "tools": TOOLS})
    add("tools_no_system", {"messages": [U], "tools": TOOLS})
    add("tools_nothink", {"messages": [SYS, U], "tools": TOOLS, **NOTHINK})
    add("tools_noargs_tool", {"messages": [U], "tools": [NOARGS, WEATHER]})
    add("tools_description_null", {"messages": [U], "tools": [{"type": "function", "function": {"name": "x", "description": None,
                                                                                              "parameters": {"type": "object", "properties": {}}}}]})
    add("tools_strict", {"messages": [U], "tools": [STRICT]})
    add("tools_numbers", {"messages": [U], "tools": [fn("n", {"type": "object", "properties": {"v": {"type": "number", "default": 1.0, "maximum": 1e20,
                                                                                                       "minimum": -0.25, "multipleOf": 0.001, "big": 12345678901234567890}}})]})
    add("tools_escapes", {"messages": [U], "tools": [fn("esc", {"type": "object", "properties": {}}, 'quote " backslash \\ nl \n tab \t ctl \u0001 slash / é')]})
    add("tool_choice_auto", {"messages": [U], "tools": TOOLS, "tool_choice": "auto"})
    add("tool_choice_none", {"messages": [U], "tools": TOOLS, "tool_choice": "none"})
    add("tool_choice_required", {"messages": [U], "tools": TOOLS, "tool_choice": "required", **NOTHINK})
    add("tool_choice_named", {"messages": [U], "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "search"}}, **NOTHINK})
    add("tool_choice_required_thinking", {"messages": [U], "tools": TOOLS, "tool_choice": "required"})
    add("tool_choice_named_unknown", {"messages": [U], "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}, **NOTHINK})
    add("parallel_tool_calls_false", {"messages": [U], "tools": TOOLS, "parallel_tool_calls": False})
    add("agent_loop_open", {"messages": AGENT_OPEN, "tools": TOOLS})
    add("agent_loop_open_nothink", {"messages": AGENT_OPEN, "tools": TOOLS, **NOTHINK})
    add("agent_loop_closed", {"messages": AGENT, "tools": TOOLS})
    add("agent_loop_closed_nothink", {"messages": AGENT, "tools": TOOLS, **NOTHINK})
    add("agent_loop_without_tools", {"messages": AGENT})
    add("agent_loop_v4_effort_max", {"messages": AGENT, "tools": TOOLS, "reasoning_effort": "max"})
    add("tool_result_then_user", {"messages": AGENT_OPEN + [{"role": "user", "content": "Also check Rome."}], "tools": TOOLS})
    add("tool_result_parts", {"messages": [U, {"role": "assistant", "content": None, "tool_calls": [call("c1", "get_weather", '{"city":"Paris"}')]},
                                           {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "p1"}, {"type": "text", "text": "p2"}]}],
                              "tools": TOOLS})
    add("tool_call_argument_types", {"messages": [U, {"role": "assistant", "content": "", "tool_calls": [call(
        "c1", "search", json.dumps({"query": "a \"quoted\"\nline", "n": 1.50, "i": -3, "b": True, "f": False, "z": None,
                                    "arr": [1, "x", {"k": "v"}], "o": {"a": {"b": []}, "e": {}}, "u": "日本 😀", "e": "", "exp": 1e-7,
                                    "big": 12345678901234567890123, "neg0": -0.0}, ensure_ascii=False).replace("1.5,", "1.50,"))]},
                                              {"role": "tool", "tool_call_id": "c1", "content": "ok"}], "tools": TOOLS})
    add("tool_call_arguments_not_object", {"messages": [U, {"role": "assistant", "content": "", "tool_calls": [call("c1", "search", "[1, 2]")]},
                                                        {"role": "tool", "tool_call_id": "c1", "content": "ok"}], "tools": TOOLS})
    add("tool_call_arguments_invalid", {"messages": [U, {"role": "assistant", "content": "", "tool_calls": [call("c1", "search", "{bad json")]},
                                                     {"role": "tool", "tool_call_id": "c1", "content": "ok"}], "tools": TOOLS})
    add("tool_call_arguments_empty", {"messages": [U, {"role": "assistant", "content": "", "tool_calls": [call("c1", "now", "")]},
                                                   {"role": "tool", "tool_call_id": "c1", "content": "ok"}], "tools": [NOARGS]})
    add("tool_call_no_params", {"messages": [U, {"role": "assistant", "content": "", "tool_calls": [call("c1", "now", "{}")]},
                                             {"role": "tool", "tool_call_id": "c1", "content": "12:00"}], "tools": [NOARGS]})
    add("three_parallel_calls", {"messages": [U, {"role": "assistant", "content": "", "reasoning_content": "three",
                                                  "tool_calls": [call("x1", "get_weather", '{"city":"A"}'), call("x2", "get_weather", '{"city":"B"}'),
                                                                 call("x3", "now", "{}")]},
                                              {"role": "tool", "tool_call_id": "x3", "content": "r3"},
                                              {"role": "tool", "tool_call_id": "x1", "content": "r1"},
                                              {"role": "tool", "tool_call_id": "x2", "content": "r2"}], "tools": TOOLS + [NOARGS]})
    add("response_format_text", {"messages": [U], "response_format": {"type": "text"}})
    add("response_format_json_object", {"messages": [SYS, {"role": "user", "content": "Reply in JSON."}], "response_format": {"type": "json_object"}})
    add("response_format_json_object_no_json_word", {"messages": [U], "response_format": {"type": "json_object"}})
    add("response_format_json_schema", {"messages": [SYS, U], "response_format": {"type": "json_schema", "json_schema": {
        "name": "w", "schema": {"type": "object", "properties": {"t": {"type": "number"}}, "required": ["t"]}}}})
    add("response_format_json_schema_tools", {"messages": [U], "tools": [WEATHER], "response_format": {"type": "json_schema", "json_schema": {
        "name": "w", "schema": {"type": "object"}}}})
    add("float_layout", {"messages": [U, {"role": "assistant", "content": "", "tool_calls": [call(
        "c1", "get_weather", '{"a": 1e-7, "b": 1e22, "c": 1.5e300, "d": 0.0001, "e": 1e16, "f": 1e15, "g": 123456789012345678, '
                             '"h": 1.0, "i": 100.0, "k": 2.5e-5, "l": 0.1, "m": -3.25e-10, "n": 1e-5, "o": 9.9e-6, "p": 1.5e17, '
                             '"q": 3.0000000000000004e-05, "r": 5e-324}')]},
                                 {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
                         "tools": [fn("f", {"type": "object", "properties": {"a": {"type": "number", "default": 1e-7, "b": 1e22,
                                                                                     "d": 0.0001, "e": 1e16, "f": 1e15}}})]})
    add("response_format_json_object_tools", {"messages": [SYS, {"role": "user", "content": "JSON please"}], "tools": [WEATHER],
                                              "response_format": {"type": "json_object"}})
    add("response_format_json_object_no_system_nothink", {"messages": [{"role": "user", "content": "json please"}],
                                                          "response_format": {"type": "json_object"}, **NOTHINK})
    add("empty_system_nothink", {"messages": [{"role": "system", "content": ""}, U], **NOTHINK})
    add("empty_then_real_system", {"messages": [{"role": "system", "content": ""}, SYS, U]})
    add("empty_system_between_users", {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": ""},
                                                    {"role": "user", "content": "b"}]})
    add("thinking_enabled_effort_none", {"messages": [U], "thinking": {"type": "enabled"}, "reasoning_effort": "none"})
    add("reminder_then_user", {"messages": [U, {"role": "latest_reminder", "content": "R"}, {"role": "user", "content": "U2"}]})
    add("reminder_first", {"messages": [{"role": "latest_reminder", "content": "R"}, U]})
    add("tool_result_then_reminder", {"messages": AGENT_OPEN + [{"role": "latest_reminder", "content": "Be quick."}], "tools": TOOLS})
    add("system_after_tool_results", {"messages": AGENT_OPEN + [{"role": "system", "content": "Now summarise."}], "tools": TOOLS})
    add("assistant_after_assistant", {"messages": [U, {"role": "assistant", "content": "A"}, {"role": "assistant", "content": "B"}]})
    add("empty_user", {"messages": [{"role": "user", "content": ""}]})
    # Requests the oracle rejects: the C++ side must reject them too.
    add("err_prefix_with_tools", {"messages": [U, {"role": "assistant", "content": "A", "prefix": True}], "tools": TOOLS})
    add("err_assistant_without_content", {"messages": [U, {"role": "assistant", "content": None}, U]})
    add("err_strict_required_mismatch", {"messages": [U], "tools": [fn("s", {"type": "object", "properties": {"a": {}, "b": {}},
                                                                               "required": ["a"]}, strict=True)]})
    add("err_strict_additional_true", {"messages": [U], "tools": [fn("s", {"type": "object", "properties": {},
                                                                             "additionalProperties": True}, strict=True)]})
    add("err_developer_role", {"messages": [{"role": "developer", "content": "d"}, U]})
    add("err_missing_tool_result", {"messages": [U, {"role": "assistant", "content": "", "tool_calls": [call("c1", "now", "{}"), call("c2", "now", "{}")]},
                                                 {"role": "tool", "tool_call_id": "c1", "content": "r"}], "tools": [NOARGS]})
    add("err_unknown_tool_call_id", {"messages": [U, {"role": "assistant", "content": "", "tool_calls": [call("c1", "now", "{}")]},
                                                  {"role": "tool", "tool_call_id": "zz", "content": "r"}], "tools": [NOARGS]})
    add("err_tool_without_id", {"messages": [U, {"role": "assistant", "content": "", "tool_calls": [call("c1", "now", "{}")]},
                                             {"role": "tool", "content": "r"}], "tools": [NOARGS]})
    add("err_effort_unknown", {"messages": [U], "reasoning_effort": "huge"})
    add("err_thinking_type", {"messages": [U], "thinking": {"type": "auto"}})
    add("err_empty_messages", {"messages": []})
    add("err_params_not_object", {"messages": [U], "tools": [fn("y", {})], "tool_choice": {"type": "function", "function": {"name": "y"}}, **NOTHINK})
    return c


# ---------------------------------------------------------------- completions

def dsml(fmt, calls, block=True):
    """calls: [(name, [(param, is_string, raw_value)])] rendered in the model's tag form."""
    sp = " " if fmt == "deepseek_v41" else ""
    outer = " calls" if fmt == "deepseek_v41" else "tool_calls"
    s = "<｜DSML｜%s>\n" % outer if block else ""
    for name, params in calls:
        s += '<｜DSML｜%sinvoke name="%s">\n' % (sp, name)
        for p, is_str, v in params:
            s += '<｜DSML｜%sparameter name="%s" string="%s">%s</｜DSML｜%sparameter>\n' % (
                sp, p, "true" if is_str else "false", v, sp)
        s += "</｜DSML｜%sinvoke>\n" % sp
    return s + "</｜DSML｜%s>" % outer


W = [("get_weather", [("city", True, "Paris"), ("days", False, "3")])]
NESTED = [("search", [("query", True, 'He said "hi"\n\\path\\ 日本 😀'),
                      ("filters", False, '{"lang": "日本語", "max": 2.5, "deep": {"a": [1, {"b": null}], "t": true}}'),
                      ("tags", False, '["x", "y"]')])]
SEVERAL = [("get_weather", [("city", True, "Paris")]), ("get_weather", [("city", True, "Rome"), ("days", False, "2")]),
           ("now", []), ("search", [("query", True, "a<b>c </tag> & \\u0041"), ("filters", False, "{}")])]
BOOLS = [("flags", [("on", False, "true"), ("off", False, "false"), ("none", False, "null"), ("s_true", True, "true"),
                    ("num_str", True, "42"), ("neg", False, "-1.5e3")])]
EMPTY_STR = [("search", [("query", True, "")])]


def parse_cases():
    c = []
    for fmt in ["deepseek_v41", "deepseek_v4"]:
        def add(name, body, completion, malformed=False):
            c.append({"name": name, "format": fmt, "request": body, "completion": completion, "malformed": malformed})
        T = {"tools": TOOLS}
        add("plain_content_nothink", {"messages": [U], **NOTHINK}, "The weather is sunny.")
        add("leading_newlines_nothink", {"messages": [U], **NOTHINK}, "\n\nHello\n\n")
        add("content_with_crlf_and_unicode", {"messages": [U], **NOTHINK}, "a\r\nb «ß» 日本 😀\n")
        add("reasoning_then_content", {"messages": [U]}, "Let me think.\nStep 2.\n\n</think>\n\nIt is sunny.")
        add("reasoning_leading_newlines", {"messages": [U]}, "\n\nThinking...</think>Answer")
        add("reasoning_unterminated", {"messages": [U]}, "Still thinking\n\n")
        add("empty_completion_thinking", {"messages": [U]}, "")
        add("empty_completion_nothink", {"messages": [U], **NOTHINK}, "")
        add("extra_think_end_in_content", {"messages": [U]}, "R</think>A</think>B")
        add("think_end_in_nothink_content", {"messages": [U], **NOTHINK}, "A</think>B")
        add("think_tags_in_nothink", {"messages": [U], **NOTHINK}, "<think>A</think>B")
        add("newline_before_think_end_kept_inside", {"messages": [U]}, "R\n\nx\n</think>\n\nC\n\n")
        add("dsml_without_tools_is_text", {"messages": [U], **NOTHINK}, "Text\n\n" + dsml(fmt, W))
        add("tool_choice_none_is_text", {"messages": [U], **T, "tool_choice": "none", **NOTHINK}, dsml(fmt, W))
        add("single_call_nothink", {"messages": [U], **T, **NOTHINK}, dsml(fmt, W))
        add("content_then_call_nothink", {"messages": [U], **T, **NOTHINK}, "Let me check.\n\n" + dsml(fmt, W))
        add("thinking_then_call", {"messages": [U], **T}, "I need the weather.\n</think>\n\n" + dsml(fmt, W))
        add("thinking_then_content_then_call", {"messages": [U], **T}, "I need the weather.</think>Checking now.\n\n" + dsml(fmt, W))
        add("call_inside_reasoning", {"messages": [U], **T}, "I need the weather.\n\n" + dsml(fmt, W))
        add("nested_json_unicode", {"messages": [U], **T}, "Searching.</think>" + dsml(fmt, NESTED))
        add("several_calls", {"messages": [U], **T}, "Plan: four calls.</think>Doing it.\n\n" + dsml(fmt, SEVERAL))
        add("bool_null_number_params", {"messages": [U], **T, **NOTHINK}, dsml(fmt, BOOLS))
        add("empty_string_param", {"messages": [U], **T, **NOTHINK}, dsml(fmt, EMPTY_STR))
        add("noargs_call", {"messages": [U], **T, **NOTHINK}, dsml(fmt, [("now", [])]))
        add("content_after_calls_dropped", {"messages": [U], **T, **NOTHINK}, dsml(fmt, W) + "\n\ntrailing text")
        add("whitespace_after_calls", {"messages": [U], **T, **NOTHINK}, dsml(fmt, W) + "\n")
        add("other_tag_form", {"messages": [U], **T, **NOTHINK}, dsml("deepseek_v4" if fmt == "deepseek_v41" else "deepseek_v41", W))
        add("required_starts_in_block", {"messages": [U], **T, "tool_choice": "required", **NOTHINK}, dsml(fmt, W).split(">\n", 1)[1])
        add("named_starts_in_block", {"messages": [U], **T, "tool_choice": {"type": "function", "function": {"name": "search"}}, **NOTHINK},
            dsml(fmt, NESTED).split(">\n", 1)[1])
        add("prefix_reasoning_continuation", {"messages": [U, {"role": "assistant", "content": "", "reasoning_content": "Let", "prefix": True}]},
            "\n me see.</think>Done.")
        add("prefix_content_continuation", {"messages": [U, {"role": "assistant", "content": "The", "reasoning_content": "R", "prefix": True}]},
            "\n answer.")
        add("text_lookalike_tags", {"messages": [U], **T, **NOTHINK}, "Use <｜DSM and </thin k> and <DSML｜ freely.\n")
        add("partial_marker_before_block", {"messages": [U], **T, **NOTHINK}, "a <\n\n\n" + dsml(fmt, W))
        add("partial_marker_before_think_end", {"messages": [U], **T}, "x </\n</think>y <｜DSML\n\n" + dsml(fmt, W))
        add("prefix_content_continuation_nothink", {"messages": [U, {"role": "assistant", "content": "The", "prefix": True}], **NOTHINK},
            "\n answer.")
        add("stop_sequence", {"messages": [U], "stop": ["END", "\n\n\n"], **NOTHINK}, "Some text END more")
        add("stop_sequence_not_in_reasoning", {"messages": [U], "stop": ["END"]}, "think END</think>answer END tail")
        J = {"messages": [{"role": "user", "content": "Answer in JSON."}], "response_format": {"type": "json_object"}}
        add("json_mode_fenced", {**J, **NOTHINK}, 'Here you go:\n```json\n{"a": 1, "b": [true]}\n```\nDone.')
        add("json_mode_plain_fence", {**J, **NOTHINK}, 'x```\n[1, 2]\n```y')
        add("json_mode_bare_object", {**J, **NOTHINK}, '\n\npre {"a": {"b": "日本"}}\n```\nafter')
        add("json_mode_bare_unterminated", {**J, **NOTHINK}, '{"a": [1, 2]} trailing words')
        add("json_mode_no_json", {**J, **NOTHINK}, "no json here at all.")
        add("json_mode_thinking", J, 'Think {not json}.</think>Sure: {"ok": true}')
        add("json_mode_think_end_in_text", {**J, **NOTHINK}, 'a</think>b{"x": 1}')
        add("json_mode_then_tool_call", {**J, **T, **NOTHINK}, 'Sure ```json\n{"a": 1}\n```\n\n' + dsml(fmt, W))
        add("json_schema_is_plain", {"messages": [U], "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object"}}}, **NOTHINK}, 'Here: ```json\n{"a": 1}\n```')
        # Malformed DSML: the oracle's output is recorded, but Peregrine deliberately differs (text + warning,
        # never markup in arguments); the C++ test checks Peregrine's own guarantees on these.
        add("malformed_unknown_outer_tag", {"messages": [U], **T, **NOTHINK}, "Hi\n\n<｜DSML｜banana>oops", True)
        add("malformed_unterminated_value", {"messages": [U], **T, **NOTHINK}, dsml(fmt, W)[:-60], True)
        add("malformed_unterminated_name", {"messages": [U], **T, **NOTHINK}, dsml(fmt, W).split('name="get_')[0] + 'name="get_', True)
        add("malformed_missing_string_attr", {"messages": [U], **T, **NOTHINK},
            dsml(fmt, W).replace(' string="true"', ""), True)
        add("malformed_bad_json_value", {"messages": [U], **T, **NOTHINK}, dsml(fmt, [("search", [("filters", False, "{bad")])]), True)
        add("malformed_bad_string_attr", {"messages": [U], **T, **NOTHINK}, dsml(fmt, W).replace('string="true"', 'string="maybe"'), True)
        add("malformed_garbage_between_tags", {"messages": [U], **T, **NOTHINK}, dsml(fmt, W).replace("\n", "\nxx"), True)
    return c


def main():
    os.makedirs(OUT, exist_ok=True)
    rendered = []
    for name, body in render_cases():
        entry = {"name": name, "request": body}
        for fmt in MODELS:
            entry[fmt] = render(body, fmt)
        rendered.append(entry)
    parsed = []
    for case in parse_cases():
        case["expected"] = parse(case["request"], case["format"], case["completion"])
        parsed.append(case)
    for fname, data in [("render.json", rendered), ("parse.json", parsed)]:
        with open(os.path.join(OUT, fname), "w", encoding="utf-8") as f:
            text = json.dumps({"oracle": "deepseek-recipe " + dr.__version__, "cases": data}, ensure_ascii=False, indent=1)
            # Number lists (token ids, byte ranges) on one line each, so the files stay readable and small.
            text = re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]", lambda m: "[" + re.sub(r",\s*", ", ", m.group(1)) + "]", text)
            text = re.sub(r"\[\s*(\[[-\d, ]*\](?:,\s*\[[-\d, ]*\])*)\s*\]",
                          lambda m: "[" + re.sub(r"\],\s*\[", "], [", m.group(1)) + "]", text)
            f.write(text + "\n")
    print("wrote %d render and %d parse cases to %s" % (len(rendered), len(parsed), os.path.normpath(OUT)))


if __name__ == "__main__":
    sys.exit(main())
