#pragma once
// Error checks for CUDA runtime calls and kernel launches (throw peregrine::Error with the location), and the
// opt-in to more than 48 KB of dynamic shared memory.
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace peregrine::cuda {
[[noreturn]] void cuda_fail(cudaError_t e, const char* what, const char* file, int line);
// SM count of the current device, read once (the launch shapes that fill the GPU depend on it).
int sm_count();
}

#define PG_CUDA(expr)                                                                          \
    do {                                                                                       \
        cudaError_t pg_e_ = (expr);                                                            \
        if (pg_e_ != cudaSuccess) ::peregrine::cuda::cuda_fail(pg_e_, #expr, __FILE__, __LINE__); \
    } while (0)
#define PG_LAUNCHED() PG_CUDA(cudaGetLastError())

namespace peregrine::cuda {
// Lets Kernel take `bytes` of dynamic shared memory (above the 48 KB default) on the current device. The limit is an
// attribute of the kernel in each device's context and one process may drive several GPUs (a thread each), so it
// is set once per device, not once per process.
template <auto Kernel>
void smem_opt_in(size_t bytes) {
    static std::atomic<uint64_t> done{0};  // a bit per device
    int dev = 0;
    PG_CUDA(cudaGetDevice(&dev));
    const uint64_t bit = uint64_t{1} << (dev & 63);
    if (done.load(std::memory_order_acquire) & bit) return;
    PG_CUDA(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    done.fetch_or(bit, std::memory_order_release);
}
}  // namespace peregrine::cuda
