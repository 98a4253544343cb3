#pragma once
// A fixed pool of worker threads for data-parallel loops (the CPU backend's parallel_for).
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace peregrine {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads = 0);  // 0: hardware concurrency (or PEREGRINE_THREADS)
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return static_cast<int>(workers_.size()) + 1; }

    // Runs fn(begin, end) over [0, n) split into contiguous chunks, one per thread; the caller works too.
    // Callers on several threads take turns; a call from inside fn runs serially. An exception thrown by a chunk
    // reaches the caller once every chunk is done.
    void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);

    static ThreadPool& global();

private:
    void worker_loop(int index);

    std::vector<std::thread> workers_;
    std::mutex job_mutex_, mutex_;
    std::condition_variable wake_, done_;
    const std::function<void(int64_t, int64_t)>* job_ = nullptr;
    int64_t job_n_ = 0;
    int job_parts_ = 0;
    uint64_t generation_ = 0;
    int pending_ = 0;
    std::exception_ptr error_;  // the job's first exception from a worker
    bool stop_ = false;
};

inline void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1) {
    ThreadPool::global().parallel_for(n, fn, min_chunk);
}

}  // namespace peregrine
