// GEMMs in the checkpoint formats, following cpu/linear.cpp: activations quantised to e4m3 per act_block
// with ue8m0 scales, each weight block's dot product summed exactly (double) and added in K order in fp32
// after scaling; bf16 output for BF16/FP8/FP4, fp32 for F32.
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/launch_stream.h"

#include <cuda_bf16.h>

namespace peregrine::cuda {

namespace {

// A thread per block: the general case.
__global__ void act_quant_kernel(const float* x, int64_t M, int K, int block, float* q, float* scales) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int nb = K / block;
    if (i >= M * nb) return;
    const int64_t m = i / nb;
    const int b = static_cast<int>(i % nb);
    const float* xb = x + m * K + static_cast<int64_t>(b) * block;
    float amax = 0.0f;
    for (int j = 0; j < block; ++j) amax = fmaxf(amax, fabsf(xb[j]));
    const float s = act_quant_scale(amax);
    scales[m * nb + b] = s;
    float* qb = q + m * K + static_cast<int64_t>(b) * block;
    for (int j = 0; j < block; ++j) qb[j] = act_quant_value(xb[j], s);
}

// Four floats a thread, block / 4 lanes a block (quad_blocks): coalesced 16-byte loads and stores. The rows are
// contiguous, so element e's block is e / block whatever its row. n4 = M * K / 4 is a multiple of the lanes of a
// block, so a block's lanes are all live or all dead.
struct Quad {
    int64_t i, e;  // quad index, its first element
    bool live;     // i < n4 (the others read element 0 so that every lane joins the block's maximum)
    float4 v;
    float s;       // the block's scale (live quads)
};
__device__ __forceinline__ Quad load_quad(const float* x, int64_t n4, int block) {
    Quad d;
    d.i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    d.live = d.i < n4;
    d.e = d.live ? d.i * 4 : 0;
    d.v = *reinterpret_cast<const float4*>(x + d.e);
    const float amax =
        group_amax(fmaxf(fmaxf(fabsf(d.v.x), fabsf(d.v.y)), fmaxf(fabsf(d.v.z), fabsf(d.v.w))), block / 4);
    d.s = d.live ? act_quant_scale(amax) : 0.0f;
    return d;
}

__global__ void act_quant4_kernel(const float* x, int64_t n4, int block, float* q, float* scales) {
    const Quad d = load_quad(x, n4, block);
    if (!d.live) return;
    if ((threadIdx.x & (block / 4 - 1)) == 0) scales[d.e / block] = d.s;
    *reinterpret_cast<float4*>(q + d.e) = make_float4(act_quant_value(d.v.x, d.s), act_quant_value(d.v.y, d.s),
                                                      act_quant_value(d.v.z, d.s), act_quant_value(d.v.w, d.s));
}

// act_quant4_kernel's arithmetic with the bf16 image of each quantised value (e4m3 value x scale, exact) written
// instead of the value and its scale: what the cuBLAS path's operand gather makes of act_quant's output. In the
// wgmma order (linear_wgmma.cu) each group of 64 values is permuted: values 16t + 4s .. 16t + 4s + 3 go to slots
// 16s + 2t, 16s + 2t + 1, 16s + 2t + 8 and 16s + 2t + 9, where the weights' A fragments expect them.
__global__ void act_quant4_bf16_kernel(const float* x, int64_t n4, int block, bool wgmma_order, uint2* out) {
    const Quad d = load_quad(x, n4, block);
    if (!d.live) return;
    const float4 v = d.v;
    const float s = d.s;  // the bf16 image: value x scale
    const __nv_bfloat162 lo = __floats2bfloat162_rn(act_quant_value(v.x, s) * s, act_quant_value(v.y, s) * s);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(act_quant_value(v.z, s) * s, act_quant_value(v.w, s) * s);
    uint2 u;
    memcpy(&u.x, &lo, 4);
    memcpy(&u.y, &hi, 4);
    if (!wgmma_order) {
        out[d.i] = u;
        return;
    }
    const int64_t group = d.e - (d.e & 63);
    const int t = static_cast<int>(d.e & 63) >> 4, s4 = static_cast<int>(d.e >> 2) & 3;
    uint32_t* o = reinterpret_cast<uint32_t*>(out);
    o[(group + 16 * s4 + 2 * t) / 2] = u.x;
    o[(group + 16 * s4 + 2 * t + 8) / 2] = u.y;
}

// Weight value k of row n (without its block scale).
__device__ __forceinline__ float weight_at(const LinearDev& w, const void* base, int64_t n, int k) {
    const int K = w.in;
    switch (w.kind) {
        case 0: return param_at(base, w.w_bf16, n * K + k);
        case 1: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[n * K + k]);
        case 2: return e4m3_to_f32(static_cast<const uint8_t*>(base)[n * K + k]);
        default: {
            uint8_t byte = static_cast<const uint8_t*>(base)[n * (K / 2) + k / 2];
            return e2m1_to_f32((k & 1) ? (byte >> 4) : (byte & 0xf));
        }
    }
}

__global__ void linear_kernel(const float* x, const float* xs, int64_t M, LinearDev w, float* y, ExpertTable experts,
                              const int* row_expert) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int N = w.out, K = w.in;
    if (i >= M * N) return;
    const int64_t m = i / N, n = i % N;
    const void* wb = w.w;
    const uint8_t* sb = w.scale;
    if (row_expert) {
        const int e = row_expert[m];
        wb = experts.w[e];
        sb = experts.scale[e];
    }
    const float* a = x + m * K;
    float out;
    if (w.kind <= 1) {
        double s = 0.0;
        for (int k = 0; k < K; ++k) s += static_cast<double>(a[k]) * static_cast<double>(weight_at(w, wb, n, k));
        out = w.kind == 1 ? round_bf16(static_cast<float>(s)) : static_cast<float>(s);
    } else if (w.kind == 2) {
        const int b = w.weight_block, ab = w.act_block;
        const uint8_t* ws = sb + (n / b) * ((K + b - 1) / b);
        const float* as = xs + m * (K / ab);
        float acc = 0.0f;
        for (int kb = 0; kb < K / b; ++kb) {
            double s = 0.0;
            for (int k = kb * b; k < (kb + 1) * b; ++k)
                s += static_cast<double>(a[k]) * static_cast<double>(weight_at(w, wb, n, k));
            acc += static_cast<float>(s) * as[kb * b / ab] * e8m0_to_f32(ws[kb]);
        }
        out = round_bf16(acc);
    } else {
        const int ab = w.act_block, per = ab / 32;
        const uint8_t* ws = sb + n * (K / 32);
        const float* as = xs + m * (K / ab);
        float acc = 0.0f;
        for (int kb = 0; kb < K / 32; ++kb) {
            double s = 0.0;
            for (int k = kb * 32; k < (kb + 1) * 32; ++k)
                s += static_cast<double>(a[k]) * static_cast<double>(weight_at(w, wb, n, k));
            acc += static_cast<float>(s) * as[kb / per] * e8m0_to_f32(ws[kb]);
        }
        out = round_bf16(acc);
    }
    y[m * N + n] = out;
}

__global__ void grouped_linear_kernel(const float* x, int64_t T, int G, int R, int GD, const uint16_t* w, float* y) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int64_t N = static_cast<int64_t>(G) * R;
    if (i >= T * N) return;
    const int64_t t = i / N, n = i % N, g = n / R;
    const float* a = x + (t * G + g) * GD;
    const uint16_t* wr = w + n * GD;
    double s = 0.0;
    for (int k = 0; k < GD; ++k) s += static_cast<double>(a[k]) * static_cast<double>(bf16_bits_to_f32(wr[k]));
    y[t * N + n] = round_bf16(static_cast<float>(s));
}

}  // namespace

void act_quant(const float* x, int64_t M, int K, int block, float* q, float* scales) {
    const int64_t n = M * (K / block);
    if (n == 0) return;
    if (quad_blocks(block) && aligned16(x) && aligned16(q)) {
        const int64_t n4 = M * K / 4;
        act_quant4_kernel<<<blocks_for(n4), kThreads>>>(x, n4, block, q, scales);
    } else {
        act_quant_kernel<<<blocks_for(n), kThreads>>>(x, M, K, block, q, scales);
    }
    PG_LAUNCHED();
}

bool act_quant_bf16_supported(const float* x, int K, int block) {
    return quad_blocks(block) && K % block == 0 && aligned16(x);
}

void act_quant_bf16(const float* x, int64_t M, int K, int block, uint16_t* out, bool wgmma_order) {
    const int64_t n4 = M * K / 4;
    if (n4 == 0) return;
    if (!act_quant_bf16_supported(x, K, block) || (reinterpret_cast<uintptr_t>(out) & 7) != 0 ||
        (wgmma_order && K % 64 != 0))
        cuda_fail(cudaErrorInvalidValue, "act_quant_bf16: unaligned rows or an unsupported block", __FILE__, __LINE__);
    act_quant4_bf16_kernel<<<blocks_for(n4), kThreads, 0, launch_stream()>>>(x, n4, block, wgmma_order,
                                                                           reinterpret_cast<uint2*>(out));
    PG_LAUNCHED();
}

void linear(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y, const ExpertTable* experts,
            const int* row_expert) {
    const int64_t n = M * w.out;
    if (n == 0) return;
    linear_kernel<<<blocks_for(n), kThreads>>>(x, xs, M, w, y, experts ? *experts : ExpertTable{}, row_expert);
    PG_LAUNCHED();
}

void grouped_linear_bf16(const float* x, int64_t T, int G, int R, int GD, const uint16_t* w, float* y) {
    const int64_t n = T * G * R;
    if (n == 0) return;
    grouped_linear_kernel<<<blocks_for(n), kThreads>>>(x, T, G, R, GD, w, y);
    PG_LAUNCHED();
}

}  // namespace peregrine::cuda
