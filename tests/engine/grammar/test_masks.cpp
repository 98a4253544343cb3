// The token mask engine against first principles: at every step of random generations, the bitmask must
// equal per-token matching (each token's bytes run through the automaton on the real stack), which does
// not use the precomputed mask cache at all. Also rollback, EOS/special handling and the grammar cache.
#include <gtest/gtest.h>

#include "engine/grammar/batch_mask.h"
#include "engine/grammar/constraint.h"
#include "engine/grammar/regex.h"
#include "grammar_test_util.h"
#include <thread>

#include "util/error.h"

using namespace peregrine;
using namespace peregrine::grammar;
using namespace peregrine::grammar::test;

namespace {

std::vector<int32_t> allowed_ids(const std::vector<uint32_t>& mask) {
    std::vector<int32_t> out;
    for (size_t w = 0; w < mask.size(); ++w)
        for (uint32_t x = mask[w]; x; x &= x - 1) out.push_back(static_cast<int32_t>(w * 32 + __builtin_ctz(x)));
    return out;
}

// Drives random generations; returns the number of completed ones. Checks every mask exhaustively.
int check_generations(const std::shared_ptr<const CompiledGrammar>& cg, int samples, int max_steps, uint64_t seed) {
    const Vocabulary& v = cg->vocab();
    std::mt19937_64 rng(seed);
    std::vector<uint32_t> mask(v.mask_words());
    int completed = 0;
    for (int s = 0; s < samples; ++s) {
        GrammarMatcher m(cg);
        for (int step = 0; step < max_steps; ++step) {
            m.fill_next_token_bitmask(mask.data());
            for (int32_t id = 0; id < v.size(); ++id) {
                bool fast = mask[id >> 5] >> (id & 31) & 1u;
                bool slow = m.accept_token(id);
                if (slow) m.rollback(1);
                if (fast != slow) {
                    ADD_FAILURE() << "step " << step << " token " << id << " '" << v.token_bytes(id) << "' mask "
                                  << fast << " matcher " << slow;
                    return completed;
                }
                if (v.is_special(id) && !v.is_stop(id)) EXPECT_FALSE(fast);
            }
            auto ids = allowed_ids(mask);
            if (ids.empty()) {
                ADD_FAILURE() << "dead end at step " << step;  // grammars here can always continue or end
                return completed;
            }
            int32_t tok = ids[rng() % ids.size()];
            EXPECT_TRUE(m.accept_token(tok));
            if (v.is_stop(tok)) {
                EXPECT_TRUE(m.is_terminated());
                ++completed;
                break;
            }
            if (m.is_terminated()) {
                ++completed;
                break;
            }
        }
    }
    return completed;
}

}  // namespace

TEST(Masks, MatchPerTokenMatchingOnManyGrammars) {
    auto vocab = synthetic_vocab();
    GrammarCompiler compiler(vocab);
    std::vector<ConstraintSpec> specs = {
        {ConstraintKind::kRegex, "[a-z]{2,6}(@x\\.com)?"},
        {ConstraintKind::kRegex, "(\\d+,)*\\d+\\]?"},
        {ConstraintKind::kRegex, "\xc3\xa9+x|\xe6\x97\xa5\xe6\x9c\xac"},
        {ConstraintKind::kEbnf,
         "root ::= \"[\" (v (\",\" \" \"? v)*)? \"]\"\nv ::= [0-9]+ | \"[\" (v (\",\" v)*)? \"]\" | \"null\""},
        {ConstraintKind::kEbnf, "root ::= item+\nitem ::= \"{\" (\"a\" | item) \"}\"\n"},
        {ConstraintKind::kJsonObject, ""},
        {ConstraintKind::kJsonSchema, R"({"type":"object","properties":{"name":{"type":"string","maxLength":4},
            "a":{"type":"integer","minimum":-5,"maximum":120},"t":{"type":"array","items":{"enum":["x","ab",1,null]}},
            "x":{"anyOf":[{"type":"number"},{"type":"boolean"}]}},"required":["name"]})"},
        {ConstraintKind::kJsonSchema, R"({"$defs":{"n":{"type":"object","properties":{"a":{"type":"integer"},
            "c":{"type":"array","items":{"$ref":"#/$defs/n"}}},"required":["a"]}},"$ref":"#/$defs/n"})"},
        {ConstraintKind::kJsonSchema, R"({"type":"object","properties":{"name":{"type":"string"}},
            "additionalProperties":{"type":"integer"}})"},
    };
    for (const auto& spec : specs) {
        SCOPED_TRACE(spec.text);
        auto cg = compiler.compile(spec);
        int done = check_generations(cg, 6, 60, 11);
        (void)done;
    }
}

TEST(Masks, RollbackRestoresEarlierMasks) {
    auto vocab = synthetic_vocab();
    auto cg = GrammarCompiler(vocab).compile({ConstraintKind::kJsonObject, ""});
    GrammarMatcher m(cg);
    std::mt19937_64 rng(5);
    std::vector<std::vector<uint32_t>> masks;
    std::vector<uint32_t> mask(vocab->mask_words());
    for (int step = 0; step < 12; ++step) {
        m.fill_next_token_bitmask(mask.data());
        masks.push_back(mask);
        auto ids = allowed_ids(mask);
        int32_t tok = ids[rng() % ids.size()];
        if (vocab->is_stop(tok)) break;
        ASSERT_TRUE(m.accept_token(tok));
    }
    int n = m.num_accepted();
    for (int k = 1; k <= n; ++k) {
        m.rollback(1);
        m.fill_next_token_bitmask(mask.data());
        EXPECT_EQ(mask, masks[n - k]) << "after rolling back " << k;
    }
    EXPECT_THROW(m.rollback(1), Error);
}

TEST(Masks, EosOnlyWhenTheGrammarCanEnd) {
    auto vocab = synthetic_vocab();
    int32_t eos = vocab->stop_ids()[0];
    auto cg = GrammarCompiler(vocab).compile({ConstraintKind::kRegex, "ab(c)?"});
    GrammarMatcher m(cg);
    std::vector<uint32_t> mask(vocab->mask_words());
    auto eos_set = [&] { m.fill_next_token_bitmask(mask.data()); return (mask[eos >> 5] >> (eos & 31)) & 1u; };
    EXPECT_FALSE(eos_set());
    EXPECT_FALSE(m.accept_token(eos));
    EXPECT_TRUE(m.accept_bytes("ab"));
    EXPECT_TRUE(m.can_end());
    EXPECT_TRUE(eos_set());
    EXPECT_FALSE(m.is_terminated());
    EXPECT_TRUE(m.accept_bytes("c"));
    EXPECT_TRUE(m.is_terminated());  // nothing but EOS can follow
    EXPECT_TRUE(eos_set());
    EXPECT_EQ(allowed_ids(mask), std::vector<int32_t>{eos});
    EXPECT_TRUE(m.accept_token(eos));
    EXPECT_FALSE(m.accept_token('a'));
}

TEST(Masks, PartialUtf8TokensAreTracked) {
    auto vocab = synthetic_vocab();
    auto cg = GrammarCompiler(vocab).compile({ConstraintKind::kRegex, "\xe6\x97\xa5+"});
    GrammarMatcher m(cg);
    // Token "\xe6\x97" ends mid-character; "\xa5\xe6" finishes it and starts the next one.
    int32_t a = -1, b = -1;
    for (int32_t id = 0; id < vocab->size(); ++id) {
        if (vocab->token_bytes(id) == "\xe6\x97") a = id;
        if (vocab->token_bytes(id) == "\xa5\xe6") b = id;
    }
    ASSERT_GE(a, 0);
    ASSERT_GE(b, 0);
    EXPECT_TRUE(m.accept_token(a));
    EXPECT_FALSE(m.can_end());
    EXPECT_TRUE(m.accept_token(b));
    EXPECT_FALSE(m.can_end());
    EXPECT_TRUE(m.accept_bytes("\x97\xa5"));
    EXPECT_TRUE(m.can_end());
}

TEST(GrammarCache, SameSpecSharesOneCompilationAndErrorsNameTheFeature) {
    auto vocab = synthetic_vocab(100);
    GrammarCompiler compiler(vocab);
    auto a = compiler.compile({ConstraintKind::kRegex, "a+"});
    auto b = compiler.compile({ConstraintKind::kRegex, "a+"});
    auto c = compiler.compile({ConstraintKind::kEbnf, "root ::= \"a\"+"});
    EXPECT_EQ(a.get(), b.get());
    EXPECT_NE(a.get(), c.get());
    EXPECT_EQ(compiler.cached(), 2u);
    try {
        compiler.compile({ConstraintKind::kJsonSchema, R"({"type":"object","patternProperties":{"^x":{}}})"});
        ADD_FAILURE() << "compiled";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("patternProperties"), std::string::npos) << e.what();
    }
    EXPECT_EQ(compiler.cached(), 2u);
}

TEST(ResponseFormat, OpenAiShapes) {
    auto none = constraint_from_response_format({{"type", "text"}});
    EXPECT_FALSE(none.has_value());
    auto obj = constraint_from_response_format({{"type", "json_object"}});
    ASSERT_TRUE(obj.has_value());
    EXPECT_EQ(obj->kind, ConstraintKind::kJsonObject);
    auto js = constraint_from_response_format(nlohmann::json::parse(
        R"({"type":"json_schema","json_schema":{"name":"x","schema":{"type":"integer"},"strict":true}})"));
    ASSERT_TRUE(js.has_value());
    EXPECT_EQ(js->kind, ConstraintKind::kJsonSchema);
    EXPECT_EQ(nlohmann::json::parse(js->text), nlohmann::json({{"type", "integer"}}));
    EXPECT_THROW(constraint_from_response_format({{"type", "xml"}}), Error);
    EXPECT_EQ(constraint_kind_from_name("ebnf"), ConstraintKind::kEbnf);
    auto sp =
        constraint_from_sampling_params(nlohmann::json::parse(R"({"temperature":0,"json_schema":{"type":"null"}})"));
    ASSERT_TRUE(sp.has_value());
    EXPECT_EQ(sp->kind, ConstraintKind::kJsonSchema);
    EXPECT_EQ(nlohmann::json::parse(sp->text), nlohmann::json::parse(R"({"type":"null"})"));
    EXPECT_EQ(constraint_from_sampling_params(nlohmann::json::parse(R"({"regex":"a+"})"))->text, "a+");
    EXPECT_FALSE(constraint_from_sampling_params(nlohmann::json::parse(R"({"top_p":1})")).has_value());
    EXPECT_THROW(constraint_from_sampling_params(nlohmann::json::parse(R"({"regex":"a","ebnf":"root ::= \"a\""})")),
                 Error);
    EXPECT_THROW(constraint_kind_from_name("yaml"), Error);
}

TEST(BatchMasks, ParallelAndAsyncFillsEqualSequentialOnes) {
    auto vocab = synthetic_vocab();
    GrammarCompiler compiler(vocab);
    auto g1 = compiler.compile({ConstraintKind::kJsonObject, ""});
    auto g2 = compiler.compile({ConstraintKind::kRegex, "[a-c]+x"});
    GrammarMatcher a(g1), b(g2), c(g1);
    ASSERT_TRUE(a.accept_bytes("{\"k\": ["));
    ASSERT_TRUE(b.accept_bytes("ab"));
    const int32_t words = vocab->mask_words();
    std::vector<GrammarMatcher*> rows = {&a, nullptr, &b, &c};
    std::vector<uint32_t> batch(rows.size() * words, 0xDEADBEEF), async_batch(batch);
    fill_next_token_bitmasks(rows, batch.data(), words);
    fill_next_token_bitmasks_async(rows, async_batch.data(), words).get();
    EXPECT_EQ(batch, async_batch);
    for (size_t i = 0; i < rows.size(); ++i) {
        std::vector<uint32_t> one(words, 0xDEADBEEF);
        if (rows[i]) rows[i]->fill_next_token_bitmask(one.data());
        EXPECT_TRUE(std::equal(one.begin(), one.end(), batch.begin() + i * words)) << "row " << i;
    }
}

TEST(GrammarCache, ConcurrentCompilesAreSafeAndShared) {
    auto vocab = synthetic_vocab(300);
    GrammarCompiler compiler(vocab);
    std::vector<std::string> regexes = {"a+b", "[0-9]{2,4}", "(x|yz)*", "a+b"};
    std::vector<std::shared_ptr<const CompiledGrammar>> out(8);
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i)
        threads.emplace_back([&, i] { out[i] = compiler.compile({ConstraintKind::kRegex, regexes[i % 4]}); });
    for (auto& t : threads) t.join();
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(out[i]);
    EXPECT_EQ(out[0].get(), out[3].get());  // same text, one compilation
    EXPECT_EQ(out[1].get(), out[5].get());
    EXPECT_EQ(compiler.cached(), 3u);
    EXPECT_TRUE(accepts(out[1], "123"));
    EXPECT_FALSE(accepts(out[1], "1"));
}

TEST(GrammarCache, CallerBuiltGrammarsAreCachedByKey) {
    auto vocab = synthetic_vocab(100);
    GrammarCompiler compiler(vocab);
    int builds = 0;
    auto build = [&] { ++builds; return regex_grammar("ab+"); };
    auto a = compiler.compile_cached("tools:v1", build);
    auto b = compiler.compile_cached("tools:v1", build);
    EXPECT_EQ(a.get(), b.get());
    EXPECT_EQ(builds, 1);
}
