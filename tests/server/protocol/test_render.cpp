// Prompt rendering against deepseek-recipe's encoders: byte-exact text and special-token ranges for every
// message shape in golden/render.json, for V4.1 and V4; requests the oracle rejects are rejected too.
#include "golden.h"
#include "server/protocol/output_parser.h"
#include "server/protocol/prompt_ids.h"
#include "server/protocol/prompt_render.h"

#include <gtest/gtest.h>

using namespace peregrine;
using namespace peregrine::test;

namespace {

struct RenderCase {
    std::string name;
    std::string format;
    nlohmann::ordered_json request, expected;
};
void PrintTo(const RenderCase& c, std::ostream* os) { *os << c.name << " " << c.format; }

std::vector<RenderCase> render_cases() {
    std::vector<RenderCase> out;
    for (auto& c : load_golden("render.json"))
        for (const char* f : {"deepseek_v41", "deepseek_v4"}) out.push_back({c["name"], f, c["request"], c[f]});
    return out;
}

class Render : public ::testing::TestWithParam<RenderCase> {};

std::string stage_name(ParseStart s) {
    switch (s) {
    case ParseStart::reasoning: return "ReasoningStart";
    case ParseStart::reasoning_continuation: return "ReasoningContinuation";
    case ParseStart::content_continuation: return "ContentContinuation";
    default: return "";
    }
}

}  // namespace

TEST_P(Render, MatchesOracle) {
    const RenderCase& c = GetParam();
    const ChatFormat fmt = golden_format(c.format);
    if (c.name == "err_developer_role") {
        // Deliberate extension: OpenAI's "developer" role is accepted as a system message.
        auto as_system = c.request;
        as_system["messages"][0]["role"] = "system";
        EXPECT_EQ(render_prompt(parse_chat_request(c.request, kOracleDefaults), fmt).text,
                  render_prompt(parse_chat_request(as_system, kOracleDefaults), fmt).text);
        return;
    }
    if (c.expected.contains("error")) {
        EXPECT_THROW(parse_chat_request(c.request, kOracleDefaults), RequestError) << c.expected["error"].dump();
        return;
    }
    ChatRequest req = parse_chat_request(c.request, kOracleDefaults);
    RenderedPrompt p = render_prompt(req, fmt);
    EXPECT_EQ(p.text, c.expected["prompt"].get<std::string>());
    std::vector<std::pair<size_t, size_t>> want;
    for (auto& r : c.expected["special_ranges"]) want.emplace_back(r[0], r[1]);
    EXPECT_EQ(p.special_ranges, want);

    // Token ids as the oracle's encoder makes them (specials as tokens, the rest without added vocabulary).
    if (c.expected.contains("ids_small_tokenizer")) {
        static const Tokenizer tk = Tokenizer::from_file(PEREGRINE_TEST_DATA "/tokenizer-small/tokenizer.json");
        EXPECT_EQ(prompt_token_ids(p, tk), c.expected["ids_small_tokenizer"].get<std::vector<int32_t>>());
    }

    // The parser starts where the prompt left off, as the oracle's parsing options say.
    OutputParserOptions po = output_parser_options(req, fmt);
    const auto& parse = c.expected["parse"];
    EXPECT_EQ(po.parse_tool_calls, parse["tool_calls"].get<bool>());
    EXPECT_EQ(po.start == ParseStart::tool_calls, parse["starts_in_tool_calls"].get<bool>());
    if (po.start != ParseStart::tool_calls) {
        EXPECT_EQ(stage_name(po.start),
                  parse["thinking_stage"].is_null() ? "" : parse["thinking_stage"].get<std::string>());
    }
}

INSTANTIATE_TEST_SUITE_P(Golden, Render, ::testing::ValuesIn(render_cases()),
                         [](const auto& info) { return test_name(info.param.name + "_" + info.param.format); });

// Re-encoding a parsed tool-call turn reproduces the model's own DSML, so an agent loop's next prompt
// extends the previous one token for token (the prefix cache keeps hitting).
TEST(Render, ToolCallHistoryRoundTrip) {
    for (ChatFormat fmt : {ChatFormat::deepseek_v41, ChatFormat::deepseek_v4}) {
        std::vector<ToolCallRecord> calls = {
            {"a", "get_weather", R"({"city": "Paris", "days": 3})"},
            {"b", "search", R"({"query": "x \"y\"", "filters": {"lang": "en", "n": [1, 2.5]}})"},
            {"c", "now", "{}"}};
        std::string dsml = render_tool_calls(calls, fmt);
        ASSERT_TRUE(dsml.starts_with("\n\n<"));
        OutputParserOptions po{fmt, ParseStart::content, true, {}, false};
        OutputParser parser(po, [](int i) { return "id" + std::to_string(i); });
        auto events = parser.push(dsml);
        auto tail = parser.finish();
        events.insert(events.end(), tail.begin(), tail.end());
        std::vector<ToolCallRecord> back;
        for (auto& e : events) {
            ASSERT_NE(e.kind, ParseEvent::Kind::warning) << e.text;
            ASSERT_NE(e.kind, ParseEvent::Kind::content) << e.text;
            if (e.kind == ParseEvent::Kind::tool_call_start) back.push_back({"", e.text, ""});
            if (e.kind == ParseEvent::Kind::tool_call_arguments) back.back().arguments += e.text;
        }
        ASSERT_EQ(back.size(), calls.size());
        for (size_t i = 0; i < calls.size(); ++i) {
            EXPECT_EQ(back[i].name, calls[i].name);
            EXPECT_EQ(nlohmann::json::parse(back[i].arguments), nlohmann::json::parse(calls[i].arguments));
        }
        EXPECT_EQ(render_tool_calls(back, fmt), dsml);
    }
}

// An agent loop: the next request (history + the parsed assistant turn + tool results) renders to the
// previous prompt, then exactly what the model generated, then the new turn, so the KV prefix is reused.
TEST(Render, AgentLoopPromptExtendsPreviousPrompt) {
    for (ChatFormat fmt : {ChatFormat::deepseek_v41, ChatFormat::deepseek_v4}) {
        for (bool thinking : {true, false}) {
            ojson body = ojson::parse(R"({"messages": [{"role": "system", "content": "Be useful."},
                {"role": "user", "content": "Weather in Paris and Tokyo?"}],
                "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]})");
            body["thinking"] = {{"type", thinking ? "enabled" : "disabled"}};
            ChatRequest req = parse_chat_request(body, kOracleDefaults);
            std::string prompt1 = render_prompt(req, fmt).text;

            // What the model writes: reasoning, an answer line, two calls, then its end-of-sentence token.
            std::vector<ToolCallRecord> calls = {{"", "get_weather", R"({"city": "Paris", "days": 2})"},
                                                 {"", "get_weather", R"({"city": "東京", "days": 1})"}};
            std::string output = std::string(thinking ? "Two lookups.</think>" : "") + "Checking both." +
                                 render_tool_calls(calls, fmt);
            OutputParser parser(output_parser_options(req, fmt));
            std::vector<ParseEvent> ev = parser.push(output);
            auto tail = parser.finish();
            ev.insert(ev.end(), tail.begin(), tail.end());

            // The client sends the assistant message back as the API returned it, plus the results.
            ojson assistant = {{"role", "assistant"}, {"content", ""}};
            ojson tool_calls = ojson::array();
            std::string reasoning;
            for (auto& e : ev) {
                ASSERT_NE(e.kind, ParseEvent::Kind::warning) << e.text;
                if (e.kind == ParseEvent::Kind::content)
                    assistant["content"] = assistant["content"].get<std::string>() + e.text;
                if (e.kind == ParseEvent::Kind::reasoning) reasoning += e.text;
                if (e.kind == ParseEvent::Kind::tool_call_start)
                    tool_calls.push_back(
                        {{"id", e.id}, {"type", "function"}, {"function", {{"name", e.text}, {"arguments", ""}}}});
                if (e.kind == ParseEvent::Kind::tool_call_arguments) {
                    auto& f = tool_calls[e.index]["function"];
                    f["arguments"] = f["arguments"].get<std::string>() + e.text;
                }
            }
            if (thinking) assistant["reasoning_content"] = reasoning;
            assistant["tool_calls"] = tool_calls;
            body["messages"].push_back(assistant);
            body["messages"].push_back({{"role", "tool"}, {"tool_call_id", tool_calls[1]["id"]}, {"content", "rain"}});
            body["messages"].push_back({{"role", "tool"}, {"tool_call_id", tool_calls[0]["id"]}, {"content", "sun"}});
            std::string prompt2 = render_prompt(parse_chat_request(body, kOracleDefaults), fmt).text;

            std::string expected_prefix = prompt1 + output + std::string(tok::eos);
            ASSERT_TRUE(prompt2.starts_with(expected_prefix))
                << "fmt " << chat_format_name(fmt) << " thinking " << thinking << "\nprompt2: " << prompt2;
            EXPECT_EQ(prompt2.substr(expected_prefix.size()),
                      std::string(tok::user) + "<tool_result>sun</tool_result>\n\n<tool_result>rain</tool_result>" +
                          std::string(tok::assistant) + std::string(thinking ? tok::think_open : tok::think_close));
        }
    }
}
