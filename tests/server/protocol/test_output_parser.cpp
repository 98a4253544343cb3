// The streaming output parser: oracle goldens (golden/parse.json), chunk-boundary invariance at every byte,
// and the guarantees the server relies on (no markup in content, no tag fragment in arguments, valid JSON).
#include "golden.h"
#include "server/protocol/assistant_message.h"
#include "server/protocol/output_parser.h"

#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <set>

using namespace peregrine;
using namespace peregrine::test;
using json = nlohmann::json;

namespace {

struct ParseCase {
    std::string name;
    json golden;
};
void PrintTo(const ParseCase& c, std::ostream* os) { *os << c.name; }

// All golden completions, or only the well-formed ones (on malformed DSML Peregrine deliberately differs
// from the oracle: text and warnings instead of broken arguments; the Guarantees tests cover those).
std::vector<ParseCase> parse_cases(bool well_formed_only) {
    std::vector<ParseCase> out;
    for (auto& c : load_golden("parse.json"))
        if (!well_formed_only || !c["malformed"].get<bool>())
            out.push_back({c["name"].get<std::string>() + "_" + c["format"].get<std::string>(), json::parse(c.dump())});
    return out;
}

OutputParser::IdGenerator fixed_ids() {
    return [](int i) { return "call_" + std::to_string(i); };
}

// Feeds `text` split at `cuts` (ascending byte offsets) and returns every event.
std::vector<ParseEvent> run(const OutputParserOptions& o, const std::string& text, const std::vector<size_t>& cuts) {
    OutputParser p(o, fixed_ids());
    std::vector<ParseEvent> ev;
    size_t pos = 0;
    auto add = [&](std::vector<ParseEvent> v) { ev.insert(ev.end(), v.begin(), v.end()); };
    for (size_t c : cuts) {
        add(p.push(std::string_view(text).substr(pos, c - pos)));
        pos = c;
    }
    add(p.push(std::string_view(text).substr(pos)));
    add(p.finish());
    return ev;
}

json assemble(const std::vector<ParseEvent>& ev, bool with_reasoning) {
    AssistantMessage m(with_reasoning);
    m.add(ev);
    return {{"message", json::parse(m.to_openai_json().dump())}, {"finish_reason", m.finish_reason("stop")}};
}

bool valid_utf8(const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = s[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (n == 0 || i + n > s.size()) return false;
        for (size_t k = 1; k < n; ++k)
            if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
        i += n;
    }
    return true;
}

class Parse : public ::testing::TestWithParam<ParseCase> {
protected:
    void SetUp() override {
        const json& g = GetParam().golden;
        fmt_ = golden_format(g["format"]);
        ChatRequest req = parse_chat_request(ojson::parse(g["request"].dump()), kOracleDefaults);
        opts_ = output_parser_options(req, fmt_);
        text_ = g["completion"];
        malformed_ = g["malformed"];
    }
    ChatFormat fmt_;
    OutputParserOptions opts_;
    std::string text_;
    bool malformed_ = false;
};

}  // namespace

class ParseOracle : public Parse {};

TEST_P(ParseOracle, MatchesOracle) {
    const json& g = GetParam().golden;
    json got = assemble(run(opts_, text_, {}), reports_reasoning(opts_.start));
    if (got["message"].contains("tool_calls")) {
        for (auto& tc : got["message"]["tool_calls"]) {
            EXPECT_TRUE(std::regex_match(tc["id"].get<std::string>(), std::regex("call_[0-9]+")));
            tc["id"] = nullptr;  // the oracle's ids are random
        }
    }
    EXPECT_EQ(got["message"], g["expected"]["message"]);
    EXPECT_EQ(got["finish_reason"], g["expected"]["finish_reason"]);
}

TEST_P(Parse, EveryByteBoundary) {
    const bool wr = reports_reasoning(opts_.start);
    const json whole = assemble(run(opts_, text_, {}), wr);
    for (size_t k = 1; k < text_.size(); ++k)
        ASSERT_EQ(assemble(run(opts_, text_, {k}), wr), whole) << "split at " << k;
    std::vector<size_t> bytes;
    for (size_t k = 1; k < text_.size(); ++k) bytes.push_back(k);
    ASSERT_EQ(assemble(run(opts_, text_, bytes), wr), whole) << "byte by byte";
    std::mt19937 rng(1234);
    for (int t = 0; t < 50 && text_.size() > 2; ++t) {
        std::vector<size_t> cuts;
        for (size_t k = 1; k < text_.size(); ++k)
            if (rng() % 5 == 0) cuts.push_back(k);
        ASSERT_EQ(assemble(run(opts_, text_, cuts), wr), whole) << "random split " << t;
    }
}

// Well-formed completions that still deserve a warning: text the oracle drops, or a tag form the format
// did not ask for.
const std::set<std::string> kMayWarn = {"content_after_calls_dropped", "extra_think_end_in_content",
                                        "think_end_in_nothink_content", "think_tags_in_nothink", "other_tag_form",
                                        "json_mode_think_end_in_text"};

TEST_P(Parse, Guarantees) {
    std::vector<size_t> bytes;
    for (size_t k = 1; k < text_.size(); ++k) bytes.push_back(k);
    for (const auto& cuts : {std::vector<size_t>{}, bytes}) {
        auto ev = run(opts_, text_, cuts);
        std::map<int, std::string> args;
        for (auto& e : ev) {
            EXPECT_TRUE(valid_utf8(e.text)) << "event splits a UTF-8 character";
            if (e.kind == ParseEvent::Kind::tool_call_arguments) {
                EXPECT_EQ(e.text.find(tok::dsml), std::string::npos) << "markup in arguments: " << e.text;
                args[e.index] += e.text;
            }
            if (opts_.parse_tool_calls && !malformed_ &&
                (e.kind == ParseEvent::Kind::content || e.kind == ParseEvent::Kind::reasoning)) {
                EXPECT_EQ(e.text.find(tok::dsml), std::string::npos) << "markup in text: " << e.text;
            }
            if (!malformed_ && e.kind == ParseEvent::Kind::warning && !kMayWarn.count(GetParam().golden["name"]))
                ADD_FAILURE() << "unexpected warning on well-formed output: " << e.text;
        }
        for (auto& [i, a] : args) {
            json v = json::parse(a, nullptr, false);
            EXPECT_TRUE(v.is_object()) << "arguments of call " << i << " are not a JSON object: " << a;
        }
    }
    if (malformed_) {
        auto ev = run(opts_, text_, {});
        EXPECT_TRUE(std::any_of(ev.begin(), ev.end(), [](auto& e) { return e.kind == ParseEvent::Kind::warning; }));
    }
}

INSTANTIATE_TEST_SUITE_P(Golden, ParseOracle, ::testing::ValuesIn(parse_cases(true)),
                         [](const auto& info) { return test_name(info.param.name); });
INSTANTIATE_TEST_SUITE_P(Golden, Parse, ::testing::ValuesIn(parse_cases(false)),
                         [](const auto& info) { return test_name(info.param.name); });

namespace {

std::string joined(const std::vector<ParseEvent>& ev, ParseEvent::Kind k) {
    std::string s;
    for (auto& e : ev)
        if (e.kind == k) s += e.text;
    return s;
}

OutputParserOptions v41(ParseStart s, bool tools = true, std::vector<std::string> stop = {}) {
    return {ChatFormat::deepseek_v41, s, tools, std::move(stop), false};
}

}  // namespace

// Only what could still become a marker is held back; everything else is out at once.
TEST(OutputParser, HoldsBackOnlyPossibleMarkers) {
    OutputParser p(v41(ParseStart::content), fixed_ids());
    EXPECT_EQ(joined(p.push("Hello wor"), ParseEvent::Kind::content), "Hello wor");
    EXPECT_EQ(joined(p.push("ld\n"), ParseEvent::Kind::content), "ld");      // "\n" may precede a DSML block
    EXPECT_EQ(joined(p.push("<｜DS"), ParseEvent::Kind::content), "");       // may be the block
    EXPECT_EQ(joined(p.push("X"), ParseEvent::Kind::content), "\n<｜DSX");   // it was not
    EXPECT_EQ(joined(p.push("</thi"), ParseEvent::Kind::content), "");
    EXPECT_EQ(joined(p.push("nk>é"), ParseEvent::Kind::content), "é");       // stray </think> dropped
    EXPECT_EQ(joined(p.push("\xe6\x97"), ParseEvent::Kind::content), "");    // half a character
    EXPECT_EQ(joined(p.push("\xa5"), ParseEvent::Kind::content), "日");
    auto tail = p.finish();
    EXPECT_EQ(joined(tail, ParseEvent::Kind::content), "");
}

TEST(OutputParser, ArgumentsStreamWhileValuesArrive) {
    OutputParser p(v41(ParseStart::content), fixed_ids());
    auto ev =
        p.push("<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"q\" string=\"true\">ab\"c");
    ASSERT_FALSE(ev.empty());
    EXPECT_EQ(ev[0].kind, ParseEvent::Kind::tool_call_start);
    EXPECT_EQ(ev[0].text, "f");
    EXPECT_EQ(joined(ev, ParseEvent::Kind::tool_call_arguments), "{\"q\": \"ab\\\"c");
    ev = p.push("d</｜DSML｜ para");
    EXPECT_EQ(joined(ev, ParseEvent::Kind::tool_call_arguments), "d");  // the closing tag's start is held back
    ev = p.push("meter>\n<｜DSML｜ parameter name=\"n\" string=\"false\">[1, ");
    EXPECT_EQ(joined(ev, ParseEvent::Kind::tool_call_arguments), "\", \"n\": ");  // JSON values wait for their close
    ev = p.push("2]</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
    EXPECT_EQ(joined(ev, ParseEvent::Kind::tool_call_arguments), "[1, 2]}");
    EXPECT_TRUE(p.done());
    EXPECT_EQ(p.tool_call_count(), 1);
}

TEST(OutputParser, StopSequences) {
    OutputParser p(v41(ParseStart::reasoning, false, {"STOP", "\n\n"}), fixed_ids());
    auto ev = p.push("think STOP here</think>Answer ST");
    EXPECT_EQ(joined(ev, ParseEvent::Kind::reasoning), "think STOP here");  // not matched in reasoning
    EXPECT_EQ(joined(ev, ParseEvent::Kind::content), "Answer ");
    ev = p.push("OP and more");
    EXPECT_TRUE(p.done());
    EXPECT_TRUE(p.stopped_by_sequence());
    EXPECT_EQ(joined(ev, ParseEvent::Kind::content), "");
    EXPECT_EQ(joined(p.finish(), ParseEvent::Kind::content), "");
}

TEST(OutputParser, DsmlIsTextWithoutTools) {
    OutputParser p(v41(ParseStart::content, false), fixed_ids());
    std::string s = "x\n\n<｜DSML｜ calls>\n</｜DSML｜ calls>";
    auto ev = p.push(s);
    auto tail = p.finish();
    ev.insert(ev.end(), tail.begin(), tail.end());
    EXPECT_EQ(joined(ev, ParseEvent::Kind::content), s);
}

// The end-of-sentence token written as text ends the output, as DeepSeek's encoding_dsv4.py
// (parse_message_from_completion_text) reads a completion: the message is what comes before it. Checked at every
// byte split of each completion.
TEST(OutputParser, EndOfSentenceTextEndsTheOutput) {
    const std::string eos(tok::eos);
    const std::string call = "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"q\" "
                             "string=\"true\">x</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
    struct Case {
        ParseStart start;
        std::string text, reasoning, content, args;
        bool warns;
    };
    const std::vector<Case> cases = {
        {ParseStart::content, "Hello." + eos, "", "Hello.", "", false},
        {ParseStart::reasoning, "think</think>Answer." + eos, "think", "Answer.", "", false},
        {ParseStart::reasoning, "think" + eos, "think", "", "", false},
        {ParseStart::content, "Hello." + eos + "more", "", "Hello.", "", true},
        {ParseStart::content, "Let me check.\n\n" + call + eos, "", "Let me check.", "{\"q\": \"x\"}", false},
        {ParseStart::content, call + eos + "x", "", "", "{\"q\": \"x\"}", true},
        {ParseStart::content, "<｜end▁of▁sent", "", "<｜end▁of▁sent", "", false},  // not the token
    };
    for (const Case& c : cases) {
        for (size_t k = 0; k <= c.text.size(); ++k) {
            auto ev = run(v41(c.start), c.text, k ? std::vector<size_t>{k} : std::vector<size_t>{});
            ASSERT_EQ(joined(ev, ParseEvent::Kind::reasoning), c.reasoning) << c.text << " split at " << k;
            ASSERT_EQ(joined(ev, ParseEvent::Kind::content), c.content) << c.text << " split at " << k;
            ASSERT_EQ(joined(ev, ParseEvent::Kind::tool_call_arguments), c.args) << c.text << " split at " << k;
            const bool warned =
                std::any_of(ev.begin(), ev.end(), [](auto& e) { return e.kind == ParseEvent::Kind::warning; });
            ASSERT_EQ(warned, c.warns) << c.text << " split at " << k;
        }
    }
}

TEST(OutputParser, MalformedBlocksComeBackAsText) {
    for (std::string s : {"Hi\n\n<｜DSML｜banana>oops", "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_",
                          "<｜DSML｜ calls>\nnot a call at all", "<｜DSML｜ \"weird\"> text"}) {
        auto ev = run(v41(ParseStart::content), s, {});
        EXPECT_EQ(joined(ev, ParseEvent::Kind::content), s);
        EXPECT_EQ(joined(ev, ParseEvent::Kind::tool_call_start), "");
        EXPECT_TRUE(std::any_of(ev.begin(), ev.end(), [](auto& e) { return e.kind == ParseEvent::Kind::warning; }))
            << s;
    }
}

TEST(OutputParser, DefaultIdsAreUniqueAndOpenAIShaped) {
    OutputParser p(v41(ParseStart::content));
    auto ev = p.push(
        "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"a\">\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"b\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
    std::vector<std::string> ids;
    for (auto& e : ev)
        if (e.kind == ParseEvent::Kind::tool_call_start) ids.push_back(e.id);
    ASSERT_EQ(ids.size(), 2u);
    EXPECT_NE(ids[0], ids[1]);
    for (auto& id : ids) EXPECT_TRUE(std::regex_match(id, std::regex("call_[A-Za-z0-9]{24}"))) << id;
}

TEST(OutputParser, OpenAIDeltas) {
    ParseEvent start{ParseEvent::Kind::tool_call_start, "f", 0, "call_x"};
    EXPECT_EQ(openai_delta(start).dump(),
              R"({"tool_calls":[{"index":0,"id":"call_x","type":"function","function":{"name":"f","arguments":""}}]})");
    EXPECT_EQ(openai_delta(ParseEvent{ParseEvent::Kind::tool_call_arguments, "{}", 0, ""}).dump(),
              R"({"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]})");
    EXPECT_EQ(openai_delta(ParseEvent{ParseEvent::Kind::reasoning, "r", -1, ""}).dump(),
              R"({"reasoning_content":"r"})");
    EXPECT_TRUE(openai_delta(ParseEvent{ParseEvent::Kind::warning, "w", -1, ""}).is_null());
}

// Random soup of DSML fragments, think tags, quotes, newlines and multi-byte characters: whatever the model
// writes, parsing never throws, streaming equals one-shot, and started calls end with JSON-object arguments.
TEST(OutputParser, FuzzedMarkupKeepsTheGuarantees) {
    const std::vector<std::string> pieces = {"<｜DSML｜ calls>",
                                             "<｜DSML｜tool_calls>",
                                             "</｜DSML｜ calls>",
                                             "</｜DSML｜tool_calls>",
                                             "<｜DSML｜ invoke name=\"f\">",
                                             "<｜DSML｜invoke name=\"g h\">",
                                             "</｜DSML｜ invoke>",
                                             "</｜DSML｜invoke>",
                                             "<｜DSML｜ parameter name=\"a\" string=\"true\">",
                                             "<｜DSML｜parameter name=\"b\" string=\"false\">",
                                             "<｜DSML｜ parameter name=\"c\">",
                                             "</｜DSML｜ parameter>",
                                             "</｜DSML｜parameter>",
                                             "<｜DSML｜",
                                             "</｜DSML｜",
                                             "<｜DS",
                                             "｜DSML｜",
                                             "</think>",
                                             "</thi",
                                             "<think>",
                                             "\n",
                                             "\n\n",
                                             " ",
                                             "\"",
                                             "=",
                                             ">",
                                             "<",
                                             "{\"k\": [1, 2]}",
                                             "[true",
                                             "null",
                                             "42",
                                             "text",
                                             "日本",
                                             "😀",
                                             "\\",
                                             "```json\n",
                                             "\n```",
                                             "{",
                                             "["};
    std::mt19937 rng(7);
    for (int iter = 0; iter < 3000; ++iter) {
        std::string text;
        for (int n = rng() % 24; n > 0; --n) text += pieces[rng() % pieces.size()];
        ParseStart start = static_cast<ParseStart>(rng() % 5);
        OutputParserOptions o{rng() % 2 ? ChatFormat::deepseek_v41 : ChatFormat::deepseek_v4, start, rng() % 4 != 0,
                              rng() % 4 == 0 ? std::vector<std::string>{"text"} : std::vector<std::string>{},
                              rng() % 4 == 0};
        std::vector<size_t> cuts;
        for (size_t k = 1; k < text.size(); ++k)
            if (rng() % 3 == 0) cuts.push_back(k);
        std::vector<ParseEvent> whole, streamed;
        ASSERT_NO_THROW(whole = run(o, text, {})) << text;
        ASSERT_NO_THROW(streamed = run(o, text, cuts)) << text;
        const bool wr = reports_reasoning(start);
        ASSERT_EQ(assemble(streamed, wr), assemble(whole, wr)) << text;
        std::map<int, std::string> args;
        for (auto& e : streamed) {
            ASSERT_TRUE(valid_utf8(e.text)) << text;
            if (e.kind == ParseEvent::Kind::tool_call_start) args[e.index];
            if (e.kind == ParseEvent::Kind::tool_call_arguments) args[e.index] += e.text;
        }
        for (auto& [i, a] : args) {
            // No tag reaches arguments (a lone ｜DSML｜ token the model put inside a value is its text).
            ASSERT_EQ(a.find("<" + std::string(tok::dsml)), std::string::npos) << a << "\nin: " << text;
            ASSERT_EQ(a.find("</" + std::string(tok::dsml)), std::string::npos) << a << "\nin: " << text;
        }
        for (auto& [i, a] : args)
            ASSERT_TRUE(json::parse(a, nullptr, false).is_object()) << "call " << i << ": " << a << "\nin: " << text;
    }
}
