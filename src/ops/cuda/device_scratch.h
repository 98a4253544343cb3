#pragma once
// Device memory that only grows, allocated and given back in the calling thread's stream order, so that the next
// call on that stream may reuse it at once; freed with the object (callers keep one per device and thread).
#include "ops/cuda/launch_check.h"

#include <cuda_runtime.h>

#include <cstddef>

namespace peregrine::cuda {

struct DeviceScratch {
    void* p = nullptr;
    size_t cap = 0;
    DeviceScratch() = default;
    DeviceScratch(const DeviceScratch&) = delete;
    DeviceScratch& operator=(const DeviceScratch&) = delete;
    ~DeviceScratch() { release(); }
    char* reserve(size_t bytes) {
        if (bytes > cap) {
            if (p) PG_CUDA(cudaFreeAsync(p, 0));
            p = nullptr;
            cap = 0;
            PG_CUDA(cudaMallocAsync(&p, bytes, 0));
            cap = bytes;
        }
        return static_cast<char*>(p);
    }
    void release() {  // synchronising: only where the device may be idle
        if (p) cudaFree(p);
        p = nullptr;
        cap = 0;
    }
};

}  // namespace peregrine::cuda
