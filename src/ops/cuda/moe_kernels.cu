// Mixture-of-experts kernels: routing (score function, bias for selection only or hash routing, top-k with
// ties to the lower id, normalisation and route scale), clamped SwiGLU with the routing weight applied before
// w2, and the combine that adds expert outputs in ascending expert order (cf. cpu/moe.cpp).
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/pdl.cuh"

namespace peregrine::cuda {

namespace {

constexpr int kMaxExperts = 1024, kMaxTopK = 16;

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1p_cr(exp_cr(x)); }

__global__ void route_kernel(const float* logits, int64_t T, int E, int K, int score_func, const float* bias,
                             const int64_t* tid2eid, const int32_t* ids, int route_norm, float route_scale,
                             bool balanced, int32_t* sel, float* wsel) {
    pdl_enter();
    const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (t >= T) return;
    float score[kMaxExperts];
    const float* l = logits + t * E;
    for (int e = 0; e < E; ++e) {
        if (score_func == 0) score[e] = l[e];
        else if (score_func == 1) score[e] = 1.0f / (1.0f + exp_cr(-l[e]));
        else score[e] = sqrtf(softplus(l[e]));
    }
    if (score_func == 0) {
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; ++e) mx = fmaxf(mx, score[e]);
        for (int e = 0; e < E; ++e) sum += (score[e] = exp_cr(score[e] - mx));
        for (int e = 0; e < E; ++e) score[e] /= sum;
    }
    int top[kMaxTopK];
    if (balanced) {
        for (int k = 0; k < K; ++k) top[k] = static_cast<int>((t * K + k) % E);
    } else if (tid2eid) {
        for (int k = 0; k < K; ++k) top[k] = static_cast<int>(tid2eid[static_cast<int64_t>(ids[t]) * K + k]);
    } else {
        for (int k = 0; k < K; ++k) {
            int best = -1;
            float bv = 0.0f;
            for (int e = 0; e < E; ++e) {
                bool taken = false;
                for (int q = 0; q < k; ++q) taken |= top[q] == e;
                if (taken) continue;
                const float v = bias ? score[e] + bias[e] : score[e];
                if (best < 0 || v > bv) {
                    best = e;
                    bv = v;
                }
            }
            top[k] = best;
        }
    }
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += score[top[k]];
    for (int k = 0; k < K; ++k) {
        float v = score[top[k]];
        if (route_norm == 2) {  // RouteNorm::kSumIfSeveral
            if (K > 1) v = v / (sum + 1e-20f);
        } else if (route_norm == 1) {  // RouteNorm::kSum
            v = v / sum;
        }
        sel[t * K + k] = top[k];
        wsel[t * K + k] = v * route_scale;
    }
}

// Fast routing (Numerics::Fast): a block per token, the same arithmetic as route_kernel (scores per expert, the
// softmax sum taken in expert order by one thread) with the top-k as K rounds of a warp-wide argmax (value desc,
// ties to the lower id), so the selection and the weights are route_kernel's. The scores (transcendentals in
// double) take a thread per expert or three; the selection one warp (a warp per token, 12 scores a lane, took
// ~14 us a call).
constexpr int kRouteThreads = 128;

__global__ void __launch_bounds__(kRouteThreads) route_fast_kernel(
    const float* logits, int64_t T, int E, int K, int score_func, const float* bias, const int64_t* tid2eid,
    const int32_t* ids, int route_norm, float route_scale, bool balanced, int32_t* sel, float* wsel) {
    pdl_enter();
    __shared__ float score[kMaxExperts];
    __shared__ float biased[kMaxExperts];
    __shared__ float red[kRouteThreads / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t t = blockIdx.x;
    const float* l = logits + t * E;
    for (int e = tid; e < E; e += kRouteThreads) {
        if (score_func == 0) score[e] = l[e];
        else if (score_func == 1) score[e] = 1.0f / (1.0f + exp_cr(-l[e]));
        else score[e] = sqrtf(softplus(l[e]));
    }
    __syncthreads();
    if (score_func == 0) {
        float mx = -INFINITY;
        for (int e = tid; e < E; e += kRouteThreads) mx = fmaxf(mx, score[e]);
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (lane == 0) red[warp] = mx;
        __syncthreads();
        mx = red[0];
        for (int w = 1; w < kRouteThreads / 32; ++w) mx = fmaxf(mx, red[w]);
        for (int e = tid; e < E; e += kRouteThreads) score[e] = exp_cr(score[e] - mx);
        __syncthreads();
        if (tid == 0) {
            float sum = 0.0f;
            for (int e = 0; e < E; ++e) sum += score[e];
            red[0] = sum;
        }
        __syncthreads();
        const float sum = red[0];
        for (int e = tid; e < E; e += kRouteThreads) score[e] /= sum;
        __syncthreads();
    }
    const bool search = !balanced && !tid2eid;
    if (search) {
        for (int e = tid; e < E; e += kRouteThreads) biased[e] = bias ? score[e] + bias[e] : score[e];
        __syncthreads();
    }
    if (warp != 0) return;
    int top[kMaxTopK];
    if (balanced) {
        for (int k = 0; k < K; ++k) top[k] = static_cast<int>((t * K + k) % E);
    } else if (tid2eid) {
        for (int k = 0; k < K; ++k) top[k] = static_cast<int>(tid2eid[static_cast<int64_t>(ids[t]) * K + k]);
    } else {
        uint32_t taken = 0;  // bit i: expert lane + 32 i
        for (int k = 0; k < K; ++k) {
            int best = -1;
            float bv = 0.0f;
            for (int i = 0, e = lane; e < E; ++i, e += 32) {
                if ((taken >> i) & 1u) continue;
                const float v = biased[e];
                if (best < 0 || v > bv) {
                    best = e;
                    bv = v;
                }
            }
            for (int o = 16; o > 0; o >>= 1) {
                const int ob = __shfl_xor_sync(0xffffffffu, best, o);
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) {
                    best = ob;
                    bv = ov;
                }
            }
            top[k] = best;
            if (best >= 0 && (best & 31) == lane) taken |= 1u << (best >> 5);
        }
    }
    if (lane != 0) return;
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += score[top[k]];
    for (int k = 0; k < K; ++k) {
        float v = score[top[k]];
        if (route_norm == 2) {  // RouteNorm::kSumIfSeveral
            if (K > 1) v = v / (sum + 1e-20f);
        } else if (route_norm == 1) {  // RouteNorm::kSum
            v = v / sum;
        }
        sel[t * K + k] = top[k];
        wsel[t * K + k] = v * route_scale;
    }
}

__global__ void gather_pairs_kernel(const float* x, int64_t T, int K, int D, float* xp) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= T * K * D) return;
    xp[i] = x[(i / (static_cast<int64_t>(K) * D)) * D + i % D];
}

__global__ void swiglu_kernel(const float* g, const float* u, int64_t n, int I, const float* weights, float limit,
                              float* out) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n * I) return;
    float gv = g[i], uv = u[i];
    if (limit > 0.0f) {
        uv = fminf(fmaxf(uv, -limit), limit);
        gv = fminf(gv, limit);
    }
    float a = gv / (1.0f + exp_cr(-gv)) * uv;
    if (weights) a = weights[i / I] * a;
    out[i] = round_bf16(a);
}

__global__ void combine_kernel(const float* ye, const int32_t* sel, const float* shared, int64_t T, int K, int D,
                               float* out) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= T * D) return;
    const int64_t t = i / D, c = i % D;
    int order[kMaxTopK];
    for (int k = 0; k < K; ++k) {  // stable insertion sort of the slots by expert id
        int q = k;
        while (q > 0 && sel[t * K + order[q - 1]] > sel[t * K + k]) {
            order[q] = order[q - 1];
            --q;
        }
        order[q] = k;
    }
    float y = 0.0f;
    for (int k = 0; k < K; ++k) y += ye[(t * K + order[k]) * D + c];
    out[i] = round_bf16(y + shared[i]);
}

}  // namespace

void route(const float* logits, int64_t T, int E, int K, int score_func, const float* bias, const int64_t* tid2eid,
           const int32_t* ids, int route_norm, float route_scale, bool balanced, int32_t* sel, float* wsel) {
    if (T == 0) return;
    if (E > kMaxExperts || K > kMaxTopK)
        cuda_fail(cudaErrorInvalidValue, "route: too many experts", __FILE__, __LINE__);
    launch_pdl(route_kernel, dim3(blocks_for(T, 64)), dim3(64), 0, logits, T, E, K, score_func, bias, tid2eid, ids,
               route_norm, route_scale, balanced, sel, wsel);
}

void route_fast(const float* logits, int64_t T, int E, int K, int score_func, const float* bias,
                const int64_t* tid2eid, const int32_t* ids, int route_norm, float route_scale, bool balanced,
                int32_t* sel, float* wsel) {
    if (T == 0) return;
    if (E > kMaxExperts || K > kMaxTopK)
        cuda_fail(cudaErrorInvalidValue, "route: too many experts", __FILE__, __LINE__);
    if (T > 0x7fffffff) cuda_fail(cudaErrorInvalidValue, "route: too many tokens", __FILE__, __LINE__);
    launch_pdl(route_fast_kernel, dim3(static_cast<unsigned>(T)), dim3(kRouteThreads), 0, logits, T, E, K, score_func,
               bias, tid2eid, ids, route_norm, route_scale, balanced, sel, wsel);
}

void gather_pairs(const float* x, int64_t T, int K, int D, float* xp) {
    if (T == 0) return;
    launch_pdl(gather_pairs_kernel, dim3(blocks_for(T * K * D)), dim3(kThreads), 0, x, T, K, D, xp);
}

void swiglu(const float* g, const float* u, int64_t n, int I, const float* weights, float limit, float* out) {
    if (n == 0) return;
    launch_pdl(swiglu_kernel, dim3(blocks_for(n * I)), dim3(kThreads), 0, g, u, n, I, weights, limit, out);
}

void moe_combine(const float* ye, const int32_t* sel, const float* shared, int64_t T, int K, int D, float* out) {
    if (T == 0) return;
    launch_pdl(combine_kernel, dim3(blocks_for(T * D)), dim3(kThreads), 0, ye, sel, shared, T, K, D, out);
}

}  // namespace peregrine::cuda
