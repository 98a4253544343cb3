#pragma once
// The stream the backend's kernels launch on (launch_pdl, stream-ordered scratch): the calling thread's own, or
// another while a LaunchStream is in scope (the backend runs the hc mixes and the shared expert on side streams that
// way).
#include "ops/cuda/launch_check.h"

#include <cuda_runtime.h>

namespace peregrine::cuda {

inline cudaStream_t& launch_stream() {
    thread_local cudaStream_t s = cudaStreamPerThread;
    return s;
}

class LaunchStream {
public:
    explicit LaunchStream(cudaStream_t s) : prev_(launch_stream()) { launch_stream() = s; }
    ~LaunchStream() { launch_stream() = prev_; }
    LaunchStream(const LaunchStream&) = delete;
    LaunchStream& operator=(const LaunchStream&) = delete;

private:
    cudaStream_t prev_;
};

// A stream beside the thread's, for work that only some later op reads: fork() makes it wait for what the thread's
// stream has queued, run() launches on it, join() makes the thread's stream wait for what it ran. Created on the
// current device; kept for the thread's life (one per use and device).
class SideStream {
public:
    explicit SideStream(bool high_priority) {
        int lo = 0, hi = 0;
        PG_CUDA(cudaDeviceGetStreamPriorityRange(&lo, &hi));
        PG_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, high_priority ? hi : lo));
        PG_CUDA(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
        PG_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    }
    SideStream(const SideStream&) = delete;
    SideStream& operator=(const SideStream&) = delete;

    // f() with its launches on the side stream, after what the thread's stream has queued.
    template <class F>
    void run(F&& f) {
        PG_CUDA(cudaEventRecord(fork_, launch_stream()));
        PG_CUDA(cudaStreamWaitEvent(stream_, fork_, 0));
        {
            LaunchStream on(stream_);
            f();
        }
        PG_CUDA(cudaEventRecord(done_, stream_));
    }
    // The thread's stream waits for the latest run().
    void join() const { PG_CUDA(cudaStreamWaitEvent(launch_stream(), done_, 0)); }

private:
    cudaStream_t stream_ = nullptr;
    cudaEvent_t fork_ = nullptr, done_ = nullptr;
};

}  // namespace peregrine::cuda
