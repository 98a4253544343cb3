#pragma once
// What the two grouped FP4 expert kernels share (moe_gemm_fp4.cu: mma.sync; moe_gemm_fp4_wgmma.cu: wgmma):
// their arguments, the exact bf16x2 multiply by a power-of-two scale, and the gated epilogue's
// arithmetic.
#include "ops/cuda/cp_async.cuh"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/fp4_f16.h"
#include "ops/cuda/kernels.h"

#include <cuda_bf16.h>

#include <cstring>

namespace peregrine::cuda::fp4g {

constexpr int kBM = 64;  // sorted rows (pairs of one expert) per row tile

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
    __nv_bfloat162 x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    const __nv_bfloat162 p = __hmul2(x, y);  // exact: <= 2 significant bits times a power of two
    uint32_t r;
    memcpy(&r, &p, 4);
    return r;
}

// The gated output from the fp32 sums of gate and up: swiglu()'s arithmetic (moe_kernels.cu).
__device__ __forceinline__ float gated_out(float g_sum, float u_sum, float limit, float route_w) {
    float gv = round_bf16(g_sum), uv = round_bf16(u_sum);
    if (limit > 0.0f) {
        uv = fminf(fmaxf(uv, -limit), limit);
        gv = fminf(gv, limit);
    }
    const float a = gv / (1.0f + exp_cr(-gv)) * uv;
    return round_bf16(route_w * a);
}

struct GemmArgs {
    const __nv_bfloat16* a;  // sorted rows [P, K]
    int K, N;                // N: output columns (per weight set)
    ExpertTable w0, w1;      // w1: the up projection of the gated form
    const int32_t* row_map;
    const int4* tiles;
    const int32_t* n_tiles;
    float* y;                // [pairs, N]
    const float* route_w;    // gated: routing weight per pair
    float limit;             // gated: SwiGLU clamp (<= 0: none)
};

// The wgmma kernel (moe_gemm_fp4_wgmma.cu): whether it takes these shapes, and its launch over row tiles of up
// to `tile_tokens` rows (64 or 128).
bool wgmma_supported(int K, int N, bool gated);
void launch_wgmma(const GemmArgs& g, bool gated, int tile_tokens, unsigned max_tiles);

}  // namespace peregrine::cuda::fp4g
