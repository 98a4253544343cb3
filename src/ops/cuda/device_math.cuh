#pragma once
// Scalar numerics on the device, bit-compatible with the reference's host conversions (tensor/dtype.h,
// tensor/quant.h): bf16 and e4m3 round to nearest even, e4m3 saturates, ue8m0 scales are powers of two.
#include "ops/rounded_math.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cstdint>

namespace peregrine::cuda {

__device__ __forceinline__ float round_bf16(float f) { return __bfloat162float(__float2bfloat16_rn(f)); }
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
    return __half2float(__half(h));
}
__device__ __forceinline__ float round_e4m3(float x) {
    return e4m3_to_f32(static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)));
}
// As selects, not branches: in unrolled k loops a branch per scale split the loop into blocks the compiler
// would not schedule across.
__device__ __forceinline__ float e8m0_to_f32(uint8_t b) {
    const uint32_t bits = static_cast<uint32_t>(b) << 23;
    return __uint_as_float(b == 0 ? 0x00400000u : b == 255 ? 0x7fc00000u : bits);
}
__device__ __forceinline__ float e2m1_to_f32(uint8_t code) {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float m = mag[code & 7];
    return (code & 8) ? -m : m;
}
__device__ __forceinline__ uint8_t f32_to_e2m1(float x) {
    float m = fabsf(x);
    uint8_t c;
    if (m <= 0.25f) c = 0;
    else if (m < 0.75f) c = 1;
    else if (m <= 1.25f) c = 2;
    else if (m < 1.75f) c = 3;
    else if (m <= 2.5f) c = 4;
    else if (m < 3.5f) c = 5;
    else if (m <= 5.0f) c = 6;
    else c = 7;
    return static_cast<uint8_t>(c | (signbit(x) ? 8 : 0));
}
// 2^ceil(log2(amax * max_inv)) from the IEEE bits, as the official kernels compute it.
__device__ __forceinline__ float pow2_round_scale(float amax, float max_inv) {
    uint32_t bits = __float_as_uint(amax * max_inv);
    int32_t e = static_cast<int32_t>((bits >> 23) & 0xff);
    uint32_t man = bits & 0x7fffffu;
    int32_t l = e - 127 + (man != 0 ? 1 : 0);
    return __uint_as_float(static_cast<uint32_t>(l + 127) << 23);
}

// act_quant (the reference's activation quantisation): s = 2^ceil(log2(max(amax, 1e-4) / 448)), q = e4m3(x / s),
// x / s clamped to the e4m3 range first (act_quant_clamped: the input of the e4m3 rounding).
__device__ __forceinline__ float act_quant_scale(float amax) {
    return pow2_round_scale(fmaxf(amax, 1e-4f), 1.0f / 448.0f);
}
__device__ __forceinline__ float act_quant_clamped(float v, float s) { return fminf(fmaxf(v / s, -448.0f), 448.0f); }
__device__ __forceinline__ float act_quant_value(float v, float s) { return round_e4m3(act_quant_clamped(v, s)); }

// Max |x| of a quantisation block spread over `lanes` consecutive lanes (a power of two <= 32, blocks aligned to it),
// every lane of the warp taking part. Max is exact in any order: the serial loop's value.
__device__ __forceinline__ float group_amax(float v, int lanes) {
    for (int o = lanes / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Quantisation blocks that lanes can share four floats each (one 16-byte load a lane, coalesced): a power of two
// in [4, 128].
inline bool quad_blocks(int block) { return block >= 4 && block <= 128 && (block & (block - 1)) == 0; }
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Transcendentals: exp_cr, log1p_cr, sin_cr, cos_cr (ops/rounded_math.h, the CPU reference's too).

// Sum of a double over a warp.
__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// Sum of a double over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ double block_sum(double v) {
    __shared__ double part[32];
    __shared__ double total;
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double s = lane < static_cast<int>(blockDim.x >> 5) ? part[lane] : 0.0;
        s = warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

// Reads element i of a parameter stored as bf16 (is_bf16) or f32.
__device__ __forceinline__ float param_at(const void* p, bool is_bf16, int64_t i) {
    return is_bf16 ? bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
    return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace peregrine::cuda
