#pragma once
// A fixed number of threads running tasks from a bounded queue. Unlike ThreadPool (one data-parallel loop at
// a time), it runs independent tasks side by side, and try_submit() turns work away once `max_queued` tasks
// wait, so a burst of expensive requests is refused at once instead of piling up behind the threads.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace peregrine {

class TaskPool {
public:
    TaskPool(int threads, size_t max_queued);
    ~TaskPool();  // runs the tasks still queued, then joins
    TaskPool(const TaskPool&) = delete;
    TaskPool& operator=(const TaskPool&) = delete;

    // False (and `task` dropped) when every thread is taken and max_queued tasks already wait for one.
    bool try_submit(std::function<void()> task);

    int threads() const { return static_cast<int>(workers_.size()); }
    size_t max_queued() const { return max_queued_; }
    size_t queued() const;
    int running() const;

private:
    void worker_loop();

    std::vector<std::thread> workers_;
    const size_t max_queued_;
    mutable std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<std::function<void()>> queue_;
    int running_ = 0;
    bool stop_ = false;
};

}  // namespace peregrine
