// Decode GEMV streaming weights at HBM bandwidth on the tensor cores (the streaming GemvKernels of linear_gemv):
// FP8 (e4m3, ue8m0 tiles of 32/64/128), FP4 (e2m1, ue8m0 per 32) and BF16 weights whose activations are bf16
// values (LinearDev::bf16_acts; F32 linears on bf16 weights too, their outputs left in fp32). 16 weight rows are
// the mma's A and up to 8 activation rows its B; each 32-value k block is two f16 mma.sync m16n8k16 whose fp32
// sum is scaled by the block's power-of-two weight scale and added in fp32 (the activation scales are folded into
// the staged values, see fold; bf16: one m16n8k16 per 16 values, no scales); the output is rounded to bf16.
// Hopper has no e4m3 mma.sync: the compiler would unpack both operands to f16 on the conversion pipe (16 lanes a
// clock), which bounded FP4 at ~1.4 TB/s. So the activations are staged once as
// f16 (e4m3 values are exact in f16), FP8 weights are unpacked to f16 once per fragment, and FP4 weights are
// bit-placed into f16 on the integer pipe (fp4x8_to_f16). Products are exact and sums fp32, as before.
// What the kernels differ in is how the bytes arrive:
//
// - Each warp streams its 16 rows through a ring of ST stages of CH bytes per row (CH = 128 or 256: whole
//   128-byte lines per row and 2 or 4 rows per warp-wide copy), (ST - 1) x 16 x CH bytes in flight per warp,
//   NW = 8 or 12 warps per CTA: 48-96 KB per SM in flight (Little's law at ~4 TB/s over 132 SMs needs ~30 KB).
// - The weight scales of a stage come through the same ring (4-byte cp.async, issued with the stage's weights),
//   so no load waits on global memory inside the loop.
// - The work split (K slices x groups of NW x 16 rows per CTA) is chosen by a small cost model over whole waves, so
//   that the last wave is full (routed calls: the expert tiles times the row groups).
// - The activations may come unquantised (xs == nullptr): each CTA then quantises the blocks of its K slice
//   itself, with act_quant's arithmetic (same amax, same ue8m0 scale, same e4m3 rounding), so the staged bytes
//   and therefore the outputs are those of act_quant followed by this kernel, and one launch disappears.
// - Dense calls of 3+ rows stage them once instead (act_image_kernel), which every CTA copies with cp.async
//   beside its first weight stages: converting 16-32 rows in every CTA took as long as its weights at 32 rows
//   (FP8 linears at 400-700 GB/s).
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/fp4_f16.h"
#include "ops/cuda/gemv_common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/pdl.cuh"
#include "util/error.h"
#include "util/switches.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

namespace peregrine::cuda {

namespace {

constexpr int kBF16 = 1, kFP8 = 2, kFP4 = 3;
constexpr int kUnitRows = 16;  // weight rows per warp (an mma's A); a CTA of NW warps covers NW x 16 rows
constexpr int kCols = 8;                  // activation rows per mma (its n); a tile is MT of them
constexpr int kSmemMax = 225 * 1024;  // dynamic shared memory per block (sm_90 opt-in: 227 KB with the ~1.6 KB static)
constexpr int kStageLoads = 8;            // activation float4 loads in flight per thread while staging
constexpr int kMaxCtaTiles = 64;          // tiles whose units one CTA may take

// Geometry of a stage for format F and CH bytes per weight row.
template <int F, int CH>
struct Geo {
    static_assert(CH == 128 || CH == 256, "stage width");
    // Row stride in the ring: FP4 fragments are 4-byte reads of 8 rows (stride = 16 mod 128 spreads them over
    // the banks), FP8/BF16 8-byte reads of 4 rows per half warp (stride = 32 mod 128).
    static constexpr int RS = CH + (F == kFP4 ? 16 : 32);
    static constexpr int STEPS = F == kFP4 ? CH / 16 : CH / 32;  // mma k steps per stage
    static constexpr int SC = F == kFP4 ? kUnitRows * STEPS : F == kFP8 ? 16 : 0;  // scale bytes per slot
    static constexpr int SLOT = kUnitRows * RS + SC;
    static constexpr int STEP_VALUES = F == kBF16 ? 16 : 32;   // k values per mma step
    static constexpr int STEP_W_BYTES = F == kFP4 ? 16 : 32;   // weight bytes per row per mma step
    static_assert(SLOT % 16 == 0, "cp.async destinations must stay 16-byte aligned");
};

// Two e4m3 bytes (the low ones of v) as an f16 pair (exact).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// 2^k as an f16 pair, k <= 15 (subnormal from -15 down to -24, zero below).
__device__ __forceinline__ __half2 pow2_h2(int k) {
    const uint32_t b = k >= -14 ? static_cast<uint32_t>(k + 15) << 10 : k >= -24 ? 1u << (k + 24) : 0u;
    const uint32_t bb = b | (b << 16);
    return *reinterpret_cast<const __half2*>(&bb);
}

__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
}

// f16 with the accumulator carried.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// bf16 with the accumulator carried (no scales to apply between blocks).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return lo | (hi << 16);
}
// Four floats as e4m3 (satfinite) and back as four f16 (their exact values).
__device__ __forceinline__ uint2 e4m3_f16x4(float a, float b, float c, float d) {
    const uint32_t q = e4m3x4(a, b, c, d);
    return make_uint2(e4m3x2_to_f16x2(q), e4m3x2_to_f16x2(q >> 16));
}
__device__ __forceinline__ uint32_t bf16x2(float a, float b) {
    return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(a))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(b))) << 16);
}

struct StreamArgs {
    const float* x;   // [M, K] activations: e4m3 values (xs given), raw bf16 values (xs null, quantised here)
    const float* xs;  // [M, K / act_block] activation scales, or null
    int64_t M;
    LinearDev w;
    float* y;
    float* partial;  // [splits][M][N] K-split partial sums
    unsigned* counters;
    int splits, mtiles, gpb, per;  // per: stages per K slice
    bool persistent;               // CTAs share out every (tile, group) unit; splits == 1
    bool scale_words;              // scale rows may be copied 4 bytes at a time (alignment checked on the host)
    ExpertTable experts;
    const int32_t* row_map;
    const int4* tiles;
    const int32_t* n_tiles;
    const uint8_t* image;  // dense calls: the activations already staged (act_image_kernel), or null
    int64_t image_tile;    // bytes of the image per tile
    // Pairs (two linears of one input, same format and K): rows n1.. of the call are w2's, written to y2.
    // Otherwise n1 = w.out and y2 null. A routed pair's second expert table is experts2, its per-tile pointers kept
    // in dynamic shared memory at byte pair_tables (after the activations).
    LinearDev w2;
    float* y2;
    int n1;
    ExpertTable experts2;
    int pair_tables;
};

// Four f16 of values within..within+3 of a k step into its 64 bytes of one row (FP4: permuted).
template <int F>
__device__ __forceinline__ void store_act4(uint8_t* row64, int within, uint2 h) {
    if constexpr (F == kFP4) {
        uint16_t* r = reinterpret_cast<uint16_t*>(row64);
        r[fp4_act_pos(within)] = static_cast<uint16_t>(h.x);
        r[fp4_act_pos(within + 1)] = static_cast<uint16_t>(h.x >> 16);
        r[fp4_act_pos(within + 2)] = static_cast<uint16_t>(h.y);
        r[fp4_act_pos(within + 3)] = static_cast<uint16_t>(h.y >> 16);
    } else {
        *reinterpret_cast<uint2*>(row64 + within * 2) = h;
    }
}

// One quad (4 values) of an activation row as the stream kernel stages it: bf16 pairs (BF16), or e4m3 values as
// f16 with their block's scale, quantised here with act_quant's arithmetic when xs is null (amax over the block
// by shuffles: every lane of the warp calls this, the block's quads in consecutive lanes, aligned).
template <int F>
__device__ __forceinline__ uint2 stage_quad(float4 v, const float* xs, int64_t xs_index, int qpb, float& scale) {
    if constexpr (F == kBF16) {
        scale = 1.0f;
        return make_uint2(bf16x2(v.x, v.y), bf16x2(v.z, v.w));
    } else {
        if (xs) {
            scale = xs[xs_index];
            return e4m3_f16x4(v.x, v.y, v.z, v.w);
        }
        // act_quant: amax over the block, its scale, q = e4m3(x / s) (satfinite after the same clamp).
        const float s =
            act_quant_scale(group_amax(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))), qpb));
        scale = s;
        return e4m3_f16x4(act_quant_clamped(v.x, s), act_quant_clamped(v.y, s), act_quant_clamped(v.z, s),
                          act_quant_clamped(v.w, s));
    }
}

// The staged activations of a dense call written once to global memory, so that every CTA copies its slice
// (cp.async, beside its first weight stages) instead of converting it: per tile of TR rows, [k step][row][AB
// bytes] for all of K, then [k step][row] fp32 scales; rows past M zero. A thread per quad, a row's quads in
// whole warps (K % 128 == 0).
template <int F, int MT>
__global__ void act_image_kernel(const float* x, const float* xs, int64_t M, int K, int ab, int64_t quads,
                                 uint8_t* image) {
    constexpr int TR = kCols * MT, AB = F == kBF16 ? 32 : 64, STEP_VALUES = F == kBF16 ? 16 : 32;
    pdl_enter();
    const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= quads) return;  // whole warps
    const int qpr = K / 4, ks_all = K / STEP_VALUES;
    const int64_t m = g / qpr;
    const int kv = static_cast<int>(g - m * qpr) * 4, ks = kv / STEP_VALUES, within = kv % STEP_VALUES;
    const int r = static_cast<int>(m % TR);
    uint8_t* base = image + (m / TR) * static_cast<int64_t>(ks_all) * (TR * AB + TR * 4);
    const float4 v = m < M ? *reinterpret_cast<const float4*>(x + m * K + kv) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float s;
    uint2 h = stage_quad<F>(v, xs, m * (K / ab) + kv / ab, ab / 4, s);
    if (m >= M) h = make_uint2(0u, 0u), s = 0.0f;
    store_act4<F>(base + static_cast<int64_t>(ks) * TR * AB + r * AB, within, h);
    if (F != kBF16 && within == 0)
        reinterpret_cast<float*>(base + static_cast<int64_t>(ks_all) * TR * AB)[ks * TR + r] = s;
}

// Lane (g, t) = (lane / 4, lane % 4): for every mma step its A registers hold bytes [8t, 8t+8) (FP4: the
// 4 bytes [4t, 4t+4) = values 8t..8t+7) of weight rows g and g+8, its B registers the same k positions of
// activation row g; the mma's k order is a permutation of the step's, the same for A and B. D values: weight
// rows g, g+8 x activation rows 2t, 2t+1.
template <int F, int CH, int ST, int MINB, int MT, int NW>
__global__ void __launch_bounds__(NW * 32, MINB) gemv_stream_kernel(StreamArgs p) {
    using G = Geo<F, CH>;
    constexpr int NT = NW * 32, GR = NW * kUnitRows;  // threads; weight rows of a group (a unit's rows)
    constexpr int RS = G::RS, STEPS = G::STEPS, SLOT = G::SLOT;
    // Rows of a tile; staged activation bytes per row and k step (f16 x 32, bf16 x 16); per k step.
    constexpr int TR = kCols * MT, AB = F == kBF16 ? 32 : 64, STEP_ACT = TR * AB;
    extern __shared__ float4 smem4[];
    uint8_t* ring = reinterpret_cast<uint8_t*>(smem4);        // [warp][ST][SLOT]
    uint8_t* act = ring + NW * ST * SLOT;                  // [k step][rows][AB bytes]
    __shared__ int64_t row_s[TR];
    __shared__ int row_e[TR];  // FP8/FP4: the largest activation scale exponent of each tile row (fold)
    __shared__ const uint8_t* tile_w[kMaxCtaTiles];
    __shared__ const uint8_t* tile_sc[kMaxCtaTiles];
    __shared__ int tile_m0[kMaxCtaTiles], tile_rows[kMaxCtaTiles];
    __shared__ bool last_s;

    // Routed calls read the tile table the previous kernels wrote; dense ones stream their first weight stages
    // (never written during a step) before waiting (pdl.cuh).
    if (p.tiles) pdl_enter();
    const LinearDev& w = p.w;
    const int N = p.n1 + (p.y2 ? p.w2.out : 0), K = w.in;
    const bool routed_pair = p.tiles && p.y2;
    const uint8_t** tile_w2 =
        routed_pair ? reinterpret_cast<const uint8_t**>(reinterpret_cast<uint8_t*>(smem4) + p.pair_tables) : nullptr;
    const uint8_t** tile_sc2 = routed_pair ? tile_w2 + kMaxCtaTiles : nullptr;
    // Output (token row, call row n): y, or y2 for a pair's second linear.
    auto out_at = [&](int64_t row, int n) -> float* {
        return p.y2 && n >= p.n1 ? p.y2 + row * (N - p.n1) + (n - p.n1) : p.y + row * p.n1 + n;
    };
    const int groups = (N + GR - 1) / GR, nblk = (groups + p.gpb - 1) / p.gpb;
    // This CTA's units (tile-major: unit = tile * groups + group of GR rows; a tile is 8 activation rows:
    // dense rows 8 mt.., or a routed tile) and K slice. Persistent: an equal share of all units of the call
    // (their count known on the device only), the whole of K. Otherwise: gpb groups of one tile, slice `split`.
    int split = 0, mt = 0, nbk = 0, u_begin, u_end;
    if (p.persistent) {
        const int64_t units = static_cast<int64_t>(p.tiles ? *p.n_tiles : p.mtiles) * groups;
        u_begin = static_cast<int>(units * blockIdx.x / gridDim.x);
        u_end = static_cast<int>(units * (blockIdx.x + 1) / gridDim.x);
    } else {
        int bx = static_cast<int>(blockIdx.x);
        mt = bx % p.mtiles;
        bx /= p.mtiles;
        split = bx % p.splits;
        nbk = bx / p.splits;
        if (p.tiles && static_cast<int>(blockIdx.y) >= *p.n_tiles) return;
        const int tile = p.tiles ? static_cast<int>(blockIdx.y) : mt, g0 = nbk * p.gpb;
        u_begin = tile * groups + g0;
        u_end = tile * groups + min(groups, g0 + p.gpb);
    }
    if (u_begin >= u_end) return;
    // The tiles the units touch (at most kMaxCtaTiles: the host bounds the units per CTA).
    const int t_first = u_begin / groups, n_ct = (u_end - 1) / groups - t_first + 1;
    for (int i = threadIdx.x; i < n_ct; i += NT) {
        const int ti = t_first + i;
        if (p.tiles) {
            const int4 t = p.tiles[ti];
            tile_w[i] = static_cast<const uint8_t*>(p.experts.w[t.x]);
            tile_sc[i] = p.experts.scale[t.x];
            tile_m0[i] = t.y;
            tile_rows[i] = t.z;
            if (routed_pair) {
                tile_w2[i] = static_cast<const uint8_t*>(p.experts2.w[t.x]);
                tile_sc2[i] = p.experts2.scale[t.x];
            }
        } else {
            tile_w[i] = static_cast<const uint8_t*>(w.w);
            tile_sc[i] = w.scale;
            tile_m0[i] = ti * TR;
            tile_rows[i] = static_cast<int>(min(static_cast<int64_t>(TR), p.M - static_cast<int64_t>(ti) * TR));
        }
    }
    __syncthreads();
    const int64_t row_bytes = F == kFP4 ? K / 2 : F == kFP8 ? K : 2 * static_cast<int64_t>(K);
    const int all_stages = static_cast<int>((row_bytes + CH - 1) / CH);  // the last may be partial
    const int st0 = split * p.per, S = min(all_stages, st0 + p.per) - st0;  // > 0: no empty slice is launched
    const int steps = (u_end - u_begin) * S;
    const int k0 = st0 * (CH / G::STEP_W_BYTES) * G::STEP_VALUES;  // first k value of the slice
    const int slice_values = min(K - k0, S * (CH / G::STEP_W_BYTES) * G::STEP_VALUES);
    const int KS = slice_values / G::STEP_VALUES;                   // mma k steps in the slice

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint8_t* my_ring = ring + warp * ST * SLOT;
    const int wblk = F == kFP8 ? w.weight_block : 32;
    const int wshift = __ffs(wblk) - 1;                          // wblk is 32, 64 or 128
    const int nkb = F == kFP8 ? (K + wblk - 1) / wblk : K / 32;  // scale bytes per scale row

    // The copy side runs ST - 1 stages ahead of the mma side. Each call of issue() copies the warp's 16 rows of
    // one (unit, stage) into the next ring slot and advances; one commit group per call, empty or not, so that
    // wait_group counts stages. Its source pointers are derived once per unit (divisions stay out of the loop).
    constexpr int PIECES = CH / 16, PROWS = 32 / PIECES;  // 16-byte pieces per row; rows per warp-wide copy
    constexpr int WPR = F == kFP4 ? STEPS / 4 : 1, SROWS = 32 / WPR;  // FP4 scale words per row; rows per copy
    const int prow = lane / PIECES, pseg = lane % PIECES;
    int iss_u = u_begin, iss_st = 0, iss_slot = 0, iss_r0 = 0;
    bool iss_clamped = false;                 // rows past N read row N - 1 (results discarded)
    const uint8_t* iss_w = nullptr;           // this lane's first piece in stage 0 of the slice
    const uint8_t* iss_sb = nullptr;          // the unit's scale table
    const uint8_t* iss_sc = nullptr;          // FP4: this lane's first scale word at k block 0
    const uint8_t* iss_wb = nullptr;          // the rows' matrix (a pair's second from row n1 on) ...
    int iss_off = 0;                          // ... and its first row's index in the call
    const int64_t pstride = static_cast<int64_t>(PROWS) * row_bytes;
    auto iss_unit = [&]() {
        const int gi = iss_u / groups, ti = gi - t_first;
        iss_r0 = (iss_u - gi * groups) * GR + warp * kUnitRows;
        iss_clamped = iss_r0 + kUnitRows > N;
        const bool second = p.y2 && iss_r0 >= p.n1;  // n1 is a multiple of the group's rows (host)
        iss_off = second ? p.n1 : 0;
        iss_wb = second ? (routed_pair ? tile_w2[ti] : static_cast<const uint8_t*>(p.w2.w)) : tile_w[ti];
        iss_sb = second ? (routed_pair ? tile_sc2[ti] : p.w2.scale) : tile_sc[ti];
        iss_w = iss_wb + static_cast<int64_t>(min(iss_r0 + prow, N - 1) - iss_off) * row_bytes +
                static_cast<int64_t>(st0) * CH + pseg * 16;
        if constexpr (F == kFP4)
            iss_sc = iss_sb + static_cast<int64_t>(min(iss_r0 + lane / WPR, N - 1) - iss_off) * nkb + (lane % WPR) * 4;
    };
    if (iss_u < u_end) iss_unit();
    auto issue = [&]() {
        if (iss_u < u_end && iss_r0 < N) {
            uint8_t* slot = my_ring + iss_slot * SLOT;
            const int64_t boff = static_cast<int64_t>(st0 + iss_st) * CH;  // byte offset in the row
            const int vbytes = static_cast<int>(min(static_cast<int64_t>(CH), row_bytes - boff));
            const int64_t soff = static_cast<int64_t>(iss_st) * CH;       // from the slice's first stage
            if (pseg * 16 < vbytes) {
                if (!iss_clamped) {
#pragma unroll
                    for (int i = 0; i < kUnitRows / PROWS; ++i)
                        cp_async16(slot + (prow + i * PROWS) * RS + pseg * 16, iss_w + soff + i * pstride);
                } else {
                    const uint8_t* base = iss_wb + boff + pseg * 16;
#pragma unroll
                    for (int i = 0; i < kUnitRows / PROWS; ++i)
                        cp_async16(
                            slot + (prow + i * PROWS) * RS + pseg * 16,
                            base + static_cast<int64_t>(min(iss_r0 + prow + i * PROWS, N - 1) - iss_off) * row_bytes);
                }
            }
            if constexpr (F == kFP4) {
                // Row scales of the stage's k blocks: STEPS bytes per row from (row, kb0).
                uint8_t* sc = slot + kUnitRows * RS;
                const int kb0 = static_cast<int>(boff / 16), vsteps = vbytes / 16;
                const int wd = lane % WPR;
#pragma unroll
                for (int i = 0; i < (kUnitRows + SROWS - 1) / SROWS; ++i) {
                    const int r = lane / WPR + i * SROWS;
                    if (r < kUnitRows && wd * 4 < vsteps) {
                        if (p.scale_words && !iss_clamped) {
                            cp_async4(sc + r * STEPS + wd * 4, iss_sc + kb0 + static_cast<int64_t>(i) * SROWS * nkb);
                        } else {
                            const uint8_t* src =
                                iss_sb + static_cast<int64_t>(min(iss_r0 + r, N - 1) - iss_off) * nkb + kb0 + wd * 4;
#pragma unroll
                            for (int b = 0; b < 4; ++b)
                                if (wd * 4 + b < vsteps) sc[r * STEPS + wd * 4 + b] = src[b];
                        }
                    }
                }
            } else if constexpr (F == kFP8) {
                // The tile row's scales covering the stage (aligned 4-byte words, at most 4).
                uint8_t* sc = slot + kUnitRows * RS;
                const int64_t srow = static_cast<int64_t>((iss_r0 - iss_off) >> wshift) * nkb;
                const int kq0 = static_cast<int>(boff) >> wshift, kq1 = (static_cast<int>(boff) + vbytes - 1) >> wshift;
                const int w0 = kq0 >> 2, nw = (kq1 >> 2) - w0 + 1;
                if (lane < nw) {
                    if (p.scale_words) {
                        cp_async4(sc + lane * 4, iss_sb + srow + (w0 + lane) * 4);
                    } else {
                        for (int b = 0; b < 4; ++b) {
                            const int kq = (w0 + lane) * 4 + b;
                            sc[lane * 4 + b] = kq < nkb ? iss_sb[srow + kq] : uint8_t{127};
                        }
                    }
                }
            }
        }
        if (iss_u < u_end && ++iss_st == S) {
            iss_st = 0;
            if (++iss_u < u_end) iss_unit();
        }
        if (++iss_slot == ST) iss_slot = 0;
        cp_async_commit();
    };
    float* ascale = reinterpret_cast<float*>(act + KS * STEP_ACT);
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) issue();
    if (!p.tiles) pdl_enter();
    if (p.image) {
        // Dense call with the activations staged already: this slice of the tile's image, copied behind the
        // first weight stages (one commit group after theirs).
        const uint8_t* src =
            p.image + static_cast<int64_t>(mt) * p.image_tile + static_cast<int64_t>(k0 / G::STEP_VALUES) * STEP_ACT;
        for (int o = threadIdx.x * 16; o < KS * STEP_ACT; o += NT * 16) cp_async16(act + o, src + o);
        if constexpr (F != kBF16) {
            const uint8_t* ssrc = p.image + static_cast<int64_t>(mt) * p.image_tile +
                                  static_cast<int64_t>(K / G::STEP_VALUES) * STEP_ACT +
                                  static_cast<int64_t>(k0 / G::STEP_VALUES) * TR * 4;
            for (int o = threadIdx.x * 16; o < KS * TR * 4; o += NT * 16)
                cp_async16(reinterpret_cast<uint8_t*>(ascale) + o, ssrc + o);
        }
        cp_async_commit();
        if (threadIdx.x < TR) row_s[threadIdx.x] = tile_m0[0] + threadIdx.x;
    }

    // The activation scales folded into the staged f16 values (FP8/FP4), so that a k step scales its mma sums
    // by the weight scale alone: row m's values of k step ks times 2^(e - row_e[m] + 7), e the step's scale
    // exponent and row_e[m] the row's largest, and the row's outputs times 2^(row_e[m] - 134) at the end. All
    // powers of two: the same products and fp32 sums, only scaled, so the same outputs bit for bit. Exact while
    // a row's scales span at most 2^22 (the largest block's 448 x 2^7 stays below the f16 maximum; smaller
    // blocks keep their 2^-9 steps above 2^-24); a block further below its row's largest (values under 2^-22 of
    // the row's largest block) is rounded at 2^-24 of the f16 range. The tile's first `rows` rows (the others
    // are zeros). Called by every thread (barriers inside).
    auto fold = [&](int rows) {
        if constexpr (F != kBF16) {
            for (int m = warp; m < rows; m += NW) {
                unsigned e = 0;
                for (int ks = lane; ks < KS; ks += 32) e = max(e, __float_as_uint(ascale[ks * TR + m]) >> 23);
                e = __reduce_max_sync(0xffffffffu, e);
                if (lane == 0) row_e[m] = static_cast<int>(e);
            }
            __syncthreads();
            // Word wd of row m of k step ks: word (ks x TR + m) x 16 + wd of the staged values (64 bytes a row and step).
            uint32_t* words = reinterpret_cast<uint32_t*>(act);
            for (int i = threadIdx.x; i < KS * rows * (AB / 4); i += NT) {
                const int wd = i % (AB / 4), mk = i / (AB / 4), m = mk % rows, sr = (mk / rows) * TR + m;
                const int k = static_cast<int>(__float_as_uint(ascale[sr]) >> 23) - row_e[m] + 7;
                uint32_t* word = words + sr * (AB / 4) + wd;
                __half2 h = *reinterpret_cast<const __half2*>(word);
                h = __hmul2(h, pow2_h2(k));
                *word = *reinterpret_cast<const uint32_t*>(&h);
            }
            __syncthreads();
        }
    };
    // Stage the slice's activations: the e4m3 values as f16 (64 bytes) or bf16 pairs (32 bytes) per [k step][row],
    // fp32 scales per [k step][row]; rows past the tile as zeros. A warp handles 32 consecutive quads (4 values) per load, so
    // an activation block (8, 16 or 32 quads, aligned) lies within one warp's load.
    // Tile ti's activations; called by every thread (barriers inside), after the previous tile's last reads.
    auto stage = [&](int ti) {
        const int rows = tile_rows[ti];
        const int64_t m0 = tile_m0[ti];
        __syncthreads();
        if (threadIdx.x < TR)
            row_s[threadIdx.x] =
                static_cast<int>(threadIdx.x) < rows ? (p.row_map ? p.row_map[m0 + threadIdx.x] : m0 + threadIdx.x) : 0;
        __syncthreads();
        const int qpr = slice_values / 4, quads = rows * qpr;  // quads per row, in all
        const int ab = F == kBF16 ? 4 : w.act_block, qpb = ab / 4;
        for (int b0 = warp * 32 * kStageLoads; b0 < quads; b0 += NW * 32 * kStageLoads) {
            float4 v[kStageLoads];
#pragma unroll
            for (int i = 0; i < kStageLoads; ++i) {
                const int u = b0 + i * 32 + lane;
                if (u < quads) {
                    const int m = u / qpr, kq = u - m * qpr;
                    v[i] = *reinterpret_cast<const float4*>(p.x + row_s[m] * K + k0 + kq * 4);
                } else {
                    v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
            }
#pragma unroll
            for (int i = 0; i < kStageLoads; ++i) {
                const int u = b0 + i * 32 + lane;  // whole activation blocks are in or out together
                if (b0 + i * 32 >= quads) break;   // warp-uniform
                const int m = min(u / qpr, rows - 1), kq = u - (u / qpr) * qpr;
                const int kv = kq * 4, ks = kv / G::STEP_VALUES, within = kv % G::STEP_VALUES;
                float s;
                const uint2 h = stage_quad<F>(v[i], p.xs, row_s[m] * (K / ab) + (k0 + kv) / ab, qpb, s);
                if (u < quads) {
                    store_act4<F>(act + ks * STEP_ACT + m * AB, within, h);
                    if (F != kBF16 && within == 0) ascale[ks * TR + m] = s;
                }
            }
        }
        // Rows past the tile: zero bytes and scales, so that their (unwritten) outputs stay finite.
        constexpr int WPS = AB / 4;  // 4-byte words per row and k step
        const int zq = (TR - rows) * KS * WPS;
        for (int u = threadIdx.x; u < zq; u += NT) {
            const int m = rows + u / (KS * WPS), r = u % (KS * WPS), ks = r / WPS, wd = r % WPS;
            *reinterpret_cast<uint32_t*>(act + ks * STEP_ACT + m * AB + wd * 4) = 0u;
            if (F != kBF16 && wd == 0) ascale[ks * TR + m] = 0.0f;
        }
        __syncthreads();
        fold(rows);
    };
    if (p.image) {
        cp_async_wait<0>();  // the image's group (the newest, so the weight stages' too) has landed ...
        __syncthreads();     // ... and is visible to every warp
        fold(tile_rows[0]);
    } else {
        stage(0);
    }

    float acc[MT][4] = {};
    int c_u = u_begin, c_st = 0, c_slot = 0;  // the mma side's unit, stage and ring slot
    for (int s = 0; s < steps; ++s) {
        cp_async_wait<ST - 2>();  // this lane's copies of step s have landed
        __syncwarp();             // and every lane's; every lane is done with the slot of step s - 1 ...
        issue();                  // ... which this refills
        const int u = c_u, st = c_st, gi = u / groups, ti = gi - t_first;
        const int r0 = (u - gi * groups) * GR + warp * kUnitRows;
        const uint8_t* slot = my_ring + c_slot * SLOT;
        const uint8_t* sc = slot + kUnitRows * RS;
        if (++c_slot == ST) c_slot = 0;
        if (++c_st == S) c_st = 0, ++c_u;
        const int64_t boff = static_cast<int64_t>(st0 + st) * CH;
        const int vsteps = static_cast<int>(min(static_cast<int64_t>(CH), row_bytes - boff)) / G::STEP_W_BYTES;
        const int ks0 = st * STEPS;  // first k step of the stage in the slice
        const int rows_cur = tile_rows[ti];
        // FP4: this lane's weight scale bytes of the stage (rows g and g + 8, one byte per k step), turned into
        // floats x 2^14 in the k step (ue8m0_times_2p14_bits: the f16 weights are values x 2^-14).
        uint32_t wsb_lo[(STEPS + 3) / 4], wsb_hi[(STEPS + 3) / 4];
        if constexpr (F == kFP4) {
#pragma unroll
            for (int i = 0; i < (STEPS + 3) / 4; ++i) {
                wsb_lo[i] = *reinterpret_cast<const uint32_t*>(sc + g * STEPS + 4 * i);
                wsb_hi[i] = *reinterpret_cast<const uint32_t*>(sc + (g + 8) * STEPS + 4 * i);
            }
        }
        // One mma k step of the stage for the tile's first NC groups of 8 rows (a lambda so that whole stages run
        // as one unrolled, branch-free block the compiler can schedule across steps and groups; only a row's
        // partial last stage checks each step).
        auto k_step = [&](int j, auto nc) {
            constexpr int NC = decltype(nc)::value;
            // A fragments: bf16 (one mma per step), or f16 for the two mmas of a 32-value step: a[0..3] the
            // first (values 0, 2 / 4, 6 of each lane's 8 for FP4; 0, 1 / 2, 3 for FP8), a[4..7] the second.
            uint32_t a[8];
            if constexpr (F == kFP4) {
                const uint32_t lo = *reinterpret_cast<const uint32_t*>(slot + g * RS + j * 16 + 4 * t);
                const uint32_t hi = *reinterpret_cast<const uint32_t*>(slot + (g + 8) * RS + j * 16 + 4 * t);
                uint32_t pl[4], ph[4];
                fp4x8_to_f16(lo, pl);
                fp4x8_to_f16(hi, ph);
                a[0] = pl[0], a[1] = ph[0], a[2] = pl[1], a[3] = ph[1];
                a[4] = pl[2], a[5] = ph[2], a[6] = pl[3], a[7] = ph[3];
            } else {
                const uint2 lo = *reinterpret_cast<const uint2*>(slot + g * RS + j * 32 + 8 * t);
                const uint2 hi = *reinterpret_cast<const uint2*>(slot + (g + 8) * RS + j * 32 + 8 * t);
                if constexpr (F == kBF16) {
                    a[0] = lo.x, a[1] = hi.x, a[2] = lo.y, a[3] = hi.y;
                } else {
                    a[0] = e4m3x2_to_f16x2(lo.x), a[1] = e4m3x2_to_f16x2(hi.x);
                    a[2] = e4m3x2_to_f16x2(lo.x >> 16), a[3] = e4m3x2_to_f16x2(hi.x >> 16);
                    a[4] = e4m3x2_to_f16x2(lo.y), a[5] = e4m3x2_to_f16x2(hi.y);
                    a[6] = e4m3x2_to_f16x2(lo.y >> 16), a[7] = e4m3x2_to_f16x2(hi.y >> 16);
                }
            }
            [[maybe_unused]] float ws_lo = 1.0f, ws_hi = 1.0f;
            if constexpr (F == kFP4) {
                ws_lo = __uint_as_float(ue8m0_times_2p14_bits(__byte_perm(wsb_lo[j / 4], 0u, 0x4440 + (j % 4))));
                ws_hi = __uint_as_float(ue8m0_times_2p14_bits(__byte_perm(wsb_hi[j / 4], 0u, 0x4440 + (j % 4))));
            } else if constexpr (F == kFP8) {
                const int kq = (static_cast<int>(boff) + 32 * j) >> wshift,
                          kqw = (static_cast<int>(boff) >> wshift) & ~3;
                ws_lo = ws_hi = e8m0_to_f32(sc[kq - kqw]);
            }
            // The tile's rows, 8 (one mma) at a time; the A fragment is shared.
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const uint8_t* brow = act + (ks0 + j) * STEP_ACT + (c * kCols + g) * AB;
                if constexpr (F == kBF16) {
                    const uint2 b = *reinterpret_cast<const uint2*>(brow + 8 * t);
                    const uint32_t (&a4)[4] = *reinterpret_cast<const uint32_t(*)[4]>(a);
                    mma_bf16(acc[c], a4, b.x, b.y);
                } else {
                    // This lane's 8 f16 of activation row g (their scales folded in): the B registers of both mmas.
                    const uint4 b = *reinterpret_cast<const uint4*>(brow + 16 * t);
                    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_f16(d, *reinterpret_cast<const uint32_t(*)[4]>(a), b.x, b.y);
                    mma_f16(d, *reinterpret_cast<const uint32_t(*)[4]>(a + 4), b.z, b.w);
                    acc[c][0] = __fmaf_rn(d[0], ws_lo, acc[c][0]);
                    acc[c][1] = __fmaf_rn(d[1], ws_lo, acc[c][1]);
                    acc[c][2] = __fmaf_rn(d[2], ws_hi, acc[c][2]);
                    acc[c][3] = __fmaf_rn(d[3], ws_hi, acc[c][3]);
                }
            }
        };
        auto run_stage = [&](auto nc) {
            if (vsteps == STEPS) {
#pragma unroll
                for (int j = 0; j < STEPS; ++j) k_step(j, nc);
            } else {
#pragma unroll
                for (int j = 0; j < STEPS; ++j) {
                    if (j >= vsteps) break;  // warp-uniform
                    k_step(j, nc);
                }
            }
        };
        // The groups of 8 rows the tile fills (1, 2 or all MT; a third of four runs as four, on zero rows), fixed
        // for the stage: a test per group inside the step kept the compiler from overlapping the groups' mma
        // chains (32 rows: FP8 projections at ~500 GB/s).
        if (r0 < N) {
            const int nc = (rows_cur + kCols - 1) / kCols;
            if (nc > 2) run_stage(std::integral_constant<int, MT>{});
            else if (nc == 2) run_stage(std::integral_constant<int, (MT >= 2 ? 2 : 1)>{});
            else run_stage(std::integral_constant<int, 1>{});
        }
        if (st == S - 1) {  // the unit's last stage: write this lane's outputs, restart
#pragma unroll
            for (int c = 0; c < MT; ++c)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int n = r0 + g + (i >> 1) * 8, m = c * kCols + 2 * t + (i & 1);
                    if (m < rows_cur && n < N) {
                        const float v = F == kBF16 ? acc[c][i] : ldexpf(acc[c][i], row_e[m] - 134);  // unfold
                        if (p.splits > 1) p.partial[(static_cast<int64_t>(split) * p.M + row_s[m]) * N + n] = v;
                        else *out_at(row_s[m], n) = w.kind != 0 ? round_bf16(v) : v;  // F32 kind: fp32 out
                    }
                    acc[c][i] = 0.0f;
                }
            // The next unit in another tile (persistent CTAs): its activations replace these. The ring keeps
            // streaming meanwhile (its next ST - 1 stages are in flight).
            if (s + 1 < steps && (u + 1) / groups - t_first != ti) stage(ti + 1);
        }
    }
    cp_async_wait<0>();
    if (p.splits == 1) return;

    // K split: the last of the slices of these outputs to finish sums them in slice order.
    __threadfence();
    __syncthreads();
    const int64_t ticket = (static_cast<int64_t>(blockIdx.y) * p.mtiles + mt) * nblk + nbk;
    if (threadIdx.x == 0) last_s = atomicAdd(p.counters + ticket, 1u) == static_cast<unsigned>(p.splits - 1);
    __syncthreads();
    if (!last_s) return;
    __threadfence();
    // Four outputs per thread and eight slices at a time in flight (independent loads), summed in slice order.
    const int rows = tile_rows[0], n0 = (u_begin - t_first * groups) * GR;
    const int width = min(N, (u_end - t_first * groups) * GR) - n0, total = rows * width;
    const int64_t slice = p.M * static_cast<int64_t>(N);
    for (int i0 = threadIdx.x; i0 < total; i0 += 4 * NT) {
        int64_t o[4];  // the outputs' indices in the [M][N] partial sums
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = min(i0 + j * NT, total - 1), m = i / width;
            o[j] = row_s[m] * N + n0 + (i - m * width);
            v[j] = 0.0f;
        }
        for (int k0 = 0; k0 < p.splits; k0 += 8) {
            float part[4][8];
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int kk = 0; kk < 8; ++kk)
                    part[j][kk] = k0 + kk < p.splits ? __ldcg(p.partial + (k0 + kk) * slice + o[j]) : 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int kk = 0; kk < 8; ++kk)
                    if (k0 + kk < p.splits) v[j] = k0 + kk == 0 ? part[j][kk] : v[j] + part[j][kk];
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (i0 + j * NT < total)
                *out_at(o[j] / N, static_cast<int>(o[j] % N)) = w.kind != 0 ? round_bf16(v[j]) : v[j];
    }
    if (threadIdx.x == 0) p.counters[ticket] = 0;  // ready for the next call
}

// Shared memory of a CTA: the ring and the activation slice of `per` stages.
template <int F, int CH, int ST, int NW>
constexpr size_t ring_bytes() {
    return static_cast<size_t>(NW) * ST * Geo<F, CH>::SLOT;
}
// Staged activation bytes per k step of a tile of MT x 8 rows: 16 bf16 or 32 f16 per row, + fp32 scales.
template <int F, int MT>
constexpr int act_step_bytes() {
    return kCols * MT * (F == kBF16 ? 32 : 64 + 4);
}
template <int F, int CH, int MT>
size_t act_bytes(int per) {
    return static_cast<size_t>(per) * (CH / Geo<F, CH>::STEP_W_BYTES) * act_step_bytes<F, MT>();
}

// Dynamic shared memory this kernel may use (opted in on the current device): kSmemMax, or less where the
// device's opt-in limit minus the kernel's static shared memory is smaller (read once: the GPUs of a process are
// one model).
template <int F, int CH, int ST, int MINB, int MT, int NW>
size_t smem_limit() {
    static const size_t limit = [] {
        int dev = 0, optin = 0;
        PG_CUDA(cudaGetDevice(&dev));
        PG_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        cudaFuncAttributes fa{};
        PG_CUDA(cudaFuncGetAttributes(&fa, gemv_stream_kernel<F, CH, ST, MINB, MT, NW>));
        return std::min<size_t>(kSmemMax, static_cast<size_t>(std::max<int64_t>(
                                              0, int64_t{optin} - static_cast<int64_t>(fa.sharedSizeBytes))));
    }();
    smem_opt_in<gemv_stream_kernel<F, CH, ST, MINB, MT, NW>>(limit);
    return limit;
}

template <int F, int CH, int ST, int MINB, int MT, int NW>
int occupancy(size_t smem) {
    // Cached per KB of shared memory (the occupancy query is a runtime call), asked for the KB's upper end.
    static int cache[kSmemMax / 1024 + 2] = {};
    const size_t limit = smem_limit<F, CH, ST, MINB, MT, NW>(), kb = (smem + 1023) / 1024;
    if (smem > limit || kb >= sizeof(cache) / sizeof(cache[0])) return 0;
    if (cache[kb] == 0) {
        int n = 0;
        PG_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_stream_kernel<F, CH, ST, MINB, MT, NW>, NW * 32,
                                                              std::min(kb * 1024, limit)));
        cache[kb] = std::max(n, 0) + 1;  // + 1: 0 means not asked yet
    }
    return cache[kb] - 1;
}

// Dense calls of at least PEREGRINE_GEMV_IMAGE_ROWS rows (default 3; 0: never) stage their activations once
// (act_image_kernel) for every CTA to copy. On the H200 (V4.1-Flash's FP8 projections, all seven): 32 rows
// 253 against 293 us, 8 rows 119 against 130, 3 rows 118 against 122, one row 115 against 113.
// The work split does not depend on it, so the outputs are the same bits either way.
int& image_rows() {
    static int r = [] {
        return static_cast<int>(switch_int("PEREGRINE_GEMV_IMAGE_ROWS", 0, 1 << 20));
    }();
    return r;
}
bool use_image(int64_t M, int K) {
    return image_rows() > 0 && M >= image_rows() && K % 128 == 0;  // a row's quads in whole warps
}

// Work split for a shape: `splits` K slices of `per` stages, `gpb` groups of NW x 16 rows per CTA. Cost of a
// choice, in bytes an SM moves: the CTAs of the busiest SM (ceil(CTAs / SMs)) times what each reads (weights,
// its activation slice as fp32, a ramp for filling the pipeline, hidden in part where CTAs share an SM, and a
// K split's partial sums and reduction). Rows per tile
// estimated as the average (routed) or the tile's (dense). Returns (splits, gpb).
template <int F, int CH, int ST, int MINB, int MT, int NW>
std::pair<int, int> choose_split(int N, int all_stages, int64_t M, int mtiles, int64_t tiles, size_t extra) {
    using G = Geo<F, CH>;
    constexpr int GR = NW * kUnitRows;
    const int groups = (N + GR - 1) / GR, sms = sm_count();
    const size_t ring = ring_bytes<F, CH, ST, NW>();
    const int64_t base = static_cast<int64_t>(mtiles) * tiles;
    const int rows_est = static_cast<int>(std::clamp<int64_t>((M + base - 1) / base, 1, kCols * MT));
    const int64_t stage_bytes = static_cast<int64_t>(GR) * CH;  // a CTA's bytes per stage
    const int64_t ramp = 64 * 1024;
    int best_splits = 0, best_gpb = 1;
    double best_cost = 0.0;
    const int max_splits = std::min(all_stages, 64);
    for (int splits = 1; splits <= max_splits; ++splits) {
        const int per = (all_stages + splits - 1) / splits;
        if ((all_stages + per - 1) / per != splits) continue;  // an empty slice
        const size_t smem = ring + act_bytes<F, CH, MT>(per) + extra;
        const int occ = occupancy<F, CH, ST, MINB, MT, NW>(smem);
        if (occ < 1) continue;
        const int64_t act = static_cast<int64_t>(rows_est) * per * (CH / G::STEP_W_BYTES) * G::STEP_VALUES * 4;
        for (int gpb = 1; gpb <= groups; ++gpb) {
            const int nblk = (groups + gpb - 1) / gpb;
            if (gpb > 1 && (groups + gpb - 2) / (gpb - 1) == nblk) continue;  // same CTA count as gpb - 1
            const int64_t ctas = base * nblk * splits;
            const int64_t per_sm = (ctas + sms - 1) / sms;
            // A K split: each slice writes its partial sums; the last reduces them, eight slices per round trip
            // (~1 us, ~32 KB of an SM's streaming) for every 1024 outputs.
            const int64_t outs = static_cast<int64_t>(rows_est) * gpb * GR;
            const int64_t split_cost =
                splits > 1 ? outs * 4 + 32 * 1024 * ((splits + 7) / 8) * ((outs + 1023) / 1024) : 0;
            const double cost = static_cast<double>(per_sm) *
                                static_cast<double>(gpb * per * stage_bytes + act + ramp / occ + split_cost);
            if (best_splits == 0 || cost < best_cost) {
                best_cost = cost;
                best_splits = splits;
                best_gpb = gpb;
            }
        }
    }
    if (best_splits == 0) fail("linear_gemv: no K split fits shared memory ({} stages)", all_stages);
    return {best_splits, best_gpb};
}

template <int F, int CH, int ST, int MINB, int MT, int NW>
void launch(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y, const ExpertTable* experts,
            const LinearRouting* routing, bool persistent, const LinearDev* w2, float* y2,
            const ExpertTable* experts2) {
    constexpr int GR = NW * kUnitRows;
    if (w2 && w.out % GR != 0) {  // a pair whose first linear ends inside a group of rows: two calls
        launch<F, CH, ST, MINB, MT, NW>(x, xs, M, w, y, experts, routing, persistent, nullptr, nullptr, nullptr);
        launch<F, CH, ST, MINB, MT, NW>(x, xs, M, *w2, y2, experts2, routing, persistent, nullptr, nullptr, nullptr);
        return;
    }
    // A routed pair keeps its second table's per-tile pointers in dynamic shared memory.
    const size_t extra = routing && w2 ? 2 * kMaxCtaTiles * sizeof(void*) : 0;
    const int N = w.out + (w2 ? w2->out : 0), groups = (N + GR - 1) / GR;
    const int64_t row_bytes = F == kFP4 ? w.in / 2 : F == kFP8 ? w.in : 2 * static_cast<int64_t>(w.in);
    const int all_stages = static_cast<int>((row_bytes + CH - 1) / CH);
    const int mtiles = routing ? 1 : static_cast<int>((M + kCols * MT - 1) / (kCols * MT));
    const int64_t tiles = routing ? std::min<int64_t>(routing->max_tiles, M) : 1;
    if (tiles > 65535) fail("linear_gemv: {} routed tiles exceed the grid limit", tiles);
    const size_t ring = ring_bytes<F, CH, ST, NW>();
    const size_t limit = smem_limit<F, CH, ST, MINB, MT, NW>();  // opts in: before the occupancy queries
    // The split of a shape is worked out once (the search is a few thousand steps of host arithmetic).
    static std::mutex mu;
    const bool image = !routing && use_image(M, w.in);
    static std::map<std::tuple<int, int, int64_t, int64_t, size_t>, std::pair<int, int>> plans;
    std::pair<int, int> plan;
    bool fresh = false;
    {
        std::lock_guard<std::mutex> lock(mu);
        const auto key = std::make_tuple(N, w.in, M, tiles, extra);
        auto it = plans.find(key);
        if (it == plans.end()) {
            it =
                plans.emplace(key, choose_split<F, CH, ST, MINB, MT, NW>(N, all_stages, M, mtiles, tiles, extra)).first;
            fresh = true;
        }
        plan = it->second;
    }
    int splits = plan.first, gpb = plan.second, per = (all_stages + splits - 1) / splits;
    int nblk = (groups + gpb - 1) / gpb;
    size_t smem = ring + act_bytes<F, CH, MT>(per) + extra;
    // Persistent (routed calls with at least a CTA's worth of units per resident CTA): whole waves of one CTA per
    // resident slot, each an equal share of the (tile, group) units over the whole of K. A CTA's units (tile-major)
    // may touch at most kMaxCtaTiles - 1 tiles: n units touch at most (n - 1) / groups + 2, hence at most
    // (kMaxCtaTiles - 2) x groups units. (Capping at kMaxCtaTiles - 1 units instead ran the large routed calls as
    // one full wave and one part-full: batch 128's w2, 206 CTAs on 132 slots.)
    int64_t ctas = 0;
    const int64_t units = tiles * groups;
    if (persistent && routing && units < (int64_t{1} << 31)) {
        const size_t full = ring + act_bytes<F, CH, MT>(all_stages) + extra;
        const int occ = full <= limit ? occupancy<F, CH, ST, MINB, MT, NW>(full) : 0;
        const int64_t slots = static_cast<int64_t>(occ) * sm_count();
        if (occ > 0 && units >= slots) {
            const int64_t max_units = static_cast<int64_t>(kMaxCtaTiles - 2) * groups;
            ctas = slots * ((units + slots * max_units - 1) / (slots * max_units));
            splits = 1;
            gpb = 1;
            per = all_stages;
            nblk = groups;
            smem = full;
        }
    }

    static const bool trace = [] {
        return switch_is("PEREGRINE_GEMV_TRACE", "1");
    }();
    if (trace && fresh)
        std::fprintf(
            stderr,
            "gemv-stream plan: fmt %d CH %d ST %d | N %d K %d M %lld tiles %lld -> %s%s splits %d x %d stages, "
            "%d groups/CTA, %lld CTAs, %zu B smem, %d CTAs/SM\n",
            F, CH, ST, N, w.in, static_cast<long long>(M), static_cast<long long>(tiles),
            ctas > 0 ? "persistent" : "grid", image ? " (image)" : "", splits, per, gpb,
            static_cast<long long>(ctas > 0 ? ctas : static_cast<int64_t>(nblk) * splits * mtiles * tiles), smem,
            occupancy<F, CH, ST, MINB, MT, NW>(smem));

    StreamArgs a{};
    a.x = x;
    a.xs = xs;
    a.M = M;
    a.w = w;
    a.y = y;
    a.splits = splits;
    a.mtiles = mtiles;
    a.gpb = gpb;
    a.per = per;
    a.persistent = ctas > 0;
    // 4-byte scale copies: scale rows a multiple of 4 bytes and the (first expert's) table 4-byte aligned.
    const int nkb = F == kFP8 ? (w.in + w.weight_block - 1) / w.weight_block : w.in / 32;
    a.scale_words = F != kBF16 && nkb % 4 == 0 && reinterpret_cast<uintptr_t>(w.scale) % 4 == 0 &&
                    (!w2 || reinterpret_cast<uintptr_t>(w2->scale) % 4 == 0);
    a.n1 = w.out;
    if (w2) {
        a.w2 = *w2;
        a.y2 = y2;
        if (extra) {
            a.experts2 = *experts2;
            a.pair_tables = static_cast<int>(smem - extra);
        }
    }
    a.experts = experts ? *experts : ExpertTable{};
    a.row_map = routing ? routing->row_map : nullptr;
    a.tiles = routing ? reinterpret_cast<const int4*>(routing->tiles) : nullptr;
    a.n_tiles = routing ? routing->n_tiles : nullptr;
    if (image) {
        constexpr int TR = kCols * MT, AB = F == kBF16 ? 32 : 64, STEP_VALUES = F == kBF16 ? 16 : 32;
        a.image_tile = static_cast<int64_t>(w.in / STEP_VALUES) * TR * (AB + 4);
        auto* img = static_cast<uint8_t*>(gemv_scratch(2, static_cast<size_t>(a.image_tile) * mtiles, false));
        const int64_t quads = static_cast<int64_t>(mtiles) * TR * (w.in / 4);
        launch_pdl(act_image_kernel<F, MT>, dim3(static_cast<unsigned>((quads + 255) / 256)), dim3(256), 0, x, xs, M,
                   w.in, F == kBF16 ? 4 : w.act_block, quads, img);
        a.image = img;
    }
    const int64_t gx = ctas > 0 ? ctas : static_cast<int64_t>(nblk) * splits * mtiles;
    if (gx > 0x7fffffff) fail("linear_gemv: grid of {} blocks is too large", gx);
    if (splits > 1) {
        a.partial = static_cast<float*>(gemv_scratch(0, sizeof(float) * static_cast<size_t>(splits) * M * N, false));
        a.counters = static_cast<unsigned*>(
            gemv_scratch(1, sizeof(unsigned) * static_cast<size_t>(tiles) * mtiles * nblk, true));
    }
    dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(ctas > 0 ? 1 : tiles));
    launch_pdl(gemv_stream_kernel<F, CH, ST, MINB, MT, NW>, grid, dim3(NW * 32), smem, a);
}

template <int F>
void launch_kernel(GemvKernel v, const float* x, const float* xs, int64_t M, const LinearDev& w, float* y,
                   const ExpertTable* experts, const LinearRouting* routing, const LinearDev* w2, float* y2,
                   const ExpertTable* experts2) {
    // Dense calls of more than 8 rows: tiles of 16 or 32 rows, so that each weight fragment feeds 2 or 4 mmas
    // (and the weights are streamed once instead of once per 8 rows).
    const int mt = routing || M <= 8 ? 1 : M <= 16 ? 2 : 4;
    switch (v) {
        case GemvKernel::stream_128x6:
        case GemvKernel::persistent_128x6:  // 80 KB in flight per CTA (persistent when routed)
            if (mt == 1)
                launch<F, 128, 6, 1, 1, 8>(x, xs, M, w, y, experts, routing, v == GemvKernel::persistent_128x6, w2, y2,
                                           experts2);
            else if (mt == 2) launch<F, 128, 6, 1, 2, 8>(x, xs, M, w, y, experts, routing, false, w2, y2, experts2);
            else launch<F, 128, 6, 1, 4, 8>(x, xs, M, w, y, experts, routing, false, w2, y2, experts2);
            break;
        case GemvKernel::stream_128x4_2ctas:
            launch<F, 128, 4, 2, 1, 8>(x, xs, M, w, y, experts, routing, false, w2, y2, experts2);
            break;  // 48 KB, two CTAs per SM
        case GemvKernel::fp4_12warps:
            // FP4: 12 warps (192 rows) a CTA with 128-byte stages 4 deep (72 KB in flight; a whole K of f16
            // activations still fits), persistent when routed: three warps a scheduler to hide the k steps' latency,
            // where 8 warps left issue slots idle. Other formats, and dense tiles of 16-32 rows (whose k steps would
            // not fit the registers of so many warps): as stream_256x4.
            if constexpr (F == kFP4) {
                if (mt == 1) {
                    launch<F, 128, 4, 1, 1, 12>(x, xs, M, w, y, experts, routing, true, w2, y2, experts2);
                    break;
                }
            }
            [[fallthrough]];
        case GemvKernel::fp4_16warps:
            // FP4: 16 warps (256 rows) a CTA, 128-byte stages 3 deep, persistent when routed: four warps a
            // scheduler. Other formats and 16-32-row tiles: as stream_256x4.
            if constexpr (F == kFP4) {
                if (v == GemvKernel::fp4_16warps && mt == 1) {
                    launch<F, 128, 3, 1, 1, 16>(x, xs, M, w, y, experts, routing, true, w2, y2, experts2);
                    break;
                }
            }
            [[fallthrough]];
        default: {  // stream_256x4 and persistent_256x4: 96 KB in flight, 4 rows x 256 B per copy. FP4: 64 KB,
                    // so that a whole K of f16 activations (5120 values: 87 KB) fits beside the ring.
            constexpr int st = F == kFP4 ? 3 : 4;
            if (mt == 1)
                launch<F, 256, st, 1, 1, 8>(x, xs, M, w, y, experts, routing, v == GemvKernel::persistent_256x4, w2,
                                            y2, experts2);
            else if (mt == 2) launch<F, 256, st, 1, 2, 8>(x, xs, M, w, y, experts, routing, false, w2, y2, experts2);
            else launch<F, 256, st, 1, 4, 8>(x, xs, M, w, y, experts, routing, false, w2, y2, experts2);
            break;
        }
    }
}

}  // namespace

bool linear_gemv_stream_supported(const LinearDev& w) {
    if (w.out <= 0 || w.in <= 0) return false;
    if (reinterpret_cast<uintptr_t>(w.w) % 16 != 0) return false;
    switch (w.kind) {
        case kBF16: return w.bf16_acts && w.in % 16 == 0;  // whole mma steps (32-byte rows pieces)
        case 0: return w.w_bf16 && w.bf16_acts && w.in % 16 == 0;  // F32 on bf16 values: as BF16, fp32 outputs
        case kFP8:  // the reference's pairing (one activation scale per weight block), blocks of 32/64/128
            return w.in % 32 == 0 && (w.weight_block == 32 || w.weight_block == 64 || w.weight_block == 128) &&
                   w.act_block == w.weight_block && w.in % w.act_block == 0 && w.scale != nullptr;
        case kFP4:
            return w.in % 32 == 0 && (w.act_block == 32 || w.act_block == 64 || w.act_block == 128) &&
                   w.in % w.act_block == 0 && w.scale != nullptr;
        default: return false;
    }
}

int linear_gemv_set_image_rows(int rows) { return std::exchange(image_rows(), rows); }

bool linear_gemv_stream_quantises(const LinearDev& w) {
    if (!linear_gemv_stream_supported(w) || (w.kind != kFP8 && w.kind != kFP4)) return false;
    // A slice starts on a stage boundary: stages must hold whole activation blocks (128 values or more).
    return w.act_block <= 128;
}

namespace {
void stream(GemvKernel variant, const float* x, const float* xs, int64_t M, const LinearDev& w, float* y,
            const ExpertTable* experts, const LinearRouting* routing, const LinearDev* w2, float* y2,
            const ExpertTable* experts2) {
    if (M == 0 || w.out == 0) return;
    if (!gemv_kernel_streams(variant)) fail("linear_gemv_stream: {} does not stream", gemv_kernel_name(variant));
    if (!linear_gemv_stream_supported(w)) fail("linear_gemv_stream: unsupported linear (kind {}, in {})", w.kind, w.in);
    if (reinterpret_cast<uintptr_t>(x) % 16 != 0) fail("linear_gemv_stream: activations must be 16-byte aligned");
    if (routing && routing->tile_rows > kCols) fail("linear_gemv_stream: routed tiles of {} rows", routing->tile_rows);
    if ((w.kind == kFP8 || w.kind == kFP4) && xs == nullptr && !linear_gemv_stream_quantises(w))
        fail("linear_gemv_stream: cannot quantise activation blocks of {}", w.act_block);
    if (w.kind == kFP4) launch_kernel<kFP4>(variant, x, xs, M, w, y, experts, routing, w2, y2, experts2);
    else if (w.kind == kFP8) launch_kernel<kFP8>(variant, x, xs, M, w, y, experts, routing, w2, y2, experts2);
    else launch_kernel<kBF16>(variant, x, xs, M, w, y, experts, routing, w2, y2, experts2);
}
}  // namespace

void linear_gemv_stream(GemvKernel variant, const float* x, const float* xs, int64_t M, const LinearDev& w, float* y,
                        const ExpertTable* experts, const LinearRouting* routing) {
    stream(variant, x, xs, M, w, y, experts, routing, nullptr, nullptr, nullptr);
}

bool linear_gemv_stream_pairs(const LinearDev& a, const LinearDev& b) {
    return linear_gemv_stream_supported(a) && linear_gemv_stream_supported(b) && a.kind == b.kind && a.in == b.in &&
           a.w_bf16 == b.w_bf16 && a.bf16_acts == b.bf16_acts && a.weight_block == b.weight_block &&
           a.act_block == b.act_block && (a.weight_block <= 0 || a.out % a.weight_block == 0);
}

void linear_gemv_stream_pair(GemvKernel variant, const float* x, const float* xs, int64_t M, const LinearDev& a, float* ya,
                             const LinearDev& b, float* yb, const ExpertTable* ea, const ExpertTable* eb,
                             const LinearRouting* routing) {
    if (!linear_gemv_stream_pairs(a, b)) fail("linear_gemv_stream_pair: linears of different formats or widths");
    if ((routing != nullptr) != (ea != nullptr && eb != nullptr))
        fail("linear_gemv_stream_pair: routed pairs need both expert tables");
    if (a.out == 0 || b.out == 0) {
        stream(variant, x, xs, M, a, ya, ea, routing, nullptr, nullptr, nullptr);
        stream(variant, x, xs, M, b, yb, eb, routing, nullptr, nullptr, nullptr);
        return;
    }
    stream(variant, x, xs, M, a, ya, ea, routing, &b, yb, eb);
}

}  // namespace peregrine::cuda
