#pragma once
// Pieces shared by the decode GEMV kernels (linear_gemv.cu, linear_gemv_mma.cu): asynchronous global ->
// shared copies (cp_async.cuh), the exact e2m1 -> e4m3 re-encoding, and the split-K scratch.
#include "ops/cuda/cp_async.cuh"

#include <cuda_runtime.h>
#include <cstddef>
#include <cstdint>

namespace peregrine::cuda {

// Eight e2m1 nibbles (low nibble first: k0..k7) as eight e4m3 bytes, k0..k3 in lo and k4..k7 in hi. An e2m1
// nibble s.ee.m placed as the e4m3 byte s.0 0ee.m00 is exactly its value x 2^-6 (normal and subnormal alike).
__device__ __forceinline__ void fp4x8_to_e4m3(uint32_t w, uint32_t& lo, uint32_t& hi) {
    const uint32_t even = ((w & 0x07070707u) << 2) | ((w & 0x08080808u) << 4);  // k0 k2 k4 k6
    const uint32_t odd = ((w >> 2) & 0x1c1c1c1cu) | (w & 0x80808080u);         // k1 k3 k5 k7
    lo = __byte_perm(even, odd, 0x5140);
    hi = __byte_perm(even, odd, 0x7362);
}

// Grow-only device scratch (which: 0 split partial sums, 1 split tickets, zeroed when allocated, 2 the stream
// kernel's staged activations) of the launch stream's set (kGemvScratchSets: 0 the thread's own stream, 1 a
// side stream whose GEMVs may run beside the thread's; set -1: the launch stream's).
constexpr int kGemvScratchSets = 2;
void* gemv_scratch(int which, size_t bytes, bool zero, int set = -1);

}  // namespace peregrine::cuda
