// Engram kernels: n-gram table rows (e4m3 with ue8m0 scales, in device memory or mapped pinned host memory)
// dequantised to bf16, and the gated add of the projected value into every hc copy (cf. cpu/engram.cpp).
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/pdl.cuh"
#include "ops/engram_hash_math.h"

namespace peregrine::cuda {

namespace {

__global__ void engram_gather_kernel(const uint8_t* table, const uint8_t* scale, const int64_t* rows, int64_t n, int hd,
                                     float* emb) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n * hd) return;
    const int64_t r = rows[i / hd], k = i % hd;
    emb[i] = round_bf16(e4m3_to_f32(table[r * hd + k]) * e8m0_to_f32(scale[r * (hd / 32) + k / 32]));
}

__global__ void engram_gate_kernel(float* h, const float* kv, const float* wgt, int hc, int D, float eps) {
    pdl_enter();
    const int64_t t = blockIdx.x / hc;
    const int i = blockIdx.x % hc;
    float* x = h + (t * hc + i) * D;
    const float* key = kv + t * (hc + 1) * D + static_cast<int64_t>(i) * D;
    const float* value = kv + t * (hc + 1) * D + static_cast<int64_t>(hc) * D;
    const float* wi = wgt + static_cast<int64_t>(i) * D;
    double hs = 0.0, ks = 0.0, dot = 0.0;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        hs += static_cast<double>(x[c] * x[c]);
        ks += static_cast<double>(key[c] * key[c]);
        dot += static_cast<double>(x[c] * wi[c] * key[c]);
    }
    hs = block_sum(hs);
    ks = block_sum(ks);
    dot = block_sum(dot);
    const float inv_sqrt_d = static_cast<float>(pow(static_cast<double>(D), -0.5));
    const float rstd =
        (1.0f / sqrtf(static_cast<float>(hs) / D + eps)) * (1.0f / sqrtf(static_cast<float>(ks) / D + eps));
    const float d = static_cast<float>(dot) * rstd * inv_sqrt_d;
    const float g = 1.0f / (1.0f + exp_cr(-copysignf(sqrtf(fmaxf(fabsf(d), 1e-6f)), d)));
    __syncthreads();
    for (int c = threadIdx.x; c < D; c += blockDim.x) x[c] = round_bf16(x[c] + g * value[c]);
}

constexpr int kMaxNgram = 16;

__global__ void engram_hash_kernel(const int32_t* windows, int64_t T, int max_ngram, int n_heads,
                                   const int32_t* token_map, int64_t map_size, int64_t pad, const int64_t* mult,
                                   const int64_t* primes, const int64_t* offsets, int64_t* rows) {
    pdl_enter();
    const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (t >= T) return;
    int64_t comp[kMaxNgram];
    for (int k = 0; k < max_ngram; ++k) {
        const int32_t id = windows[t * max_ngram + k];
        comp[k] = id >= 0 && id < map_size ? token_map[id] : pad;
    }
    engram_hash_window(comp, max_ngram, n_heads, mult, primes, offsets, rows + t * (max_ngram - 1) * n_heads);
}

}  // namespace

void engram_hash_rows(const int32_t* windows, int64_t T, int max_ngram, int n_heads, const int32_t* token_map,
                      int64_t map_size, int64_t pad, const int64_t* mult, const int64_t* primes, const int64_t* offsets,
                      int64_t* rows) {
    if (T == 0) return;
    if (max_ngram < 2 || max_ngram > kMaxNgram)
        cuda_fail(cudaErrorInvalidValue, "engram: n-gram size out of range", __FILE__, __LINE__);
    launch_pdl(engram_hash_kernel, dim3(blocks_for(T)), dim3(kThreads), 0, windows, T, max_ngram, n_heads, token_map,
               map_size, pad, mult, primes, offsets, rows);
}

void engram_gather(const uint8_t* table, const uint8_t* scale, const int64_t* rows, int64_t n, int hd, float* emb) {
    if (n == 0) return;
    launch_pdl(engram_gather_kernel, dim3(blocks_for(n * hd)), dim3(kThreads), 0, table, scale, rows, n, hd, emb);
}

void engram_gate(float* h, const float* kv, const float* wgt, int64_t T, int hc, int D, float eps) {
    if (T == 0) return;
    launch_pdl(engram_gate_kernel, dim3(static_cast<unsigned>(T * hc)), dim3(256), 0, h, kv, wgt, hc, D, eps);
}

}  // namespace peregrine::cuda
