#pragma once
// The stream the backend's kernels launch on (launch_pdl, stream-ordered scratch): the calling thread's own, or
// another while a LaunchStream is in scope (the backend runs the hc mixes on a side stream that way).
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

}  // namespace peregrine::cuda
