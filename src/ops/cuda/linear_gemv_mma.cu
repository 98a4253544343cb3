// Decode GEMV on the tensor cores for the e4m3-family formats (FP8 weights, and FP4 re-encoded exactly as
// e4m3 x 2^-6): y[m, n] = sum_k w[n, k] x[m, k] with mma.sync m16n8k32 e4m3 x e4m3 -> f32, the weight's 16
// rows as the A operand and up to 8 activation rows (a dense row tile or a routed expert tile) as B.
// One mma covers one 32-wide k block, in which the weight scale (FP4: per 32 values; FP8: per 32/128 tile)
// and the activation scale (per act_block, a multiple of 32) are constant, so the block's sum is scaled by
// their power-of-two product and added in fp32: the quantisation points are the reference's, only the fp32
// summation order (and the tensor core's within a block) differs, before the same bf16 rounding.
//
// Pipeline: a warp owns 16 weight rows at a time and streams them through a ring of kStages stages of 64
// bytes per row in shared memory (cp.async, 16 bytes per copy, rows padded against bank conflicts); a block
// walks several 128-row groups and the ring runs across group boundaries. Activations of the block's rows
// and K slice are staged once as e4m3 bytes (exact: act_quant's values) with their scales. A K split (few
// output rows) is reduced by the last slice to finish, in slice order.
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/gemv_common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "util/error.h"

#include <algorithm>
#include <cstdint>

namespace peregrine::cuda {

namespace {

constexpr int kFP8 = 2, kFP4 = 3;
constexpr int kWarps = 8, kMmaThreads = kWarps * 32, kGroupRows = 16, kBlockRows = kWarps * kGroupRows;
constexpr int kCols = 8;          // activation rows per tile (the mma's n)
constexpr int kRowBytes = 64;     // bytes of a weight row per pipeline stage
constexpr int kStages = 6;  // 5 stages (5 KB per warp) in flight while one is consumed
constexpr int kActBudget = 128 * 1024;  // staged activations + scales of a block's K slice

// Bytes between rows of a stage: a multiple of 16 (cp.async) chosen so that the A-fragment loads of a warp
// (FP4: 4 bytes at row g, column 4t; FP8: 8 bytes at row g, column 8t) hit distinct banks.
template <int F>
__host__ __device__ constexpr int row_stride() {
    return F == kFP4 ? 80 : 96;
}
template <int F>
__host__ __device__ constexpr int stage_bytes() {
    return kGroupRows * row_stride<F>();
}
template <int F>
__host__ __device__ constexpr int ring_bytes() {
    return kWarps * kStages * stage_bytes<F>();
}
// 32-wide k blocks per stage, and staged bytes per k block (8 rows of 32 e4m3 bytes, 8 fp32 scales).
template <int F>
__host__ __device__ constexpr int blocks_per_stage() {
    return F == kFP4 ? 4 : 2;
}
constexpr int kActBlockBytes = kCols * 32 + kCols * 4;

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f), "f"(0.0f), "f"(0.0f), "f"(0.0f));
}

__device__ __forceinline__ uint32_t e4m3x4(float4 v) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v.x, v.y), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v.z, v.w), __NV_SATFINITE, __NV_E4M3);
    return lo | (hi << 16);
}

// Lane (g, t) = (lane / 4, lane % 4) supplies, for every k block, the physical values 8t..8t+7 of weight
// rows g and g+8 (A registers 0/2 and 1/3) and of activation row g (B registers 0 and 1); the mma's k order
// is a permutation of the block's, the same for A and B, so the block sum is unchanged. Its D values are
// weight rows g, g+8 x activation rows 2t, 2t+1.
template <int F>
__global__ void __launch_bounds__(kMmaThreads)
    gemv_mma_kernel(const float* x, const float* xs, int64_t M, LinearDev w, float* y, float* partial,
                    unsigned* counters, int splits, int mtiles, int gpb, int per, ExpertTable experts,
                    const int32_t* row_map, const int4* tiles, const int32_t* n_tiles) {
    constexpr int RS = row_stride<F>(), SB = stage_bytes<F>(), BPS = blocks_per_stage<F>();
    extern __shared__ float4 smem4[];
    uint8_t* act = reinterpret_cast<uint8_t*>(smem4);                      // [kb][8 rows][32] e4m3
    float* ascale = reinterpret_cast<float*>(act + per * BPS * kCols * 32);  // [kb][8 rows]
    uint8_t* ring = reinterpret_cast<uint8_t*>(ascale + per * BPS * kCols);
    __shared__ int64_t row_s[kCols];
    __shared__ bool last_s;

    const int N = w.out, K = w.in;
    const int groups = (N + kBlockRows - 1) / kBlockRows, nblk = (groups + gpb - 1) / gpb;
    int bx = static_cast<int>(blockIdx.x);
    const int mt = bx % mtiles;
    bx /= mtiles;
    const int split = bx % splits;
    const int nbk = bx / splits;
    const int g0 = nbk * gpb, g1 = min(groups, g0 + gpb);
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
        m0 = static_cast<int64_t>(mt) * kCols;
        rows = static_cast<int>(min(static_cast<int64_t>(kCols), M - m0));
    }
    const int64_t row_bytes = F == kFP4 ? K / 2 : K;
    const int all_stages = static_cast<int>(row_bytes / kRowBytes);
    const int st0 = split * per, S = min(all_stages, st0 + per) - st0;  // > 0: no empty slice is launched
    const int steps = (g1 - g0) * S;
    const int kb0 = st0 * BPS;  // first k block of the slice

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint8_t* my_ring = ring + warp * kStages * SB;
    const uint8_t* wbase = static_cast<const uint8_t*>(wb) + static_cast<int64_t>(st0) * kRowBytes;
    // Step s: the warp's 16 rows of group g0 + s / S, stage s % S of the slice; lane copies 16-byte pieces
    // lane and lane + 32 (row piece / 4, segment piece % 4). One commit group per step, empty or not.
    auto issue = [&](int s) {
        if (s < steps) {
            const int gi = s / S, st = s - gi * S;
            const int r0 = (g0 + gi) * kBlockRows + warp * kGroupRows;
            uint8_t* stage = my_ring + (s % kStages) * SB;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int p = lane + 32 * i, r = p >> 2, seg = p & 3;
                cp_async16(stage + r * RS + seg * 16, wbase + static_cast<int64_t>(min(r0 + r, N - 1)) * row_bytes +
                                                          st * kRowBytes + seg * 16);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s);

    if (threadIdx.x < kCols)
        row_s[threadIdx.x] =
            static_cast<int>(threadIdx.x) < rows ? (row_map ? row_map[m0 + threadIdx.x] : m0 + threadIdx.x) : 0;
    __syncthreads();

    // Stage the slice's activations as e4m3 bytes and their scales; the tile's rows first, loads issued
    // kBatch at a time (they come from L2), then zeros for the rows past the tile.
    const int KB = S * BPS, ab = w.act_block, quads = rows * KB * 8;
    constexpr int kBatch = 4;
    for (int u0 = threadIdx.x; u0 < quads; u0 += kBatch * kMmaThreads) {
        float4 v[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
            const int u = u0 + i * kMmaThreads;
            if (u < quads) {
                const int m = u / (KB * 8), kq = u - m * (KB * 8);  // kq = kb * 8 + quad: 4 values each
                v[i] = *reinterpret_cast<const float4*>(x + row_s[m] * K + static_cast<int64_t>(kb0) * 32 + kq * 4);
            }
        }
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
            const int u = u0 + i * kMmaThreads;
            if (u < quads) {
                const int m = u / (KB * 8), kq = u - m * (KB * 8);
                *reinterpret_cast<uint32_t*>(act + (kq >> 3) * (kCols * 32) + m * 32 + (kq & 7) * 4) = e4m3x4(v[i]);
            }
        }
    }
    for (int u = threadIdx.x; u < (kCols - rows) * KB * 8; u += kMmaThreads) {
        const int m = rows + u / (KB * 8), kq = u % (KB * 8);
        *reinterpret_cast<uint32_t*>(act + (kq >> 3) * (kCols * 32) + m * 32 + (kq & 7) * 4) = 0u;
    }
    for (int u0 = threadIdx.x; u0 < kCols * KB; u0 += kBatch * kMmaThreads) {
        float sc[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
            const int u = u0 + i * kMmaThreads, m = u / KB;
            sc[i] = u < kCols * KB && m < rows ? xs[row_s[m] * (K / ab) + (kb0 + u - m * KB) * 32 / ab] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
            const int u = u0 + i * kMmaThreads, m = u / KB;
            if (u < kCols * KB) ascale[(u - m * KB) * kCols + m] = sc[i];
        }
    }
    __syncthreads();

    const int wblk = F == kFP8 ? w.weight_block : 32, nkb = (K + wblk - 1) / wblk;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < steps; ++s) {
        cp_async_wait<kStages - 2>();  // this lane's copies of step s have landed
        __syncwarp();                  // and every lane's (the ring is shared by the warp)
        const int gi = s / S, st = s - gi * S;
        const int r0 = (g0 + gi) * kBlockRows + warp * kGroupRows;
        const uint8_t* stage = my_ring + (s % kStages) * SB;
        // Weight scales of rows g and g+8 for the stage's k blocks (requested first: they come from L1/L2).
        const int n_lo = min(r0 + g, N - 1), n_hi = min(r0 + g + 8, N - 1);
        float ws[BPS][2];
#pragma unroll
        for (int j = 0; j < BPS; ++j) {
            const int kbg = kb0 + st * BPS + j;
            if constexpr (F == kFP4) {
                ws[j][0] = e8m0_to_f32(__ldg(sb + static_cast<int64_t>(n_lo) * (K / 32) + kbg)) * 64.0f;
                ws[j][1] = e8m0_to_f32(__ldg(sb + static_cast<int64_t>(n_hi) * (K / 32) + kbg)) * 64.0f;
            } else {
                const int kq = kbg * 32 / wblk;
                ws[j][0] = e8m0_to_f32(__ldg(sb + static_cast<int64_t>(n_lo / wblk) * nkb + kq));
                ws[j][1] = e8m0_to_f32(__ldg(sb + static_cast<int64_t>(n_hi / wblk) * nkb + kq));
            }
        }
        uint32_t a[BPS][4];
#pragma unroll
        for (int j = 0; j < BPS; ++j) {
            if constexpr (F == kFP4) {
                const uint32_t lo = *reinterpret_cast<const uint32_t*>(stage + g * RS + j * 16 + 4 * t);
                const uint32_t hi = *reinterpret_cast<const uint32_t*>(stage + (g + 8) * RS + j * 16 + 4 * t);
                fp4x8_to_e4m3(lo, a[j][0], a[j][2]);
                fp4x8_to_e4m3(hi, a[j][1], a[j][3]);
            } else {
                const uint2 lo = *reinterpret_cast<const uint2*>(stage + g * RS + j * 32 + 8 * t);
                const uint2 hi = *reinterpret_cast<const uint2*>(stage + (g + 8) * RS + j * 32 + 8 * t);
                a[j][0] = lo.x;
                a[j][2] = lo.y;
                a[j][1] = hi.x;
                a[j][3] = hi.y;
            }
        }
        __syncwarp();            // every lane has read the slot of step s - 1 ...
        issue(s + kStages - 1);  // ... which this refills
#pragma unroll
        for (int j = 0; j < BPS; ++j) {
            const int kbl = st * BPS + j;
            const uint2 b = *reinterpret_cast<const uint2*>(act + kbl * (kCols * 32) + g * 32 + 8 * t);
            const float2 as = *reinterpret_cast<const float2*>(ascale + kbl * kCols + 2 * t);
            const float ws_lo = ws[j][0], ws_hi = ws[j][1];
            float d[4];
            mma_e4m3(d, a[j], b.x, b.y);
            acc[0] = __fmaf_rn(d[0], ws_lo * as.x, acc[0]);
            acc[1] = __fmaf_rn(d[1], ws_lo * as.y, acc[1]);
            acc[2] = __fmaf_rn(d[2], ws_hi * as.x, acc[2]);
            acc[3] = __fmaf_rn(d[3], ws_hi * as.y, acc[3]);
        }
        if (st == S - 1) {  // the group's last stage: write this lane's four outputs, restart
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int n = r0 + g + (i >> 1) * 8, m = 2 * t + (i & 1);
                if (m < rows && n < N) {
                    const int64_t idx = row_s[m] * N + n;
                    if (splits > 1) partial[static_cast<int64_t>(split) * M * N + idx] = acc[i];
                    else y[idx] = round_bf16(acc[i]);
                }
                acc[i] = 0.0f;
            }
        }
    }
    cp_async_wait<0>();
    if (splits == 1) return;

    // K split: the last of the slices of these outputs to finish sums them in slice order.
    __threadfence();
    __syncthreads();
    const int64_t ticket = (static_cast<int64_t>(blockIdx.y) * mtiles + mt) * nblk + nbk;
    if (threadIdx.x == 0) last_s = atomicAdd(counters + ticket, 1u) == static_cast<unsigned>(splits - 1);
    __syncthreads();
    if (!last_s) return;
    __threadfence();
    const int n0 = g0 * kBlockRows, width = min(N, g1 * kBlockRows) - n0;
    for (int i = threadIdx.x; i < rows * width; i += kMmaThreads) {
        const int m = i / width;
        const int64_t o = row_s[m] * N + n0 + (i - m * width);
        float v = __ldcg(partial + o);
        for (int k = 1; k < splits; ++k) v += __ldcg(partial + static_cast<int64_t>(k) * M * N + o);
        y[o] = round_bf16(v);
    }
    if (threadIdx.x == 0) counters[ticket] = 0;  // ready for the next call
}

template <int F>
void launch(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y, const ExpertTable* experts,
            const LinearRouting* routing) {
    constexpr int BPS = blocks_per_stage<F>();
    const int N = w.out, groups = (N + kBlockRows - 1) / kBlockRows;
    const int64_t row_bytes = F == kFP4 ? w.in / 2 : w.in;
    const int all_stages = static_cast<int>(row_bytes / kRowBytes);
    const int mtiles = routing ? 1 : static_cast<int>((M + kCols - 1) / kCols);
    const int64_t tiles = routing ? std::min<int64_t>(routing->max_tiles, M) : 1;
    if (tiles > 65535) fail("linear_gemv: {} routed tiles exceed the grid limit", tiles);
    const int stage_act = BPS * kActBlockBytes;  // staged activation bytes per stage of K
    const int max_stages_smem = kActBudget / stage_act;
    const int min_splits = (all_stages + max_stages_smem - 1) / max_stages_smem;
    // Aim for ~4 blocks per SM: several groups per block over whole K slices when there are many (tile,
    // group) pairs; otherwise a group per block and a K split (slices of at least 4 stages).
    const int64_t base = static_cast<int64_t>(mtiles) * tiles, want = 4 * static_cast<int64_t>(sm_count());
    int splits, gpb;
    if (base * groups >= want) {
        splits = min_splits;
        const int64_t nblk = std::clamp<int64_t>((want + base * splits - 1) / (base * splits), 1, groups);
        gpb = static_cast<int>((groups + nblk - 1) / nblk);
    } else {
        gpb = 1;
        const int64_t wanted = (want + base * groups - 1) / (base * groups);
        const int max_splits = std::max(min_splits, std::min(all_stages / 4, 32));
        splits = static_cast<int>(std::clamp<int64_t>(wanted, min_splits, std::max(1, max_splits)));
    }
    const int per = (all_stages + splits - 1) / splits;
    splits = (all_stages + per - 1) / per;
    const int nblk = (groups + gpb - 1) / gpb;
    const size_t smem = static_cast<size_t>(per) * stage_act + ring_bytes<F>();
    smem_opt_in<gemv_mma_kernel<F>>(kActBudget + ring_bytes<F>());

    float* partial = nullptr;
    unsigned* counters = nullptr;
    const int64_t gx = static_cast<int64_t>(nblk) * splits * mtiles;
    if (gx > 0x7fffffff) fail("linear_gemv: grid of {} blocks is too large", gx);
    if (splits > 1) {
        partial = static_cast<float*>(gemv_scratch(0, sizeof(float) * static_cast<size_t>(splits) * M * N, false));
        counters = static_cast<unsigned*>(
            gemv_scratch(1, sizeof(unsigned) * static_cast<size_t>(tiles) * mtiles * nblk, true));
    }
    dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(tiles));
    gemv_mma_kernel<F><<<grid, kMmaThreads, smem>>>(
        x, xs, M, w, y, partial, counters, splits, mtiles, gpb, per, experts ? *experts : ExpertTable{},
        routing ? routing->row_map : nullptr, routing ? reinterpret_cast<const int4*>(routing->tiles) : nullptr,
        routing ? routing->n_tiles : nullptr);
    PG_LAUNCHED();
}

}  // namespace

bool linear_gemv_mma_supported(const LinearDev& w) {
    if (w.kind != kFP8 && w.kind != kFP4) return false;
    if (w.out <= 0 || w.in <= 0 || w.act_block <= 0 || w.act_block % 32 != 0 || w.in % w.act_block != 0) return false;
    if (reinterpret_cast<uintptr_t>(w.w) % 16 != 0) return false;
    const int64_t row_bytes = w.kind == kFP4 ? w.in / 2 : w.in;
    if (w.in % 32 != 0 || row_bytes % kRowBytes != 0) return false;
    return w.kind == kFP4 || (w.weight_block % 32 == 0 && w.act_block == w.weight_block);
}

void linear_gemv_mma(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y,
                     const ExpertTable* experts, const LinearRouting* routing) {
    if (M == 0 || w.out == 0) return;
    if (!linear_gemv_mma_supported(w)) fail("linear_gemv_mma: unsupported linear (kind {}, in {})", w.kind, w.in);
    if (reinterpret_cast<uintptr_t>(x) % 16 != 0) fail("linear_gemv_mma: activations must be 16-byte aligned");
    if (routing && routing->tile_rows > kCols) fail("linear_gemv_mma: routed tiles of {} rows", routing->tile_rows);
    if (w.kind == kFP4) launch<kFP4>(x, xs, M, w, y, experts, routing);
    else launch<kFP8>(x, xs, M, w, y, experts, routing);
}

}  // namespace peregrine::cuda
