// The grammar logit processor on the byte vocabulary of the tiny models, driven by noise logits as the
// engine drives it: every output is a sentence of the grammar, and the end-of-budget steering completes
// it within max_tokens whenever the budget can hold the shortest completion (plus EOS).
#include "engine/sampling_params.h"
#include "server/request_registry.h"
#include "server/structured_output.h"
#include "tokenizer/byte_tokenizer.h"
#include "util/error.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <random>
#include <thread>

namespace peregrine {
namespace {

constexpr int32_t kEos = 1;

struct Output {
    std::string text;
    bool complete = false;  // ended by EOS or by the grammar
    int64_t tokens = 0;
};

Output generate(StructuredOutput& so, const grammar::ConstraintSpec& spec, int64_t budget, uint64_t seed) {
    auto g = so.compile(spec);
    auto proc = so.processor(g, budget);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> noise(0.0f, 3.0f);
    SamplingParams sp;
    sp.seed = static_cast<int64_t>(seed);
    Sampler sampler(sp);
    std::vector<float> logits(256);
    Output r;
    while (r.tokens < budget) {
        for (auto& x : logits) x = noise(rng);
        proc->process(logits.data(), 256);
        const int32_t id = sampler.sample(logits.data(), 256);
        EXPECT_NE(logits[static_cast<size_t>(id)], -INFINITY);
        proc->accept(id);
        ++r.tokens;
        if (id == kEos) return r.complete = true, r;
        r.text.push_back(static_cast<char>(id));
        if (proc->done()) return r.complete = true, r;
    }
    return r;
}

bool matches(StructuredOutput& so, const grammar::ConstraintSpec& spec, const std::string& text) {
    grammar::GrammarMatcher m(so.compile(spec));
    return m.accept_bytes(text) && m.can_end();
}

TEST(StructuredOutput, SteersToACompleteSentenceWithinTheBudget) {
    Tokenizer tok = byte_tokenizer();
    StructuredOutput so(tok, 256, kEos);
    const grammar::ConstraintSpec person{
        grammar::ConstraintKind::kJsonSchema,
        R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]})"};
    const grammar::ConstraintSpec phone{grammar::ConstraintKind::kRegex, R"(\(\d{3}\) \d{3}-\d{4})"};
    const grammar::ConstraintSpec expr{grammar::ConstraintKind::kEbnf,
        "root ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" root \")\""};
    // Shortest sentences: {"name":"","age":0} (20 bytes), (000) 000-0000 (14), 0 (1); EOS takes one token.
    for (auto [spec, shortest] : {std::pair{person, 20}, std::pair{phone, 14}, std::pair{expr, 1}}) {
        for (int64_t budget = shortest + 1; budget < shortest + 90; budget += 7) {
            for (uint64_t seed = 0; seed < 4; ++seed) {
                Output r = generate(so, spec, budget, seed * 1000 + static_cast<uint64_t>(budget));
                EXPECT_TRUE(r.complete) << "budget " << budget << ": " << r.text;
                EXPECT_LE(r.tokens, budget);
                EXPECT_TRUE(matches(so, spec, r.text)) << r.text;
            }
        }
    }
    // A budget below the shortest sentence cannot complete; the output is still a prefix of one.
    Output r = generate(so, person, 10, 1);
    EXPECT_FALSE(r.complete);
    grammar::GrammarMatcher m(so.compile(person));
    EXPECT_TRUE(m.accept_bytes(r.text));
}

TEST(StructuredOutput, UnsupportedFeaturesAreNamed) {
    Tokenizer tok = byte_tokenizer();
    StructuredOutput so(tok, 256, kEos);
    try {
        so.compile({grammar::ConstraintKind::kJsonSchema, R"({"type":"object","patternProperties":{"a":{}}})"});
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("patternProperties"), std::string::npos) << e.what();
    }
}


// Issue 31's reproducer: a chain of `rules` EBNF rules (20,000 took minutes to compile without a budget; 0.25-0.45 s
// on a 2-core machine now, so the budget below is 50 ms).
grammar::ConstraintSpec rule_chain(int rules, const std::string& letter = "a") {
    std::string text = "root ::= r0\n";
    for (int i = 0; i + 1 < rules; ++i)
        text += "r" + std::to_string(i) + " ::= \"" + letter + "\" r" + std::to_string(i + 1) + "\n";
    text += "r" + std::to_string(rules - 1) + " ::= \"" + letter + "\"\n";
    return {grammar::ConstraintKind::kEbnf, text};
}

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

TEST(StructuredOutput, CompileTimeBudgetAnswersWithinItsLimit) {
    Tokenizer tok = byte_tokenizer();
    GrammarCompileOptions opts;
    opts.timeout = std::chrono::milliseconds(50);
    StructuredOutput so(tok, 256, kEos, opts);
    const grammar::ConstraintSpec chain = rule_chain(20000);
    const auto t0 = std::chrono::steady_clock::now();
    try {
        so.compile(chain);
        FAIL() << "compiled within the budget";
    } catch (const grammar::GrammarTooComplex& e) {
        EXPECT_TRUE(e.time_limit());
        EXPECT_NE(std::string(e.what()).find("50 ms"), std::string::npos) << e.what();
    }
    EXPECT_LT(ms_since(t0), 50 + 400);  // wall-clock slack for a loaded machine
    // A small grammar still compiles under the same budget.
    EXPECT_NO_THROW(so.compile(rule_chain(20)));
}

TEST(StructuredOutput, FullCompileQueueRefusesAndClientGoneCancels) {
    Tokenizer tok = byte_tokenizer();
    GrammarCompileOptions opts;
    opts.threads = 1;
    opts.max_queued = 0;
    opts.timeout = std::chrono::milliseconds(20000);
    StructuredOutput so(tok, 256, kEos, opts);
    std::atomic<bool> gone{false}, started{false};
    auto slow = std::async(std::launch::async, [&] {
        so.compile(rule_chain(20000), [&] {  // asked while it compiles, on the only thread
            started = true;
            return gone.load();
        });
    });
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_THROW(so.compile(rule_chain(20000, "b")), CompileQueueFull);
    // The same grammar is not refused: it waits for the compilation under way (here until its client leaves).
    std::atomic<bool> gone2{false};
    auto same = std::async(std::launch::async, [&] {
        so.compile(rule_chain(20000), [&] { return gone2.load(); });
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gone2 = true;
    EXPECT_THROW(same.get(), grammar::CompileCancelled);
    // The client of the slow one leaves: its compilation stops within milliseconds, freeing the thread.
    const auto t0 = std::chrono::steady_clock::now();
    gone = true;
    EXPECT_THROW(slow.get(), grammar::CompileCancelled);
    EXPECT_LT(ms_since(t0), 400);
    // The thread counts as busy until it has returned from the task, a moment after the result is ready.
    for (int i = 0;; ++i) {
        try {
            so.compile(rule_chain(20, "b"));
            break;
        } catch (const CompileQueueFull&) {
            ASSERT_LT(i, 100) << "the compile thread stayed busy";
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
}

}  // namespace
}  // namespace peregrine

namespace peregrine {
namespace {

// A request whose end was delivered no longer runs, though its stream lives on a moment (the engine lets go of it
// at its next step): /abort_request and the shutdown drain do not count it.
TEST(RequestRegistry, FinishedRequestsAreNotRunning) {
    RequestRegistry reg;
    auto running = std::make_shared<RequestStream>(1), done = std::make_shared<RequestStream>(2);
    reg.add("a", {running, done});
    EXPECT_EQ(reg.alive(), 2);
    done->finish(FinishReason::stop, "", "", "", 1);
    EXPECT_EQ(reg.alive(), 1);
    EXPECT_EQ(reg.abort(""), 1);
    EXPECT_TRUE(running->cancelled());
    EXPECT_FALSE(done->cancelled());
}

}  // namespace
}  // namespace peregrine
