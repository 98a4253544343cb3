// RMSNorm and the hyper-connection (mHC) kernels: mixing coefficients with the Sinkhorn normalisation fused
// into the same kernel, collapse, expand, mean, embedding and row gathers (cf. cpu/cpu_backend.cpp).
#include "ops/cuda/device_memory.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/entry_store.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/rope_qdq.cuh"

#include <algorithm>
#include <cstdint>

namespace peregrine::cuda {

namespace {

// A block per row, the row held in registers (kNormVals a thread; a longer row's rest by the loop), so that it is
// read once and its loads are in flight together (a 5120-wide row took 16 us with 256 threads walking it
// twice). The sum of squares is in double in each thread's strided order, then the block's tree.
constexpr int kNormVals = 8;

// hc_collapse's value c of a token: the pre-weighted sum of its hc copies (x: the token's [hc][D]), rounded to bf16.
__device__ __forceinline__ float collapse_value(const float* x, const float* p, int hc, int D, int64_t c) {
    float s = 0.0f;
    for (int k = 0; k < hc; ++k) s += p[k] * x[k * D + c];
    return round_bf16(s);
}
// One row whose value i is value(i), normalised by a block: rms_norm's arithmetic for any source of the row.
template <typename Value>
__device__ __forceinline__ void rms_norm_row(Value value, int D, const float* w, float eps, float* yr) {
    const int B = static_cast<int>(blockDim.x);
    float v[kNormVals];
#pragma unroll
    for (int j = 0; j < kNormVals; ++j) {
        const int i = static_cast<int>(threadIdx.x) + j * B;
        v[j] = i < D ? value(i) : 0.0f;
    }
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < kNormVals; ++j) ss += static_cast<double>(v[j] * v[j]);  // + 0 past the row: exact
    for (int i = static_cast<int>(threadIdx.x) + kNormVals * B; i < D; i += B) {
        const float x = value(i);
        ss += static_cast<double>(x * x);
    }
    ss = block_sum(ss);
    const float var = static_cast<float>(ss) / static_cast<float>(D);
    const float r = 1.0f / sqrtf(var + eps);
#pragma unroll
    for (int j = 0; j < kNormVals; ++j) {
        const int i = static_cast<int>(threadIdx.x) + j * B;
        if (i < D) yr[i] = round_bf16(w[i] * (v[j] * r));
    }
    for (int i = static_cast<int>(threadIdx.x) + kNormVals * B; i < D; i += B)
        yr[i] = round_bf16(w[i] * (value(i) * r));
}

__global__ void rms_norm_kernel(const float* x, int D, const float* w, float eps, float* y) {
    pdl_enter();
    const float* xr = x + static_cast<int64_t>(blockIdx.x) * D;
    rms_norm_row([&](int i) { return xr[i]; }, D, w, eps, y + static_cast<int64_t>(blockIdx.x) * D);
}

// rms_norm then rope_qdq on rows of one head (width D) in one launch: rms_norm_kernel's block (its thread count,
// so its sums) normalises the row into y, then its threads take the row's quads in order (rope_qdq_quad): the bits
// of rms_norm then rope_qdq. With store.p.row_pos, the block then encodes the row into its entry (paged_store_entries'
// encoder and address: the same bytes).
__global__ void norm_rope_qdq_kernel(const float* x, int D, const float* w, float eps, float* y, const int64_t* pos,
                                     const float* freqs, int offset, int dim, int n, int block, int kind,
                                     PagedRowStore store, unsigned long long* failures) {
    pdl_enter();
    const int64_t r = blockIdx.x;
    float* yr = y + r * D;
    rms_norm_row([&](int i) { return x[r * D + i]; }, D, w, eps, yr);
    __syncthreads();  // every thread's values of the row, read by quads
    for (int q0 = 0; q0 < D / 4; q0 += static_cast<int>(blockDim.x)) {
        const int q = q0 + static_cast<int>(threadIdx.x);
        rope_qdq_quad(yr, q, q < D / 4, 1, D, D, offset, pos + r, freqs, dim, false, n, block, kind);
    }
    if (store.p.row_pos) {
        __syncthreads();  // the row's final values, read by the encoder
        encode_entry_cta(store.f, yr, paged_row_entry(store.p, store.sec, r, store.p.row_pos[r]), failures);
    }
}

// hc_collapse's row normalised in the same block: the bits of hc_collapse then rms_norm, one launch and no
// intermediate row.
__global__ void collapse_norm_kernel(const float* h, const float* pre, int hc, int D, const float* w, float eps,
                                     float* y) {
    pdl_enter();
    const int64_t t = blockIdx.x;
    const float* x = h + t * hc * D;
    const float* p = pre + t * hc;
    rms_norm_row([&](int c) { return collapse_value(x, p, hc, D, c); }, D, w, eps, y + t * D);
}

constexpr int kMaxMix = 64;

// A pre and a post weight from its mix (the reference's sigmoids), for hc_finish and hc_finish_warp alike.
__device__ __forceinline__ float hc_pre(float mix, float scale, float base, float hc_eps) {
    return 1.0f / (1.0f + exp_cr(-(mix * scale + base))) + hc_eps;
}
__device__ __forceinline__ float hc_post(float mix, float scale, float base) {
    return 2.0f / (1.0f + exp_cr(-(mix * scale + base)));
}

// Pre/post weights and the Sinkhorn-normalised comb matrix of token t from its mixes (one thread).
__device__ void hc_finish(int64_t t, const float* mixes, int hc, const float* base, const float* scale, float hc_eps,
                          int iters, int mode, float* pre_out, float* post_out, float* comb_out) {
    float* pre = pre_out + t * hc;
    if (mode == 1) {
        for (int j = 0; j < hc; ++j) pre[j] = hc_pre(mixes[j], scale[0], base[j], hc_eps);
        return;
    }
    float* post = post_out + t * hc;
    float* comb = comb_out + t * hc * hc;
    for (int i = 0; i < hc; ++i) {
        pre[i] = hc_pre(mixes[i], scale[0], base[i], hc_eps);
        post[i] = hc_post(mixes[hc + i], scale[1], base[hc + i]);
    }
    for (int a = 0; a < hc; ++a) {
        float* row = comb + a * hc;
        float mx = -INFINITY;
        for (int b = 0; b < hc; ++b) {
            row[b] = mixes[2 * hc + a * hc + b] * scale[2] + base[2 * hc + a * hc + b];
            mx = fmaxf(mx, row[b]);
        }
        float sum = 0.0f;
        for (int b = 0; b < hc; ++b) sum += (row[b] = exp_cr(row[b] - mx));
        for (int b = 0; b < hc; ++b) row[b] = row[b] / sum + hc_eps;
    }
    auto col_norm = [&] {
        for (int b = 0; b < hc; ++b) {
            float s = 0.0f;
            for (int a = 0; a < hc; ++a) s += comb[a * hc + b];
            for (int a = 0; a < hc; ++a) comb[a * hc + b] /= (s + hc_eps);
        }
    };
    col_norm();
    for (int it = 0; it < iters - 1; ++it) {
        for (int a = 0; a < hc; ++a) {
            float s = 0.0f;
            for (int b = 0; b < hc; ++b) s += comb[a * hc + b];
            for (int b = 0; b < hc; ++b) comb[a * hc + b] /= (s + hc_eps);
        }
        col_norm();
    }
}

// hc_finish on a whole warp (every lane calls it; `mixes` readable by all): lane a * hc + b holds comb[a][b] and
// gathers its row or column with shuffles, so that the Sinkhorn loop's divisions run side by side instead of one
// after another on one thread. Each sum is still formed in index order and each element sees the same
// operations, so the results are those of hc_finish bit for bit. hc * hc > 32: one lane runs hc_finish.
__device__ void hc_finish_warp(int64_t t, const float* mixes, int hc, const float* base, const float* scale,
                               float hc_eps, int iters, int mode, float* pre_out, float* post_out, float* comb_out) {
    const int lane = threadIdx.x & 31;
    if (hc * hc > 32 || mode == 1) {
        if (lane == 0) hc_finish(t, mixes, hc, base, scale, hc_eps, iters, mode, pre_out, post_out, comb_out);
        return;
    }
    if (lane < hc) {
        pre_out[t * hc + lane] = hc_pre(mixes[lane], scale[0], base[lane], hc_eps);
        post_out[t * hc + lane] = hc_post(mixes[hc + lane], scale[1], base[hc + lane]);
    }
    const bool mine = lane < hc * hc;
    const int a = mine ? lane / hc : 0, b = mine ? lane % hc : 0;
    constexpr unsigned kAll = 0xffffffffu;
    float v = mine ? mixes[2 * hc + lane] * scale[2] + base[2 * hc + lane] : 0.0f;
    float mx = -INFINITY;
    for (int j = 0; j < hc; ++j) mx = fmaxf(mx, __shfl_sync(kAll, v, a * hc + j));
    v = exp_cr(v - mx);
    float sum = 0.0f;
    for (int j = 0; j < hc; ++j) sum += __shfl_sync(kAll, v, a * hc + j);
    v = v / sum + hc_eps;
    auto col_norm = [&] {
        float c = 0.0f;
        for (int i = 0; i < hc; ++i) c += __shfl_sync(kAll, v, i * hc + b);
        v /= (c + hc_eps);
    };
    col_norm();
    for (int it = 0; it < iters - 1; ++it) {
        float r = 0.0f;
        for (int j = 0; j < hc; ++j) r += __shfl_sync(kAll, v, a * hc + j);
        v /= (r + hc_eps);
        col_norm();
    }
    if (mine) comb_out[t * hc * hc + lane] = v;
}

__global__ void hc_mixes_kernel(const float* h, int hc, int D, const float* fn, int n_mix, const float* base,
                                const float* scale, float eps, float hc_eps, int iters, int mode, float* pre_out,
                                float* post_out, float* comb_out) {
    pdl_enter();
    __shared__ float mixes[kMaxMix];
    const int64_t t = blockIdx.x;
    const int W = hc * D;
    const float* x = h + t * W;
    double ss = 0.0;
    for (int i = threadIdx.x; i < W; i += blockDim.x) ss += static_cast<double>(x[i] * x[i]);
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(static_cast<float>(ss) / static_cast<float>(W) + eps);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int j = warp; j < n_mix; j += nw) {
        const float* f = fn + static_cast<int64_t>(j) * W;
        double s = 0.0;
        for (int i = lane; i < W; i += 32) s += static_cast<double>(x[i]) * static_cast<double>(f[i]);
        s = warp_sum(s);
        if (lane == 0) mixes[j] = static_cast<float>(s) * r;
    }
    __syncthreads();
    if (threadIdx.x >= 32) return;
    hc_finish_warp(t, mixes, hc, base, scale, hc_eps, iters, mode, pre_out, post_out, comb_out);
}

// Mixes of up to kFastMix per token in the fast paths below.
constexpr int kFastMix = 32;

// Fast mixes at decode sizes (Numerics::Fast, T <= kSmallMaxT), in two launches. The row is cut into chunks of
// kSmallChunk columns; block (b, g) sums chunks [c0, c1) of every (token, mix) pair of token group g in double
// (exact products of the fp32 inputs) and each token's sum of squares (fp32 squares, double sums, as the exact
// kernel forms them), staging the fn and h chunks in shared memory. Then a block per token adds its pairs'
// partials in a fixed order (deterministic; double sums in another order than the exact kernel's, which Fast
// accepts) and finishes the token.
constexpr int kSmallChunk = 128, kSmallThreads = 256, kSmallGroup = 8, kSmallMaxT = 64;
constexpr int kSmallPerThread = (kSmallGroup * (kFastMix + 1) + kSmallThreads - 1) / kSmallThreads;

__global__ void __launch_bounds__(kSmallThreads) hc_mixes_partial_kernel(const float* h, int T, int W, const float* fn,
                                                                         int n_mix, int n_chunks, double* part) {
    pdl_enter();
    constexpr int kLd = kSmallChunk + 1;  // padded rows: the pairs of a warp read distinct banks
    __shared__ float fs[kFastMix * kLd];
    __shared__ float xs[kSmallGroup * kLd];
    const int J = n_mix + 1, S = gridDim.x, tid = threadIdx.x;
    const int t0 = blockIdx.y * kSmallGroup, nt = min(kSmallGroup, T - t0), P = nt * J;
    const int c0 = static_cast<int>(static_cast<int64_t>(blockIdx.x) * n_chunks / S);
    const int c1 = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * n_chunks / S);
    double acc[kSmallPerThread];
#pragma unroll
    for (int q = 0; q < kSmallPerThread; ++q) acc[q] = 0.0;
    for (int c = c0; c < c1; ++c) {
        const int col0 = c * kSmallChunk, len = min(kSmallChunk, W - col0);
        // Every load of the chunk in flight at once (a loop of dependent load-store pairs cost ~10 us).
        constexpr int kFL = (kFastMix * kSmallChunk + kSmallThreads - 1) / kSmallThreads;
        constexpr int kXL = (kSmallGroup * kSmallChunk + kSmallThreads - 1) / kSmallThreads;
        float fv[kFL], xv[kXL];
#pragma unroll
        for (int q = 0; q < kFL; ++q) {
            const int i = tid + q * kSmallThreads, j = i / kSmallChunk, k = i % kSmallChunk;
            fv[q] = i < n_mix * kSmallChunk && k < len ? fn[static_cast<int64_t>(j) * W + col0 + k] : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < kXL; ++q) {
            const int i = tid + q * kSmallThreads, t = i / kSmallChunk, k = i % kSmallChunk;
            xv[q] = i < nt * kSmallChunk && k < len ? h[static_cast<int64_t>(t0 + t) * W + col0 + k] : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < kFL; ++q) {
            const int i = tid + q * kSmallThreads;
            if (i < n_mix * kSmallChunk) fs[(i / kSmallChunk) * kLd + i % kSmallChunk] = fv[q];
        }
#pragma unroll
        for (int q = 0; q < kXL; ++q) {
            const int i = tid + q * kSmallThreads;
            if (i < nt * kSmallChunk) xs[(i / kSmallChunk) * kLd + i % kSmallChunk] = xv[q];
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < kSmallPerThread; ++q) {
            const int p = tid + q * kSmallThreads;
            if (p < P) {
                const int t = p / J, j = p % J;
                const float* xr = xs + t * kLd;
                double s = 0.0;
                if (j < n_mix) {
                    const float* fr = fs + j * kLd;
                    // The product of two floats is exact in double, so the fused multiply-add rounds once, as
                    // the GEMM's multiply then add does.
                    for (int k = 0; k < len; ++k)
                        s = __fma_rn(static_cast<double>(xr[k]), static_cast<double>(fr[k]), s);
                } else {
                    for (int k = 0; k < len; ++k) s += static_cast<double>(xr[k] * xr[k]);
                }
                acc[q] += s;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int q = 0; q < kSmallPerThread; ++q) {
        const int p = tid + q * kSmallThreads;
        if (p < P) part[(static_cast<int64_t>(t0) * J + p) * S + blockIdx.x] = acc[q];
    }
}

// Block t: the S partials of each of token t's pairs summed (a warp per pair: lane-strided, then a warp tree;
// every pair at once, finish_threads), then the finish on one warp.
// Decode sizes (a block per token for at most two per SM): a warp per pair (up to 32); with 8 warps for 25 pairs
// each warp waited for global memory four times in a row (~13 us a call). More tokens: 8 warps, so that more
// blocks share an SM (a warp per pair made 64K tokens' mixes 45 -> 69 ms). A pair's sum is one warp's either way.
inline int finish_threads(int64_t T, int n_mix) { return T <= 2 * sm_count() ? 32 * std::min(n_mix + 1, 32) : 256; }

__global__ void hc_mixes_finish_kernel(const double* part, int S, int W, int n_mix, int hc, const float* base,
                                       const float* scale, float eps, float hc_eps, int iters, int mode, float* pre,
                                       float* post, float* comb) {
    pdl_enter();
    __shared__ float mix[kFastMix + 1];
    const int t = blockIdx.x, J = n_mix + 1, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int j = warp; j < J; j += blockDim.x >> 5) {
        const double* pp = part + (static_cast<int64_t>(t) * J + j) * S;
        double s = 0.0;
        for (int b = lane; b < S; b += 32) s += pp[b];
        s = warp_sum(s);
        if (lane == 0) mix[j] = static_cast<float>(s);
    }
    __syncthreads();
    if (threadIdx.x >= 32) return;
    const float r = 1.0f / sqrtf(mix[n_mix] / static_cast<float>(W) + eps);
    __shared__ float mixes[kFastMix];
    if (threadIdx.x < n_mix) mixes[threadIdx.x] = mix[threadIdx.x] * r;
    __syncwarp();
    hc_finish_warp(t, mixes, hc, base, scale, hc_eps, iters, mode, pre, post, comb);
}

// Fast mixes at prefill sizes (Numerics::Fast): the n_mix dot products of every token on the FP64 tensor cores
// (mma m8n8k4: exact products of the fp32 inputs, double sums) and each token's sum of squares (fp32 squares,
// double sums), reading h once; hc_mixes_finish_kernel then adds the column splits' partials in a fixed order and
// finishes each token. Block (g, s): tokens 64 g.. x all mixes (zero-padded to 32) over column split s, in chunks
// of 64 columns staged in shared memory as doubles (converted once), the next chunk's loads in flight during the
// current chunk's MMAs. Warp w: tokens 16 w.. (two 8-token tiles) x four 8-mix tiles, so that each fn fragment
// read from shared memory feeds two MMAs. (A cuBLAS FP64 GEMM on widened copies did the same in 0.8 ms for 4,096
// tokens; an fp32 GEMM moved V4 logits by 0.06 through the bf16 roundings downstream.)
constexpr int kDmmaTokens = 64, kDmmaChunk = 64, kDmmaLd = kDmmaChunk + 4, kDmmaThreads = 128;
constexpr int kDmmaRowStep = kDmmaThreads / (kDmmaChunk / 4);     // rows a pass of float4 loads covers
constexpr int kDmmaHLoads = kDmmaTokens / kDmmaRowStep;            // float4 of h per thread and chunk
constexpr int kDmmaFLoads = kFastMix / kDmmaRowStep;               // float4 of fn per thread and chunk
constexpr int kDmmaSmem = sizeof(double) * (kDmmaTokens + kFastMix) * kDmmaLd;

__device__ __forceinline__ void dmma_m8n8k4(double& d0, double& d1, double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
                 : "+d"(d0), "+d"(d1)
                 : "d"(a), "d"(b));
}

__global__ void __launch_bounds__(kDmmaThreads) hc_mixes_dmma_kernel(const float* h, int T, int W, const float* fn,
                                                                      int n_mix, int n_chunks, double* part) {
    pdl_enter();
    extern __shared__ double dmma_smem[];
    double* xs = dmma_smem;                      // [kDmmaTokens][kDmmaLd]
    double* fs = dmma_smem + kDmmaTokens * kDmmaLd;  // [kFastMix][kDmmaLd]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int S = gridDim.y, J = n_mix + 1, t0 = blockIdx.x * kDmmaTokens;
    const int c0 = static_cast<int>(static_cast<int64_t>(blockIdx.y) * n_chunks / S);
    const int c1 = static_cast<int>(static_cast<int64_t>(blockIdx.y + 1) * n_chunks / S);
    for (int i = tid; i < (kFastMix - n_mix) * kDmmaLd; i += kDmmaThreads) fs[n_mix * kDmmaLd + i] = 0.0;
    // Thread's float4 i of a chunk: row (tid >> 4) + 8 i (a token, or a mix of fn), columns 4 (tid & 15)..
    float4 hv[kDmmaHLoads], fv[kDmmaFLoads];
    auto load = [&](int c) {
        const int col = c * kDmmaChunk + 4 * (tid & 15);
#pragma unroll
        for (int i = 0; i < kDmmaHLoads; ++i) {
            const int t = t0 + (tid >> 4) + kDmmaRowStep * i;
            hv[i] = t < T && col < W ? *reinterpret_cast<const float4*>(h + static_cast<int64_t>(t) * W + col)
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int i = 0; i < kDmmaFLoads; ++i) {
            const int r = (tid >> 4) + kDmmaRowStep * i;
            fv[i] = r < n_mix && col < W ? *reinterpret_cast<const float4*>(fn + static_cast<int64_t>(r) * W + col)
                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
    double acc[2][4][2] = {}, ss[kDmmaHLoads] = {};
    if (c0 < c1) load(c0);
    for (int c = c0; c < c1; ++c) {
        __syncthreads();  // the previous chunk's MMAs are done with the shared tiles
        const int k = 4 * (tid & 15);
#pragma unroll
        for (int i = 0; i < kDmmaHLoads; ++i) {
            const int r = (tid >> 4) + kDmmaRowStep * i;
            const float x[4] = {hv[i].x, hv[i].y, hv[i].z, hv[i].w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                xs[r * kDmmaLd + k + e] = static_cast<double>(x[e]);
                ss[i] += static_cast<double>(x[e] * x[e]);
            }
        }
#pragma unroll
        for (int i = 0; i < kDmmaFLoads; ++i) {
            const int r = (tid >> 4) + kDmmaRowStep * i;
            const float f[4] = {fv[i].x, fv[i].y, fv[i].z, fv[i].w};
            if (r < n_mix)
#pragma unroll
                for (int e = 0; e < 4; ++e) fs[r * kDmmaLd + k + e] = static_cast<double>(f[e]);
        }
        __syncthreads();
        if (c + 1 < c1) load(c + 1);
        const double* xa = xs + (warp * 16 + (lane >> 2)) * kDmmaLd + (lane & 3);
        const double* fb = fs + (lane >> 2) * kDmmaLd + (lane & 3);
#pragma unroll 4
        for (int kk = 0; kk < kDmmaChunk; kk += 4) {
            const double a0 = xa[kk], a1 = xa[8 * kDmmaLd + kk];
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const double b = fb[nt * 8 * kDmmaLd + kk];
                dmma_m8n8k4(acc[0][nt][0], acc[0][nt][1], a0, b);
                dmma_m8n8k4(acc[1][nt][0], acc[1][nt][1], a1, b);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < 2; ++m) {
        const int t = t0 + warp * 16 + 8 * m + (lane >> 2);
        if (t < T)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int j = nt * 8 + 2 * (lane & 3) + e;
                    if (j < n_mix) part[(static_cast<int64_t>(t) * J + j) * S + blockIdx.y] = acc[m][nt][e];
                }
    }
#pragma unroll
    for (int i = 0; i < kDmmaHLoads; ++i) {  // the 16 threads of a row
        double v = ss[i];
        for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        const int tr = t0 + (tid >> 4) + kDmmaRowStep * i;
        if ((tid & 15) == 0 && tr < T) part[(static_cast<int64_t>(tr) * J + n_mix) * S + blockIdx.y] = v;
    }
}

__global__ void hc_collapse_kernel(const float* h, const float* pre, int64_t T, int hc, int D, float* y) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= T * D) return;
    const int64_t t = i / D, c = i % D;
    y[i] = collapse_value(h + t * hc * D, pre + t * hc, hc, D, c);
}

__global__ void hc_expand_kernel(const float* y, const float* res, const float* post, const float* comb, int64_t T,
                                 int hc, int D, float* out) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= T * hc * D) return;
    const int64_t t = i / (hc * D), j = (i / D) % hc, c = i % D;
    const float* r = res + t * hc * D;
    const float* cb = comb + t * hc * hc;
    float s = 0.0f;
    for (int k = 0; k < hc; ++k) s += cb[k * hc + j] * r[k * D + c];
    out[i] = round_bf16(post[t * hc + j] * y[t * D + c] + s);
}

// Numerics::Fast: one thread per (token, 4 channels) writes all kHc copies, reading each residual copy once
// (the plain kernel reads every copy once per output); each output's arithmetic and order are the plain one's.
template <int kHc>
__global__ void hc_expand4_kernel(const float* y, const float* res, const float* post, const float* comb, int64_t T,
                                  int D, float* out) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int D4 = D / 4;
    if (i >= T * D4) return;
    const int64_t t = i / D4;
    const int c = static_cast<int>(i % D4) * 4;
    const float* cb = comb + t * kHc * kHc;
    float4 r[kHc];
#pragma unroll
    for (int k = 0; k < kHc; ++k) r[k] = *reinterpret_cast<const float4*>(res + (t * kHc + k) * D + c);
    const float4 yv = *reinterpret_cast<const float4*>(y + t * D + c);
#pragma unroll
    for (int j = 0; j < kHc; ++j) {
        float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int k = 0; k < kHc; ++k) {
            const float w = cb[k * kHc + j];
            s.x += w * r[k].x;
            s.y += w * r[k].y;
            s.z += w * r[k].z;
            s.w += w * r[k].w;
        }
        const float p = post[t * kHc + j];
        *reinterpret_cast<float4*>(out + (t * kHc + j) * D + c) =
            make_float4(round_bf16(p * yv.x + s.x), round_bf16(p * yv.y + s.y), round_bf16(p * yv.z + s.z),
                        round_bf16(p * yv.w + s.w));
    }
}

__global__ void hc_mean_kernel(const float* h, int64_t T, int hc, int D, float* y) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= T * D) return;
    const int64_t t = i / D, c = i % D;
    float s = 0.0f;
    for (int k = 0; k < hc; ++k) s += h[(t * hc + k) * D + c];
    y[i] = round_bf16(s / static_cast<float>(hc));
}

__global__ void embed_kernel(const void* table, bool bf16, const int32_t* ids, int64_t T, int hc, int D, float* h) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= T * hc * D) return;
    const int64_t t = i / (hc * D), c = i % D;
    h[i] = param_at(table, bf16, static_cast<int64_t>(ids[t]) * D + c);
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t n, int64_t len, float* y) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n * len) return;
    y[i] = x[static_cast<int64_t>(rows[i / len]) * len + i % len];
}

__global__ void gather_bytes_kernel(const uint8_t* x, const int32_t* rows, int64_t n, int64_t len, uint8_t* y) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n * len) return;
    y[i] = x[static_cast<int64_t>(rows[i / len]) * len + i % len];
}

__global__ void first_stream_kernel(int64_t T, int hc, float* pre) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= T * hc) return;
    pre[i] = (i % hc) == 0 ? 1.0f : 0.0f;
}

// About four values a thread: 1024 threads for V4.1-Flash's 5120-wide rows.
int norm_threads(int D) { return std::clamp((D / 4 + 31) / 32 * 32, 32, 1024); }

}  // namespace

void rms_norm(const float* x, int64_t rows, int D, const float* w, float eps, float* y) {
    if (rows == 0) return;
    const int threads = norm_threads(D);
    launch_pdl(rms_norm_kernel, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, x, D, w, eps, y);
}

void rms_norm_rope_qdq(const float* x, int64_t rows, int D, const float* w, float eps, float* y, const int64_t* pos,
                       const float* freqs, int offset, int dim, int n, int block, int kind,
                       const PagedRowStore* store) {
    if (rows == 0) return;
    if (!rope_qdq_takes_quads(y, D, D, offset, dim, n, block) || (store && store->f.dim != D)) {
        rms_norm(x, rows, D, w, eps, y);
        rope_qdq(y, rows, 1, D, D, offset, pos, freqs, dim, false, n, block, kind);
        if (store) paged_store_entries(y, rows, store->f, store->p, store->sec);
        return;
    }
    launch_pdl(norm_rope_qdq_kernel, dim3(static_cast<unsigned>(rows)), dim3(norm_threads(D)), 0, x, D, w, eps, y, pos,
               freqs, offset, dim, n, block, kind, store ? *store : PagedRowStore{},
               store ? state_encode_failure_counter() : nullptr);
}

void collapse_norm(const float* h, const float* pre, int64_t T, int hc, int D, const float* w, float eps, float* y) {
    if (T == 0) return;
    launch_pdl(collapse_norm_kernel, dim3(static_cast<unsigned>(T)), dim3(norm_threads(D)), 0, h, pre, hc, D, w, eps,
               y);
}

void hc_mixes(const float* h, int64_t T, int hc, int D, const float* fn, int n_mix, const float* base,
              const float* scale, float eps, float hc_eps, int iters, int mode, float* pre, float* post, float* comb) {
    if (T == 0) return;
    if (n_mix > kFastMix) cuda_fail(cudaErrorInvalidValue, "hc_mixes: too many mixes", __FILE__, __LINE__);
    launch_pdl(hc_mixes_kernel, dim3(static_cast<unsigned>(T)), dim3(256), 0, h, hc, D, fn, n_mix, base, scale, eps,
               hc_eps, iters, mode, pre, post, comb);
}

namespace {
// Column blocks of the small-T partial kernel: about two blocks per SM over all token groups.
int small_blocks(int64_t T, int W) {
    const int n_chunks = (W + kSmallChunk - 1) / kSmallChunk;
    const int groups = static_cast<int>((T + kSmallGroup - 1) / kSmallGroup);
    return std::clamp(2 * sm_count() / groups, 1, n_chunks);
}
}  // namespace

bool hc_mixes_small_supported(int64_t T, int n_mix) {
    return T >= 1 && T <= kSmallMaxT && n_mix >= 1 && n_mix <= kFastMix;
}

size_t hc_mixes_small_workspace(int64_t T, int hc, int D, int n_mix) {
    return sizeof(double) * static_cast<size_t>(T * (n_mix + 1)) * small_blocks(T, hc * D);
}

void hc_mixes_small(const float* h, int64_t T, int hc, int D, const float* fn, int n_mix, const float* base,
                    const float* scale, float eps, float hc_eps, int iters, int mode, float* pre, float* post,
                    float* comb, void* workspace) {
    if (T == 0) return;
    if (!hc_mixes_small_supported(T, n_mix))
        cuda_fail(cudaErrorInvalidValue, "hc_mixes_small: unsupported shape", __FILE__, __LINE__);
    const int W = hc * D, S = small_blocks(T, W), n_chunks = (W + kSmallChunk - 1) / kSmallChunk;
    const unsigned groups = static_cast<unsigned>((T + kSmallGroup - 1) / kSmallGroup);
    double* part = static_cast<double*>(workspace);
    launch_pdl(hc_mixes_partial_kernel, dim3(static_cast<unsigned>(S), groups), dim3(kSmallThreads), 0, h,
               static_cast<int>(T), W, fn, n_mix, n_chunks, part);
    launch_pdl(hc_mixes_finish_kernel, dim3(static_cast<unsigned>(T)), dim3(finish_threads(T, n_mix)), 0, part, S, W,
               n_mix, hc, base, scale, eps, hc_eps, iters, mode, pre, post, comb);
}

void hc_mixes_fast(const float* h, int64_t T, int hc, int D, const float* fn, int n_mix, const float* base,
                   const float* scale, float eps, float hc_eps, int iters, int mode, float* pre, float* post,
                   float* comb) {
    if (T == 0) return;
    const int W = hc * D;
    if (n_mix > kFastMix || T > 2147483647 || W % 4 != 0 || !aligned16(h) || !aligned16(fn)) {
        hc_mixes(h, T, hc, D, fn, n_mix, base, scale, eps, hc_eps, iters, mode, pre, post, comb);
        return;
    }
    const int n_chunks = (W + kDmmaChunk - 1) / kDmmaChunk;
    const int tiles = static_cast<int>((T + kDmmaTokens - 1) / kDmmaTokens);
    const int S = std::clamp((2 * sm_count() + tiles - 1) / tiles, 1, n_chunks);
    auto keep = device_alloc(sizeof(double) * static_cast<size_t>(T) * (n_mix + 1) * S);  // freed after the finish
    double* part = static_cast<double*>(keep.get());
    smem_opt_in<hc_mixes_dmma_kernel>(kDmmaSmem);
    launch_pdl(hc_mixes_dmma_kernel, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(S)), dim3(kDmmaThreads),
               kDmmaSmem, h, static_cast<int>(T), W, fn, n_mix, n_chunks, part);
    launch_pdl(hc_mixes_finish_kernel, dim3(static_cast<unsigned>(T)), dim3(finish_threads(T, n_mix)), 0, part, S, W,
               n_mix, hc, base, scale, eps, hc_eps, iters, mode, pre, post, comb);
}

void hc_collapse(const float* h, const float* pre, int64_t T, int hc, int D, float* y) {
    if (T == 0) return;
    launch_pdl(hc_collapse_kernel, dim3(blocks_for(T * D)), dim3(kThreads), 0, h, pre, T, hc, D, y);
}

void hc_expand(const float* y, const float* residual, const float* post, const float* comb, int64_t T, int hc, int D,
               float* out) {
    if (T == 0) return;
    launch_pdl(hc_expand_kernel, dim3(blocks_for(T * hc * D)), dim3(kThreads), 0, y, residual, post, comb, T, hc, D,
               out);
}

void hc_expand_fast(const float* y, const float* residual, const float* post, const float* comb, int64_t T, int hc,
                    int D, float* out) {
    if (T == 0) return;
    const bool aligned = ((reinterpret_cast<uintptr_t>(y) | reinterpret_cast<uintptr_t>(residual) |
                           reinterpret_cast<uintptr_t>(out)) & 15u) == 0;
    if (hc != 4 || D % 4 != 0 || !aligned) {
        hc_expand(y, residual, post, comb, T, hc, D, out);
        return;
    }
    launch_pdl(hc_expand4_kernel<4>, dim3(blocks_for(T * (D / 4))), dim3(kThreads), 0, y, residual, post, comb, T, D,
               out);
}

void hc_mean(const float* h, int64_t T, int hc, int D, float* y) {
    if (T == 0) return;
    launch_pdl(hc_mean_kernel, dim3(blocks_for(T * D)), dim3(kThreads), 0, h, T, hc, D, y);
}

void embed(const void* table, bool bf16, const int32_t* ids, int64_t T, int hc, int D, float* h) {
    if (T == 0) return;
    launch_pdl(embed_kernel, dim3(blocks_for(T * hc * D)), dim3(kThreads), 0, table, bf16, ids, T, hc, D, h);
}

void gather_rows(const float* x, const int32_t* rows, int64_t n, int64_t len, float* y) {
    if (n * len == 0) return;
    launch_pdl(gather_rows_kernel, dim3(blocks_for(n * len)), dim3(kThreads), 0, x, rows, n, len, y);
}

void gather_bytes(const void* x, const int32_t* rows, int64_t n, int64_t row_bytes, void* y) {
    if (n * row_bytes == 0) return;
    launch_pdl(gather_bytes_kernel, dim3(blocks_for(n * row_bytes)), dim3(kThreads), 0,
               static_cast<const uint8_t*>(x), rows, n, row_bytes, static_cast<uint8_t*>(y));
}

void first_stream_mix(int64_t T, int hc, float* pre) {
    if (T == 0) return;
    launch_pdl(first_stream_kernel, dim3(blocks_for(T * hc)), dim3(kThreads), 0, T, hc, pre);
}

}  // namespace peregrine::cuda
