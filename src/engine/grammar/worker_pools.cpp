#include "engine/grammar/worker_pools.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/grammar/budget.h"
#include "util/switches.h"
#include "util/thread_pool.h"

namespace peregrine::grammar {

namespace {

struct Pool {
    std::once_flag once;
    std::unique_ptr<ThreadPool> pool;
    std::timed_mutex mutex;
};

int pool_threads(GrammarPool kind) {
    int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (switch_set("PEREGRINE_GRAMMAR_THREADS")) n = static_cast<int>(switch_int("PEREGRINE_GRAMMAR_THREADS", 1, 4096));
    return kind == GrammarPool::kMask ? std::min(n, 8) : n;
}

}  // namespace

void grammar_parallel_for(GrammarPool kind, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    static Pool pools[2];
    Pool& p = pools[kind == GrammarPool::kCompile ? 0 : 1];
    std::call_once(p.once, [&] { p.pool = std::make_unique<ThreadPool>(pool_threads(kind)); });
    // Another compilation may hold the pool for up to its whole budget: wait within this one's budget.
    std::unique_lock<std::timed_mutex> lock(p.mutex, std::defer_lock);
    while (!lock.try_lock_for(std::chrono::milliseconds(5)))
        if (const CompileBudget* budget = current_budget()) budget->check();
    p.pool->parallel_for(n, fn);
}

}  // namespace peregrine::grammar
