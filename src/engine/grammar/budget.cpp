#include "engine/grammar/budget.h"

#include <fmt/format.h>

namespace peregrine::grammar {

constinit thread_local uint32_t budget_polls = 0;

namespace {
thread_local const CompileBudget* current = nullptr;
}  // namespace

CompileBudget::CompileBudget(std::chrono::milliseconds time, std::shared_ptr<std::atomic<bool>> cancel)
    : time_(time), cancel_(std::move(cancel)) {}

void CompileBudget::start() {
    deadline_ = time_.count() > 0 ? Clock::now() + time_ : Clock::time_point::max();
}

void CompileBudget::check() const {
    if (cancel_ && cancel_->load(std::memory_order_relaxed)) throw CompileCancelled();
    if (deadline_ != Clock::time_point::max() && Clock::now() >= deadline_)
        throw GrammarTooComplex(fmt::format("grammar too complex: compiling it takes longer than the {} budget",
                                            time_.count() % 1000 ? fmt::format("{} ms", time_.count())
                                                                 : fmt::format("{} s", time_.count() / 1000)),
                                true);
}

BudgetScope::BudgetScope(const CompileBudget* budget) : saved_(current) { current = budget; }
BudgetScope::~BudgetScope() { current = saved_; }

const CompileBudget* current_budget() { return current; }

}  // namespace peregrine::grammar
