#pragma once
// A budget for compiling one grammar: a time limit and a cancel flag, polled from the compilers' loops so a
// request that asks for too much (tens of thousands of rules, a huge schema) stops within milliseconds of its
// limit, and a request whose client went away stops at once. The state limits are BuildLimits (builder.h).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "util/error.h"

namespace peregrine::grammar {

// The grammar passed a limit (time or automaton states); the message names the limit. HTTP 400.
class GrammarTooComplex : public Error {
public:
    explicit GrammarTooComplex(const std::string& what, bool time_limit = false)
        : Error(what), time_limit_(time_limit) {}
    bool time_limit() const { return time_limit_; }  // the time budget, not a state limit

private:
    bool time_limit_;
};

// The compilation was cancelled (its client disconnected) before it finished.
class CompileCancelled : public Error {
public:
    CompileCancelled() : Error("grammar compilation cancelled") {}
};

class CompileBudget {
public:
    using Clock = std::chrono::steady_clock;
    // time <= 0: no time limit. `cancel` may be null.
    explicit CompileBudget(std::chrono::milliseconds time = {}, std::shared_ptr<std::atomic<bool>> cancel = {});

    // Starts the clock (compilation time does not include the time spent waiting for a compile thread).
    void start();
    // Throws CompileCancelled or GrammarTooComplex once the flag is set or the time is up.
    void check() const;
    std::chrono::milliseconds time() const { return time_; }

private:
    std::chrono::milliseconds time_;
    Clock::time_point deadline_ = Clock::time_point::max();
    std::shared_ptr<std::atomic<bool>> cancel_;
};

// Installs a budget for the compilation running on this thread (pool workers install their caller's).
class BudgetScope {
public:
    explicit BudgetScope(const CompileBudget* budget);
    ~BudgetScope();
    BudgetScope(const BudgetScope&) = delete;
    BudgetScope& operator=(const BudgetScope&) = delete;

private:
    const CompileBudget* saved_;
};

const CompileBudget* current_budget();

extern constinit thread_local uint32_t budget_polls;

// Called from the compilers' inner loops: checks this thread's budget, reading the clock once in 256 calls so
// that it costs next to nothing.
inline void poll_budget() {
    if ((++budget_polls & 255u) == 0)
        if (const CompileBudget* b = current_budget()) b->check();
}

}  // namespace peregrine::grammar
