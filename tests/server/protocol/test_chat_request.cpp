// Request validation: every rejection names the parameter the client got wrong.
#include "golden.h"
#include "server/protocol/chat_request.h"
#include "server/protocol/output_parser.h"
#include "server/protocol/prompt_render.h"

#include <gtest/gtest.h>

#include <random>

using namespace peregrine;

namespace {

std::string param_of(const std::string& body) {
    try {
        parse_chat_request_text(body, {.default_thinking = true});
    } catch (const RequestError& e) {
        return e.param();
    }
    return "<accepted>";
}

const char* kUser = R"({"role": "user", "content": "hi"})";

std::string with(const std::string& extra) { return std::string(R"({"messages": [)") + kUser + "]" + extra + "}"; }

}  // namespace

TEST(ChatRequest, ErrorsCarryTheParameter) {
    EXPECT_EQ(param_of("[]"), "");
    EXPECT_EQ(param_of("{not json"), "");
    EXPECT_EQ(param_of("{}"), "messages");
    EXPECT_EQ(param_of(R"({"messages": []})"), "messages");
    EXPECT_EQ(param_of(R"({"messages": [{"role": "wizard", "content": "x"}]})"), "messages[0].role");
    EXPECT_EQ(param_of(R"({"messages": [{"role": "user"}]})"), "messages[0].content");
    EXPECT_EQ(
        param_of(R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})"),
        "messages[0].content[0].type");
    EXPECT_EQ(param_of(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": null}]})"),
              "messages[1].content");
    EXPECT_EQ(
        param_of(
            R"({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r", "tool_call_id": "a"}]})"),
        "messages[1]");
    EXPECT_EQ(
        param_of(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls":
        [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "content": "r"}]})"),
        "messages[2].tool_call_id");
    EXPECT_EQ(param_of(with(R"(, "reasoning_effort": "huge")")), "reasoning_effort");
    EXPECT_EQ(param_of(with(R"(, "reasoning_effort": 0)")), "reasoning_effort");
    EXPECT_EQ(param_of(with(R"(, "reasoning_effort": 101)")), "reasoning_effort");
    EXPECT_EQ(param_of(with(R"(, "reasoning_effort": 37.5)")), "reasoning_effort");
    EXPECT_EQ(param_of(with(R"(, "thinking": {"type": "auto"})")), "thinking.type");
    EXPECT_EQ(param_of(with(R"(, "tools": [{"type": "function", "function": {"description": "x"}}])")),
              "tools[0].function.name");
    EXPECT_EQ(
        param_of(with(R"(, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "sometimes")")),
        "tool_choice");
    EXPECT_EQ(
        param_of(with(
            R"(, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}, "thinking": {"type": "disabled"})")),
        "tool_choice");
    EXPECT_EQ(
        param_of(with(R"(, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required")")),
        "tool_choice");
    EXPECT_EQ(param_of(with(R"(, "response_format": {"type": "json_object"})")), "response_format");
    EXPECT_EQ(param_of(with(R"(, "temperature": 3)")), "temperature");
    EXPECT_EQ(param_of(with(R"(, "top_logprobs": 21)")), "top_logprobs");
    EXPECT_EQ(param_of(with(R"(, "stop": [1])")), "stop");
    EXPECT_EQ(param_of(with("")), "<accepted>");
}

TEST(ChatRequest, OpenAIErrorBody) {
    try {
        parse_chat_request_text(with(R"(, "reasoning_effort": "huge")"));
        FAIL() << "accepted";
    } catch (const RequestError& e) {
        auto j = e.to_openai_json();
        EXPECT_EQ(j["error"]["param"], "reasoning_effort");
        EXPECT_EQ(j["error"]["type"], "invalid_request_error");
        EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    }
}

TEST(ChatRequest, ReasoningEffortMapping) {
    struct Case {
        const char* effort;
        bool thinking;
        int value;
        EffortTier tier;
    };
    for (auto c : std::vector<Case>{{"\"none\"", false, 75, EffortTier::high},
                                    {"\"minimal\"", true, 50, EffortTier::low},
                                    {"\"low\"", true, 50, EffortTier::low},
                                    {"\"medium\"", true, 75, EffortTier::high},
                                    {"\"high\"", true, 75, EffortTier::high},
                                    {"\"xhigh\"", true, 75, EffortTier::high},
                                    {"\"ultra\"", true, 100, EffortTier::max},
                                    {"\"max\"", true, 100, EffortTier::max},
                                    {"null", true, 75, EffortTier::high},
                                    {"1", true, 1, EffortTier::low},
                                    {"62", true, 62, EffortTier::low},
                                    {"63", true, 63, EffortTier::high},
                                    {"87", true, 87, EffortTier::high},
                                    {"88", true, 88, EffortTier::max},
                                    {"100", true, 100, EffortTier::max}}) {
        auto r = parse_chat_request_text(with(std::string(R"(, "reasoning_effort": )") + c.effort),
                                         {.default_thinking = true});
        EXPECT_EQ(r.thinking, c.thinking) << c.effort;
        EXPECT_EQ(r.effort.value, c.value) << c.effort;
        EXPECT_EQ(r.effort.tier, c.tier) << c.effort;
    }
    // An explicit thinking object wins over the default; reasoning_effort "none" turns thinking off.
    EXPECT_FALSE(parse_chat_request_text(with(R"(, "thinking": {"type": "disabled"}, "reasoning_effort": "max")"),
                                         {.default_thinking = true})
                     .thinking);
    EXPECT_TRUE(
        parse_chat_request_text(with(R"(, "thinking": {"type": "enabled"})"), {.default_thinking = false}).thinking);
    EXPECT_FALSE(parse_chat_request_text(with(""), {.default_thinking = false}).thinking);
    // One default for serve, render and parse: off unless the request (or --enable-thinking) asks.
    EXPECT_FALSE(parse_chat_request_text(with("")).thinking);
    EXPECT_FALSE(parse_chat_request_text(with(R"(, "reasoning_effort": "none")")).thinking);
}

TEST(ChatRequest, MessagesAndTools) {
    auto r = parse_chat_request_text(R"({"messages": [
        {"role": "developer", "content": "dev"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "reasoning_content": "r", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
      "tools": [{"type": "function", "function": {"name": "f", "strict": true,
                 "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}],
      "stop": "END", "stream": true, "stream_options": {"include_usage": true}, "max_completion_tokens": 9})");
    ASSERT_EQ(r.messages.size(), 4u);
    EXPECT_EQ(r.messages[0].role, Role::system);
    EXPECT_EQ(r.messages[1].content, "a\n\nb");
    EXPECT_EQ(r.messages[2].tool_calls[0].arguments, R"({"x":1})");
    EXPECT_EQ(
        dump_prompt_json(*r.tools[0].parameters),
        R"({"type": "object", "properties": {"x": {"type": "integer"}}, "additionalProperties": false, "required": ["x"]})");
    EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
    EXPECT_TRUE(r.stream && r.include_usage);
    EXPECT_EQ(r.max_tokens, 9);
    EXPECT_TRUE(
        parse_chat_request_text(
            R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "prefix": true}]})")
            .messages[1]
            .prefix);
    // prefix only on the last message, and never with tools; strict schemas must require every property.
    EXPECT_EQ(
        param_of(
            R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "prefix": true}],
        "tools": [{"type": "function", "function": {"name": "f"}}]})"),
        "messages[1].prefix");
    EXPECT_EQ(
        param_of(
            R"({"messages": [{"role": "assistant", "content": "a", "prefix": true}, {"role": "user", "content": "q"}]})"),
        "messages[0].prefix");
    EXPECT_EQ(param_of(with(R"(, "tools": [{"type": "function", "function": {"name": "f", "strict": true, "parameters":
        {"type": "object", "properties": {"x": {}, "y": {}}, "required": ["x"]}}}])")), "tools[0].function.parameters");
}

// Any malformed body is a RequestError (a 400), never another exception (a 500): golden requests with one
// value swapped for a value of another type, at every depth.
TEST(ChatRequest, MutatedBodiesFailCleanly) {
    std::mt19937 rng(3);
    const std::vector<ojson> replacements = {ojson(nullptr),
                                             ojson(1),
                                             ojson(-1),
                                             ojson("x"),
                                             ojson::array(),
                                             ojson::object(),
                                             ojson(true),
                                             ojson(1e300),
                                             ojson(18446744073709551615ull),
                                             ojson::parse(R"([{"type": "text", "text": "t"}])"),
                                             ojson::parse(R"({"type": "object"})")};
    int accepted = 0, rejected = 0;
    for (auto& c : test::load_golden("render.json")) {
        for (int m = 0; m < 40; ++m) {
            ojson body = c["request"];
            ojson* node = &body;
            for (int depth = 0; depth < 6 && (node->is_object() || node->is_array()) && !node->empty(); ++depth) {
                auto it = node->begin();
                std::advance(it, rng() % node->size());
                node = &*it;
                if (rng() % 3 == 0) break;
            }
            *node = replacements[rng() % replacements.size()];
            try {
                ChatRequest r = parse_chat_request(body);
                for (ChatFormat f : {ChatFormat::deepseek_v41, ChatFormat::deepseek_v4}) {
                    render_prompt(r, f);
                    output_parser_options(r, f);
                }
                ++accepted;
            } catch (const RequestError&) {
                ++rejected;
            } catch (const std::exception& e) {
                ADD_FAILURE() << "non-request error " << e.what() << " for " << body.dump();
            }
        }
    }
    EXPECT_GT(accepted, 100);
    EXPECT_GT(rejected, 100);
}
