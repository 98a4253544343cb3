#pragma once
// What code shared by host functions and CUDA kernels needs on both sides: the qualifier, and float <-> bits
// casts (intrinsics in kernels, memcpy on the host).
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PEREGRINE_HD __host__ __device__ __forceinline__
#else
#define PEREGRINE_HD inline
#endif

namespace peregrine {

PEREGRINE_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
#endif
}

PEREGRINE_HD float float_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
}

}  // namespace peregrine
