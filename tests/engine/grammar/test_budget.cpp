// Compile budgets: a grammar past its time budget fails promptly with GrammarTooComplex, a cancelled compilation
// stops early, and the state limits report the same error naming the limit.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine/grammar/budget.h"
#include "engine/grammar/builder.h"
#include "engine/grammar/constraint.h"
#include "grammar_test_util.h"

using namespace peregrine;
using namespace peregrine::grammar;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

// Slow by construction: a free-text field of up to 10,000 printable characters over a vocabulary of 128,000
// tokens. Each of its 10,001 states walks the whole vocabulary for its token mask (about 1.5 ms a state on an idle
// machine: some 15 s without a budget).
ConstraintSpec slow_spec() { return {ConstraintKind::kEbnf, "root ::= [ -~]{0,10000}\n"}; }

std::shared_ptr<const Vocabulary> large_vocab() {
    static const auto vocab = test::synthetic_vocab(128000);
    return vocab;
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

// Wall-clock slack for a loaded machine (the suite runs beside builds on two cores): the budget is polled
// every few microseconds of work, so the slack is all scheduling.
constexpr double kSlackMs = 300;

TEST(CompileBudget, TimeLimitStopsWithinSlack) {
    GrammarCompiler compiler(large_vocab());
    const ConstraintSpec spec = slow_spec();
    CompileBudget budget(200ms);
    budget.start();
    BudgetScope scope(&budget);
    const auto t0 = Clock::now();
    try {
        compiler.compile(spec);
        FAIL() << "compiled within the budget";
    } catch (const GrammarTooComplex& e) {
        EXPECT_TRUE(e.time_limit());
        EXPECT_NE(std::string(e.what()).find("200 ms"), std::string::npos) << e.what();
    }
    EXPECT_LT(ms_since(t0), 200 + kSlackMs);
}

TEST(CompileBudget, CancelStopsEarly) {
    GrammarCompiler compiler(large_vocab());
    const ConstraintSpec spec = slow_spec();
    auto cancel = std::make_shared<std::atomic<bool>>(false);
    CompileBudget budget(0ms, cancel);  // no time limit
    budget.start();
    BudgetScope scope(&budget);
    Clock::time_point cancelled_at;
    std::thread canceller([&] {
        std::this_thread::sleep_for(50ms);
        cancelled_at = Clock::now();
        cancel->store(true);
    });
    EXPECT_THROW(compiler.compile(spec), CompileCancelled);
    const auto stopped_at = Clock::now();
    canceller.join();
    const double ms = std::chrono::duration<double, std::milli>(stopped_at - cancelled_at).count();
    EXPECT_LT(ms, kSlackMs);
    EXPECT_EQ(compiler.cached(), 0u);  // a cancelled compilation leaves nothing behind
}

TEST(CompileBudget, TooComplexIsRemembered) {
    GrammarCompiler compiler(large_vocab());
    const ConstraintSpec spec = slow_spec();
    {
        CompileBudget budget(100ms);
        budget.start();
        BudgetScope scope(&budget);
        EXPECT_THROW(compiler.compile(spec), GrammarTooComplex);
    }
    // Asking again answers from the cache, with no budget at all (a new compilation would take seconds).
    const auto t0 = Clock::now();
    EXPECT_THROW(compiler.compile(spec), GrammarTooComplex);
    EXPECT_LT(ms_since(t0), kSlackMs);
}

TEST(CompileBudget, StateLimitsAreTooComplexNamingTheLimit) {
    BuildLimits nfa;
    nfa.max_nfa_states = 100;
    GrammarBuilder b(nfa);
    int32_t root = b.declare_rule("root");
    try {
        b.set_body(root, b.literal(std::string(200, 'a')));
        FAIL() << "no limit";
    } catch (const GrammarTooComplex& e) {
        EXPECT_FALSE(e.time_limit());
        EXPECT_NE(std::string(e.what()).find("more than 100 automaton states"), std::string::npos) << e.what();
    }
    BuildLimits dfa;
    dfa.max_dfa_states = 50;
    GrammarBuilder d(dfa);
    root = d.declare_rule("root");
    d.set_body(root, d.literal(std::string(200, 'a')));
    EXPECT_THROW(d.build(root), GrammarTooComplex);
}

TEST(CompileBudget, NoBudgetOnThisThreadMeansNoLimit) {
    EXPECT_EQ(current_budget(), nullptr);
    CompileBudget budget(1ms);
    budget.start();
    {
        BudgetScope scope(&budget);
        EXPECT_EQ(current_budget(), &budget);
    }
    EXPECT_EQ(current_budget(), nullptr);
    std::this_thread::sleep_for(5ms);
    for (int i = 0; i < 100000; ++i) poll_budget();  // nothing installed: never throws
}
