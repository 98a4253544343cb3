#include "util/thread_pool.h"
#include "util/switches.h"

#include <algorithm>
#include <cstdlib>
#include <exception>

namespace peregrine {

ThreadPool::ThreadPool(int n_threads) {
    if (n_threads <= 0) {
        n_threads = switch_set("PEREGRINE_THREADS") ? static_cast<int>(switch_int("PEREGRINE_THREADS", 1, 4096))
                                                    : static_cast<int>(std::thread::hardware_concurrency());
        n_threads = std::max(1, n_threads);
    }
    for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
    static ThreadPool pool;
    return pool;
}

namespace {

// Set while a thread runs part of a job: a parallel_for inside one runs serially there.
thread_local bool in_job = false;

void run_part(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int parts, int index) {
    int64_t begin = n * index / parts, end = n * (index + 1) / parts;
    in_job = true;
    struct Reset {
        ~Reset() { in_job = false; }
    } reset;
    if (begin < end) fn(begin, end);
}

}  // namespace

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
    if (n <= 0) return;
    int parts = static_cast<int>(std::min<int64_t>(size(), std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk))));
    if (parts <= 1 || workers_.empty() || in_job) {
        fn(0, n);
        return;
    }
    // One job at a time: threads that share the pool (expert-parallel ranks) take turns.
    std::lock_guard<std::mutex> one_job(job_mutex_);
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_parts_ = parts;
    pending_ = parts - 1;
    ++generation_;
    lock.unlock();
    wake_.notify_all();
    // A part that throws: the others still finish (they read fn), then the caller's exception or else the first
    // worker's reaches the caller.
    std::exception_ptr error;
    try {
        run_part(fn, n, parts, 0);
    } catch (...) {
        error = std::current_exception();
    }
    lock.lock();
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
    if (!error) error = error_;
    error_ = nullptr;
    lock.unlock();
    if (error) std::rethrow_exception(error);
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (index >= job_parts_) continue;
        auto* fn = job_;
        int64_t n = job_n_;
        int parts = job_parts_;
        lock.unlock();
        std::exception_ptr error;
        try {
            run_part(*fn, n, parts, index);
        } catch (...) {
            error = std::current_exception();
        }
        lock.lock();
        if (error && !error_) error_ = error;
        if (--pending_ == 0) done_.notify_one();
    }
}

}  // namespace peregrine
