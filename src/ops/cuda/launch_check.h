#pragma once
// Error checks for CUDA runtime calls and kernel launches (throw peregrine::Error with the location).
#include <cuda_runtime.h>

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
