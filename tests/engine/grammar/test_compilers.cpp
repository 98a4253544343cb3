// Regex, EBNF and number-range compilers: which strings each grammar accepts, and rejected features.
#include <gtest/gtest.h>

#include "engine/grammar/budget.h"
#include "engine/grammar/char_set.h"
#include "engine/grammar/ebnf.h"
#include "engine/grammar/json_number.h"
#include "engine/grammar/regex.h"
#include "grammar_test_util.h"
#include "util/error.h"

using namespace peregrine;
using namespace peregrine::grammar;
using namespace peregrine::grammar::test;

TEST(Utf8, SequencesEncodeExactlyTheRange) {
    // Every code point in a range is accepted; neighbours, surrogates and overlong forms are not.
    struct R { uint32_t lo, hi; } ranges[] = {{0x41, 0x5A}, {0x80, 0x7FF}, {0x7F0, 0x10010}, {0xE000, 0x10FFFF}};
    for (auto r : ranges) {
        GrammarBuilder b;
        int32_t root = b.declare_rule("root");
        b.set_body(root, b.codepoints(CodepointSet::of(r.lo, r.hi).minus(CodepointSet::of(0xD800, 0xDFFF))));
        auto cg = compile_bytes(b.build(root));
        for (uint32_t c : {r.lo, r.hi, (r.lo + r.hi) / 2, r.lo - 1, r.hi + 1, 0xD800u, 0xDFFFu}) {
            std::string s;
            append_utf8(s, c);
            bool in = c >= r.lo && c <= r.hi && !(c >= 0xD800 && c <= 0xDFFF) && c <= kMaxCodepoint;
            EXPECT_EQ(accepts(cg, s), in) << std::hex << c;
        }
        EXPECT_FALSE(accepts(cg, "\xC0\x81"));  // overlong
    }
}

TEST(Regex, FullMatchSemantics) {
    struct Case { const char* re; std::vector<const char*> yes, no;
    } cases[] = {
        {"[a-z]{3,5}@(foo|bar)\\.com",
         {"abc@foo.com", "abcde@bar.com"},
         {"ab@foo.com", "abcdef@foo.com", "abc@baz.com"}},
        {"\\d+(\\.\\d+)?", {"0", "12.5"}, {"", "1.", ".5", "\xd9\xa3"}},
        {"(?:ab)*c?", {"", "abab", "abc", "c"}, {"aba", "cc"}},
        {"[^a-c]x", {"dx", "\xc3\xa9x"}, {"ax", "x"}},
        {"^a|b$", {"a", "b"}, {"ab", ""}},
        {"\\w+\\s\\W", {"a_1 !"}, {"a  b", "\xc3\xa9 !"}},
        {"a{2}b{0,2}c{2,}", {"aacc", "aabbccc"}, {"acc", "aabbbcc", "aac"}},
        {"\\u00e9|\\x41|\\n", {"\xc3\xa9", "A", "\n"}, {"e"}},
        {"[\\]\\-]+", {"]-]"}, {"a"}},
        {".", {"x", "\xe6\x97\xa5"}, {"\n", "xy"}},
    };
    for (auto& c : cases) {
        auto cg = compile_bytes(regex_grammar(c.re));
        for (auto* s : c.yes) EXPECT_TRUE(accepts(cg, s)) << c.re << " should match " << s;
        for (auto* s : c.no) EXPECT_FALSE(accepts(cg, s)) << c.re << " should not match " << s;
    }
}

TEST(Regex, UnsupportedFeaturesAreNamed) {
    struct Case { const char* re; const char* needle; } cases[] = {
        {"(a)\\1", "backreference"}, {"a(?=b)", "lookaround"}, {"\\bword", "word boundar"},
        {"(?i)abc", "inline flags"}, {"a*+", "possessive"}, {"a(b", "missing ')'"}, {"[a-", "unterminated"},
        {"a^b", "anchors"}, {"*a", "nothing to repeat"},
    };
    for (auto& c : cases) {
        try {
            regex_grammar(c.re);
            ADD_FAILURE() << c.re << " compiled";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << c.re << ": " << e.what();
        }
    }
}

TEST(Ebnf, ParsesTheDialectAndMatches) {
    const char* g = R"G(
        # arithmetic, recursive through parentheses
        root   ::= expr
        expr   ::= term (("+" | "-") term)*
        term   ::= factor ("*" factor)*
        factor ::= [0-9]+ | "(" expr ")" | 'x'
    )G";
    auto cg = compile_bytes(ebnf_grammar(g));
    for (auto* s : {"1", "1+2*3", "(1+2)*x", "((7))", "x-x"}) EXPECT_TRUE(accepts(cg, s)) << s;
    for (auto* s : {"", "1+", "(1", "1)", "y", "1 + 2"}) EXPECT_FALSE(accepts(cg, s)) << s;

    auto cg2 = compile_bytes(ebnf_grammar(R"(root ::= "<tool>" [^<]{1,4} "</tool>" ws
ws ::= [ \t\n]{0,2}
)"));
    EXPECT_TRUE(accepts(cg2, "<tool>abcd</tool>\n\n"));
    EXPECT_FALSE(accepts(cg2, "<tool>abcde</tool>"));
    EXPECT_FALSE(accepts(cg2, "<tool>ab</tool>   "));

    // GBNF's empty alternative (llama.cpp's json.gbnf writes `ws ::= | " " | ...`).
    auto cg_ws = compile_bytes(ebnf_grammar("root ::= \"a\" ws \"b\"\nws ::= | \" \" | \"\\n\" [ \\t]{0,2}"));
    for (auto* s : {"ab", "a b", "a\n\t b"}) EXPECT_TRUE(accepts(cg_ws, s)) << s;
    for (auto* s : {"a  b", "a\n   b"}) EXPECT_FALSE(accepts(cg_ws, s)) << s;

    auto cg3 = compile_bytes(ebnf_grammar("root ::= (\"\\u00e9\" | [\\x41-\\x43] | .)\"\\\"\"?"));
    EXPECT_TRUE(accepts(cg3, "\xc3\xa9\""));
    EXPECT_TRUE(accepts(cg3, "B"));
    EXPECT_TRUE(accepts(cg3, "\xe6\x97\xa5"));
    EXPECT_FALSE(accepts(cg3, "AB"));
}

TEST(Ebnf, ErrorsAreReported) {
    struct Case { const char* g; const char* needle; } cases[] = {
        {"root ::= a\na ::= a \"x\" | \"y\"", "left recursion"},
        {"root ::= foo", "undefined rule 'foo'"},
        {"start ::= \"a\"", "no 'root' rule"},
        {"root ::= \"a\nroot2 ::= \"b\"", "EBNF line"},
        {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
        {"root ::= [z-a]", "reversed"},
        {"root ::= a\na ::= \"x\" a", "matches no string"},
    };
    for (auto& c : cases) {
        try {
            ebnf_grammar(c.g);
            ADD_FAILURE() << c.g << " compiled";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << c.g << ": " << e.what();
        }
    }
}

TEST(Numbers, IntegerRangesAreExact) {
    struct B { std::optional<double> lo, hi; bool lx, hx; } bounds[] = {
        {0, 150, false, false}, {-37, 12, false, false}, {-500, -3, false, false}, {7, std::nullopt, false, false},
        {std::nullopt, 99, false, true}, {-1, 1, true, true}, {0.5, 9.5, false, false}, {100, 100, false, false}};
    for (auto& b : bounds) {
        NumberBounds nb{b.lo, b.hi, b.lx, b.hx};
        auto cg = compile_bytes(regex_grammar(integer_regex(nb)));
        for (int v = -1200; v <= 1200; ++v) {
            bool in = (!b.lo || (b.lx ? v > *b.lo : v >= *b.lo)) && (!b.hi || (b.hx ? v < *b.hi : v <= *b.hi));
            ASSERT_EQ(accepts(cg, std::to_string(v)), in) << integer_regex(nb) << " value " << v;
        }
        EXPECT_FALSE(accepts(cg, "007"));
        EXPECT_FALSE(accepts(cg, "-0"));
    }
}

TEST(Numbers, DecimalsStayInBounds) {
    NumberBounds nb{-1.5, 2.25, false, true};
    auto cg = compile_bytes(regex_grammar(number_regex(nb)));
    std::mt19937 rng(3);
    int accepted = 0;
    for (int i = 0; i < 3000; ++i) {
        int ip = static_cast<int>(rng() % 7) - 3;
        std::string s = std::to_string(ip);
        if (rng() % 2) s += "." + std::to_string(rng() % 1000);
        if (ip == 0 && rng() % 4 == 0) s = "-" + s;
        double v = std::stod(s);
        if (accepts(cg, s)) {
            ++accepted;
            EXPECT_TRUE(v >= -1.5 && v < 2.25) << s;
        }
    }
    EXPECT_GT(accepted, 500);
    EXPECT_TRUE(accepts(cg, "-1"));
    EXPECT_TRUE(accepts(cg, "1.999"));
    EXPECT_TRUE(accepts(cg, "-0.5"));
}

TEST(Ebnf, SchemaRulesEmbedJsonSchemas) {
    // A DSML-like tool call whose arguments follow a JSON Schema, written with literal marker text.
    const std::string g =
        "root ::= (\"<｜DSML｜ invoke name=\\\"\" name \"\\\">\" args \"</｜DSML｜ invoke>\")+\n"
        "name ::= \"get_weather\" | \"get_time\"\n";
    JsonSchemaOptions compact;
    compact.any_whitespace = false;
    auto cg = compile_bytes(ebnf_grammar(
        g, "root",
        {{"args",
          R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1}},"required":["city"]})"}},
        compact));
    EXPECT_TRUE(
        accepts(cg, "<｜DSML｜ invoke name=\"get_weather\">{\"city\": \"Paris\", \"days\": 3}</｜DSML｜ invoke>"));
    EXPECT_TRUE(accepts(cg, "<｜DSML｜ invoke name=\"get_time\">{\"city\": \"x\"}</｜DSML｜ invoke>"
                            "<｜DSML｜ invoke name=\"get_time\">{\"city\": \"y\"}</｜DSML｜ invoke>"));
    EXPECT_FALSE(accepts(cg, "<｜DSML｜ invoke name=\"get_weather\">{\"days\": 3}</｜DSML｜ invoke>"));
    EXPECT_FALSE(accepts(cg, "<｜DSML｜ invoke name=\"get_weather\">{\"city\": \"P\", \"days\": 0}</｜DSML｜ invoke>"));
    EXPECT_THROW(ebnf_grammar("root ::= args\nargs ::= \"x\"", "root", {{"args", "{}"}}), Error);
}

// Groups nested past kMaxNesting are an error naming the depth, not a stack overflow.
TEST(Regex, DeepGroupsAreAnError) {
    const std::string deep = std::string(12000, '(') + "a" + std::string(12000, ')');
    try {
        regex_grammar(deep);
        ADD_FAILURE() << "compiled";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("deeper than"), std::string::npos) << e.what();
    }
    const std::string ok = std::string(100, '(') + "a" + std::string(100, ')');
    EXPECT_TRUE(accepts(compile_bytes(regex_grammar(ok)), "a"));
}

TEST(Ebnf, DeepGroupsAreAnError) {
    const std::string deep = "root ::= " + std::string(17000, '(') + "\"a\"" + std::string(17000, ')');
    try {
        ebnf_grammar(deep);
        ADD_FAILURE() << "compiled";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("deeper than"), std::string::npos) << e.what();
    }
}

// Found by tests/fuzz/fuzz_ebnf: a literal repeated 255 times is a chain of 20,000 states, which Moore's
// minimization refined one state per round (tens of seconds); Hopcroft's takes milliseconds. Equivalent states
// still merge.
TEST(Ebnf, LongChainsMinimizeQuickly) {
    CompileBudget budget(std::chrono::milliseconds(5000));  // serve's default --grammar-compile-timeout
    budget.start();
    BudgetScope scope(&budget);
    const Grammar g = ebnf_grammar("root ::= \"za" + std::string(78, '{') + "\"{255} [a-z]*");
    EXPECT_GT(g.num_states(), 255 * 80);
    auto cg = compile_bytes(ebnf_grammar("root ::= (\"ab\" | \"cb\") \"x\"{3}"));
    EXPECT_TRUE(accepts(cg, "cbxxx"));
    EXPECT_FALSE(accepts(cg, "cbxx"));
    // After "a" and after "c" is one state: start, that, then b and three x.
    EXPECT_EQ(ebnf_grammar("root ::= (\"ab\" | \"cb\") \"x\"{3}").num_states(), 6);
}

// A chain of 50,000 rules (each refers to the next) is refused without native recursion as deep as the chain (it
// overflowed the compile thread's stack); a chain of 1,000 compiles.
TEST(Ebnf, LongRuleChainsDoNotOverflowTheStack) {
    auto chain = [](int n) {
        std::string g = "root ::= r0\n";
        for (int i = 0; i < n - 1; ++i) g += "r" + std::to_string(i) + " ::= \"b\" r" + std::to_string(i + 1) + "\n";
        return g + "r" + std::to_string(n - 1) + " ::= \"b\"\n";
    };
    try {
        compile_bytes(ebnf_grammar(chain(50000)));
        ADD_FAILURE() << "compiled";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("deeper than"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(accepts(compile_bytes(ebnf_grammar(chain(1000))), std::string(1000, 'b')));
}
