// Tiled GEMM for every checkpoint format with the reference's exact numerics: a block computes an MT x NT
// output tile; each 32-wide K step stages the decoded weights and activations in shared memory, each
// thread sums its outputs' products in double (exact block sums) and folds every finished scale block into
// its fp32 accumulator in K order, exactly as cpu/linear.cpp. Routed (MoE) GEMMs run over tiles of rows
// grouped by expert, so each expert's weights are read once per tile.
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/pdl.cuh"

#include <algorithm>

namespace peregrine::cuda {

namespace {

constexpr int kTileThreads = 256, kKStep = 32;

__device__ __forceinline__ float weight_value(const LinearDev& w, const void* base, int64_t n, int k) {
    const int K = w.in;
    switch (w.kind) {
        case 0: return param_at(base, w.w_bf16, n * K + k);
        case 1: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[n * K + k]);
        case 2: return e4m3_to_f32(static_cast<const uint8_t*>(base)[n * K + k]);
        default: {
            const uint8_t byte = static_cast<const uint8_t*>(base)[n * (K / 2) + k / 2];
            return e2m1_to_f32((k & 1) ? (byte >> 4) : (byte & 0xf));
        }
    }
}

template <int MT, int NT>
__global__ void __launch_bounds__(kTileThreads) linear_tiled_kernel(const float* x, const float* xs, int64_t M,
                                                                    LinearDev w, float* y, ExpertTable experts,
                                                                    const int32_t* row_map, const int4* tiles,
                                                                    const int32_t* n_tiles) {
    pdl_enter();
    constexpr int OUT = MT * NT / kTileThreads;
    __shared__ float w_s[NT][kKStep + 1];
    __shared__ float a_s[MT][kKStep + 1];
    __shared__ int64_t row_s[MT];
    const int N = w.out, K = w.in;
    int64_t m0;
    int rows;
    const void* wb = w.w;
    const uint8_t* sb = w.scale;
    if (tiles) {
        if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
        const int4 t = tiles[blockIdx.y];
        wb = experts.w[t.x];
        sb = experts.scale[t.x];
        m0 = t.y;
        rows = t.z;
    } else {
        m0 = static_cast<int64_t>(blockIdx.y) * MT;
        rows = static_cast<int>(min(static_cast<int64_t>(MT), M - m0));
    }
    const int n0 = blockIdx.x * NT;
    if (threadIdx.x < MT)
        row_s[threadIdx.x] =
            static_cast<int>(threadIdx.x) < rows ? (row_map ? row_map[m0 + threadIdx.x] : m0 + threadIdx.x) : -1;
    // Scale block along K: FP8 weight tiles, FP4 groups of 32; none (whole row) for F32/BF16.
    const int blk = w.kind == 2 ? w.weight_block : w.kind == 3 ? 32 : K;
    const int ab = w.act_block > 0 ? w.act_block : 1;
    float acc[OUT];
    double part[OUT];
#pragma unroll
    for (int i = 0; i < OUT; ++i) {
        acc[i] = 0.0f;
        part[i] = 0.0;
    }
    for (int k0 = 0; k0 < K; k0 += kKStep) {
        __syncthreads();
        for (int e = threadIdx.x; e < NT * kKStep; e += kTileThreads) {
            const int c = e / kKStep, kk = e % kKStep, n = n0 + c;
            w_s[c][kk] = n < N ? weight_value(w, wb, n, k0 + kk) : 0.0f;
        }
        for (int e = threadIdx.x; e < MT * kKStep; e += kTileThreads) {
            const int r = e / kKStep, kk = e % kKStep;
            const int64_t m = row_s[r];
            a_s[r][kk] = m >= 0 ? x[m * K + k0 + kk] : 0.0f;
        }
        __syncthreads();
        const bool flush = w.kind >= 2 && (k0 + kKStep) % blk == 0;
        const int kb = (k0 + kKStep - blk) / blk;  // the scale block that ends here (when flushing)
#pragma unroll
        for (int i = 0; i < OUT; ++i) {
            const int o = threadIdx.x + i * kTileThreads, r = o / NT, c = o % NT;
            if (r >= rows || n0 + c >= N) continue;
            double s = 0.0;
#pragma unroll 8
            for (int kk = 0; kk < kKStep; ++kk) s += static_cast<double>(a_s[r][kk]) * static_cast<double>(w_s[c][kk]);
            part[i] += s;
            if (flush) {
                const int64_t n = n0 + c, m = row_s[r];
                const float ws = w.kind == 2 ? e8m0_to_f32(sb[(n / blk) * ((K + blk - 1) / blk) + kb])
                                             : e8m0_to_f32(sb[n * (K / 32) + kb]);
                acc[i] += static_cast<float>(part[i]) * xs[m * (K / ab) + static_cast<int64_t>(kb) * blk / ab] * ws;
                part[i] = 0.0;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < OUT; ++i) {
        const int o = threadIdx.x + i * kTileThreads, r = o / NT, c = o % NT;
        if (r >= rows || n0 + c >= N) continue;
        const int64_t m = row_s[r];
        float out;
        if (w.kind == 0) out = static_cast<float>(part[i]);
        else if (w.kind == 1) out = round_bf16(static_cast<float>(part[i]));
        else out = round_bf16(acc[i]);
        y[m * N + n0 + c] = out;
    }
}

// Counting sort of the (row, slot) pairs by expert (stable), and tiles of at most mt rows per expert. The pairs
// are cut into `segs` consecutive segments, one per warp: each warp counts its segment's pairs per expert, a
// prefix over the segments gives each warp its first slot per expert, and each warp then places its pairs in
// order (lanes with the same expert take consecutive slots in lane order). Shared memory: E * (segs + 1) ints.
__global__ void expert_tiles_kernel(const int32_t* sel, int64_t n, int E, int mt, int segs, int32_t* row_map,
                                    int4* tiles, int32_t* n_tiles) {
    pdl_enter();
    extern __shared__ int32_t count[];  // [E]: pairs per expert, then the expert's first slot
    int32_t* seg = count + E;            // [segs][E]: the segment's pairs per expert, then its next slot
    for (int i = threadIdx.x; i < E * (segs + 1); i += blockDim.x) count[i] = 0;
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t per = (n + segs - 1) / segs, lo = warp * per, hi = min(n, lo + per);
    if (warp < segs)
        for (int64_t i = lo + lane; i < hi; i += 32) atomicAdd(&seg[warp * E + sel[i]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int run = 0;
        for (int w = 0; w < segs; ++w) {
            const int c = seg[w * E + e];
            seg[w * E + e] = run;
            run += c;
        }
        count[e] = run;
    }
    __syncthreads();
    // Each expert's first slot and first tile: an exclusive scan of (pairs, tiles) over the experts, a block of
    // experts at a time (with one thread walking the experts the kernel took 27 us at 384).
    __shared__ int2 warp_sums[32];
    __shared__ int2 carry;
    const int nwarps = static_cast<int>(blockDim.x) >> 5;
    if (threadIdx.x == 0) carry = make_int2(0, 0);
    for (int e0 = 0; e0 < E; e0 += blockDim.x) {
        const int e = e0 + static_cast<int>(threadIdx.x);
        const int c = e < E ? count[e] : 0, t = (c + mt - 1) / mt;
        int2 v = make_int2(c, t);
        for (int o = 1; o < 32; o <<= 1) {
            const int a = __shfl_up_sync(0xffffffffu, v.x, o), b = __shfl_up_sync(0xffffffffu, v.y, o);
            if (lane >= o) v.x += a, v.y += b;
        }
        if (lane == 31) warp_sums[warp] = v;
        __syncthreads();  // also orders carry's initialisation or last update before its reads
        if (warp == 0) {
            int2 u = lane < nwarps ? warp_sums[lane] : make_int2(0, 0);
            for (int o = 1; o < 32; o <<= 1) {
                const int a = __shfl_up_sync(0xffffffffu, u.x, o), b = __shfl_up_sync(0xffffffffu, u.y, o);
                if (lane >= o) u.x += a, u.y += b;
            }
            if (lane < nwarps) warp_sums[lane] = u;
        }
        __syncthreads();
        const int2 before = warp > 0 ? warp_sums[warp - 1] : make_int2(0, 0);
        const int off = carry.x + before.x + v.x - c, first = carry.y + before.y + v.y - t;
        if (e < E) {
            for (int r = 0; r < c; r += mt) tiles[first + r / mt] = make_int4(e, off + r, min(mt, c - r), 0);
            count[e] = off;
        }
        const int2 total = warp_sums[nwarps - 1];
        __syncthreads();
        if (threadIdx.x == 0) carry = make_int2(carry.x + total.x, carry.y + total.y);
    }
    __syncthreads();
    if (threadIdx.x == 0) *n_tiles = carry.y;
    if (warp >= segs) return;
    int32_t* next = seg + warp * E;
    for (int64_t b = lo; b < hi; b += 32) {  // warp-uniform trip count
        const int64_t i = b + lane;
        const bool ok = i < hi;
        const int e = ok ? sel[i] : -1;
        const unsigned peers = __match_any_sync(0xffffffffu, e);
        const unsigned lower = peers & ((1u << lane) - 1u);
        if (ok) row_map[count[e] + next[e] + __popc(lower)] = static_cast<int32_t>(i);
        __syncwarp();
        if (ok && lower == 0) next[e] += __popc(peers);
        __syncwarp();
    }
}

template <int MT, int NT>
void launch(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y, const ExpertTable* experts,
            const LinearRouting* routing) {
    dim3 grid((w.out + NT - 1) / NT, routing ? routing->max_tiles : static_cast<unsigned>((M + MT - 1) / MT));
    launch_pdl(linear_tiled_kernel<MT, NT>, grid, dim3(kTileThreads), 0, x, xs, M, w, y,
               experts ? *experts : ExpertTable{}, routing ? routing->row_map : nullptr,
               routing ? reinterpret_cast<const int4*>(routing->tiles) : nullptr, routing ? routing->n_tiles : nullptr);
}

}  // namespace

bool linear_tiled_supported(const LinearDev& w) {
    if (w.in % kKStep != 0) return false;
    if (w.kind == 2 &&
        (w.weight_block % kKStep != 0 || w.act_block % w.weight_block != 0 && w.weight_block % w.act_block != 0))
        return false;
    if (w.kind == 3 && w.act_block % 32 != 0) return false;
    return true;
}

int routing_tile_rows(int64_t pairs, int E) { return pairs <= static_cast<int64_t>(8) * E ? 8 : 32; }

void expert_tiles(const int32_t* sel, int64_t n, int E, int mt, int32_t* row_map, int32_t* tiles, int32_t* n_tiles) {
    // As many segments (warps) as 46 KB of shared memory holds (the 48 KB a launch may ask for without opting in,
    // less the kernel's static scan scratch), at least 64 pairs each.
    const int segs = static_cast<int>(
        std::clamp<int64_t>(std::min<int64_t>((46 * 1024 / 4) / std::max(E, 1) - 1, (n + 63) / 64), 1, 32));
    launch_pdl(expert_tiles_kernel, dim3(1), dim3(1024), sizeof(int32_t) * E * (segs + 1), sel, n, E, mt, segs, row_map,
               reinterpret_cast<int4*>(tiles), n_tiles);
}

void linear_tiled(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y, const ExpertTable* experts,
                  const LinearRouting* routing) {
    if (M == 0 || w.out == 0) return;
    const int mt = routing ? routing->tile_rows : (M <= 8 ? 8 : 32);
    if (mt == 8) launch<8, 128>(x, xs, M, w, y, experts, routing);
    else launch<32, 64>(x, xs, M, w, y, experts, routing);
}

}  // namespace peregrine::cuda
