#include "util/task_pool.h"

#include <algorithm>

namespace peregrine {

TaskPool::TaskPool(int threads, size_t max_queued) : max_queued_(max_queued) {
    for (int i = 0; i < std::max(1, threads); ++i) workers_.emplace_back([this] { worker_loop(); });
}

TaskPool::~TaskPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
}

bool TaskPool::try_submit(std::function<void()> task) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        // Waiting means no thread is free for it: queued tasks beyond the idle threads.
        const size_t busy = queue_.size() + static_cast<size_t>(running_);
        if (stop_ || busy >= workers_.size() + max_queued_) return false;
        queue_.push_back(std::move(task));
    }
    wake_.notify_one();
    return true;
}

size_t TaskPool::queued() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return queue_.size();
}

int TaskPool::running() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return running_;
}

void TaskPool::worker_loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        std::function<void()> task = std::move(queue_.front());
        queue_.pop_front();
        ++running_;
        lock.unlock();
        task();  // tasks handle their own errors (a packaged_task stores them)
        lock.lock();
        --running_;
    }
}

}  // namespace peregrine
