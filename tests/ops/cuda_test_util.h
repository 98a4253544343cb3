#pragma once
// Shared by the GPU tests: skip (with the reason) where no GPU is usable, and device time by CUDA events.
#include "ops/backend.h"
#include "kv/entry_format.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#define REQUIRE_GPU()                                            \
    do {                                                         \
        std::string why_;                                        \
        if (!cuda_device_available(&why_)) GTEST_SKIP() << why_; \
    } while (0)

namespace peregrine::test {

// Device milliseconds per call of f: `warmup` untimed calls (scratch growth, library heuristics), then `reps`
// calls timed with CUDA events on the default stream.
inline double device_ms(const std::function<void()>& f, int reps = 1, int warmup = 1) {
    for (int i = 0; i < warmup; ++i) f();
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a, 0);
    for (int i = 0; i < reps; ++i) f();
    cudaEventRecord(b, 0);
    cudaEventSynchronize(b);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    return ms / reps;
}

// rows x f.dim QDQ'd values packed as state entries back to back (f.bytes each); the packing must be exact.
inline std::vector<uint8_t> pack_entries(const std::vector<float>& v, int64_t rows, const EntryFormat& f) {
    std::vector<uint8_t> out(static_cast<size_t>(rows) * static_cast<size_t>(f.bytes));
    for (int64_t r = 0; r < rows; ++r)
        if (!encode_entry(f, v.data() + r * f.dim, out.data() + r * f.bytes)) {
            ADD_FAILURE() << "row " << r << " is not held exactly by the entry format";
            break;
        }
    return out;
}

}  // namespace peregrine::test
