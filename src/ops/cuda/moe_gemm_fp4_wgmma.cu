// Routed FP4 expert GEMMs on Hopper's warpgroup MMA (wgmma, bf16 in, fp32 sums). The weights are the A operand
// and come from registers: each thread dequantises its fragment of the packed e2m1 codes exactly (codes placed
// into bf16 bits by masks and multiply-adds, then one bf16x2 multiply by the power-of-two scale), so the weights
// never pass through shared memory as bf16 and no lookup table competes with the tensor cores for shared memory.
// The sorted bf16 token rows are the B operand, read by the tensor cores from shared memory in the 128-byte
// swizzled layout. A block is two warpgroups over a tile of 64 token rows of one expert (each warpgroup two m64
// tiles of weight rows) or 128 (one m64 tile each: every dequantised weight feeds twice the MMAs); the output
// is D^T = W X^T, so a thread holds output columns (features) by row and tokens by column. Gated: a warp's 16
// rows are 8 features of w1 then the same 8 of w3, so that gate and up of one output meet in one thread for the
// SwiGLU epilogue. Pipeline: four cp.async stages; two blocks per SM keep the tensor cores busy while the other
// block dequantises. With 64-token tiles a warpgroup runs each stage's MMAs to completion (a second set of
// 32-register fragments does not fit); with 128, one stage's MMAs stay in flight while the next dequantises.
#include "ops/cuda/fp4_f16.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/moe_gemm_fp4_common.cuh"
#include "ops/cuda/wgmma.cuh"

namespace peregrine::cuda::fp4g {

namespace {

using namespace wgmma;

constexpr int kThreads = 256;                 // two warpgroups
constexpr int kBK = 64;                       // k per stage: one 128-byte swizzle atom of bf16 per token row
constexpr int kStages = 4;    // k64 stages of tokens, codes and scales in shared memory

// The tile shape for NT token rows (the wgmma N: 64 or 128): each warpgroup MT = 128 / NT m64 tiles of weight
// rows, so that a warpgroup's accumulators are 64 a thread either way; with 128 tokens a staged weight is
// dequantised once for twice the MMAs.
template <int NT>
struct Shape {
    static constexpr int kMT = 128 / NT;
    static constexpr int kRows = 2 * 64 * kMT;            // staged weight rows: 2 warpgroups x MT m64 tiles
    static constexpr int kBStage = NT * kBK * 2;          // token rows, 1024-byte aligned (the swizzle atom)
    static constexpr int kCStage = kRows * (kBK / 2);     // codes, 32 bytes a row
    static constexpr int kSStage = kRows * 4;             // a scale word a row: the 4 ue8m0 of the stage's k128
    static constexpr int kStage = (kBStage + kCStage + kSStage + 1023) / 1024 * 1024;  // token tiles on atoms
    static constexpr int kSmem = kStages * kStage + 1024;  // + alignment of the first stage to 1024 bytes
};

// Staged weight row R -> (weight set, feature offset from the block's first output column).
__device__ __forceinline__ void staged_row(int R, bool gated, int& set, int& feature) {
    if (!gated) {
        set = 0;
        feature = R;
        return;
    }
    const int r = R & 63;  // m64 tile R / 64 covers 32 features; a warp's 16 rows are 8 of w1, then 8 of w3
    set = (r >> 3) & 1;
    feature = (R >> 6) * 32 + (r >> 4) * 8 + (r & 7);
}

template <bool GATED, int NT>
__global__ void __launch_bounds__(kThreads, 2) fp4_wgmma_kernel(GemmArgs g) {
    using S = Shape<NT>;
    constexpr int kMT = S::kMT, kRows = S::kRows, kBStage = S::kBStage, kCStage = S::kCStage;
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
    if (static_cast<int>(blockIdx.y) >= *g.n_tiles) return;
    const int4 tile = g.tiles[blockIdx.y];
    const int e = tile.x, row0 = tile.y, rows = tile.z;
    const int n0 = blockIdx.x * (GATED ? kRows / 2 : kRows);
    const int K = g.K, KB = K / 2, KS = K / 32, KT = K / kBK;

    // This thread's copies, the same every stage: token rows tid/8 + 32i (16-byte chunk tid % 8), code rows
    // tid/2 + 128i (chunk tid % 2), the scale word of row tid.
    constexpr int kTokCopies = NT / 32, kCodeCopies = kRows / 128;
    const __nv_bfloat16* tsrc[kTokCopies];
    uint32_t tdst[kTokCopies], tbytes[kTokCopies];
#pragma unroll
    for (int i = 0; i < kTokCopies; ++i) {
        const int r = (tid >> 3) + 32 * i, ch = tid & 7;
        tbytes[i] = r < rows ? 16 : 0;
        tsrc[i] = g.a + static_cast<int64_t>(row0 + (r < rows ? r : 0)) * K + ch * 8;
        tdst[i] = sw128_offset(r, ch);
    }
    const uint8_t* csrc[kCodeCopies];
#pragma unroll
    for (int i = 0; i < kCodeCopies; ++i) {
        int set, f;
        staged_row((tid >> 1) + 128 * i, GATED, set, f);
        const uint8_t* w = static_cast<const uint8_t*>((GATED && set ? g.w1 : g.w0).w[e]);
        csrc[i] = w + static_cast<int64_t>(n0 + f) * KB + (tid & 1) * 16;
    }
    const uint8_t* ssrc = nullptr;
    if (tid < kRows) {
        int set, f;
        staged_row(tid, GATED, set, f);
        ssrc = (GATED && set ? g.w1 : g.w0).scale[e] + static_cast<int64_t>(n0 + f) * KS;
    }
    auto load = [&](int kt, int s) {
        uint8_t* st = smem + s * S::kStage;
#pragma unroll
        for (int i = 0; i < kTokCopies; ++i) cp_async16(st + tdst[i], tsrc[i] + kt * kBK, tbytes[i]);
#pragma unroll
        for (int i = 0; i < kCodeCopies; ++i)
            cp_async16(st + kBStage + ((tid >> 1) + 128 * i) * 32 + (tid & 1) * 16, csrc[i] + kt * (kBK / 2), 16);
        if (tid < kRows) cp_async4(st + kBStage + kCStage + tid * 4, ssrc + (kt >> 1) * 4);
    };

    // Fragment rows: tile mt of this warpgroup, rows g and g + 8 of the warp's 16.
    const int g4 = lane >> 2, t4 = lane & 3;
    int frow[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) frow[mt][h] = wg * (64 * kMT) + mt * 64 + wq * 16 + g4 + 8 * h;

    // a[mt][s]: the m64 x k16 A fragment of tile mt for k16 step s of stage `kt` (stored at `st`). The token
    // rows hold k in the wgmma_k_slot order, so this thread's codes of a row are its bytes 8t .. 8t + 7, all in
    // one block of 32 (one scale), placed into bf16 on the integer pipe (fp4_wgmma_fragments) and scaled by one
    // exact bf16x2 multiply; scales above 2^1 (e > 128) take a second one.
    auto dequantise = [&](const uint8_t* st, int kt, uint32_t (&a)[kMT][4][4]) {
        const uint32_t sel = 0x4440u | (2 * (kt & 1) + (t4 >> 1));  // this thread's scale byte of the word
        uint32_t big = 0;
        uint32_t ev[kMT][2];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int R = frow[mt][h];
                const uint2 c = *reinterpret_cast<const uint2*>(st + kBStage + R * 32 + 8 * t4);
                const uint32_t word = *reinterpret_cast<const uint32_t*>(st + kBStage + kCStage + R * 4);
                const uint32_t e = __byte_perm(word, 0u, sel);
                const uint32_t sc = ue8m0_times_2p126_bf16x2(e);
                big |= e > 128u;
                ev[mt][h] = e;
                uint32_t f[4][2];
                fp4_wgmma_fragments(c.x, c.y, f);
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    a[mt][s][h] = mul_bf16x2(f[s][0], sc);
                    a[mt][s][2 + h] = mul_bf16x2(f[s][1], sc);
                }
            }
        if (__any_sync(0xffffffffu, big))  // rare: keeps the common path at one multiply
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint32_t e = ev[mt][h], b2 = e > 128u ? (e - 1u) << 7 : 0x3f80u;  // 2^(e - 128), else 1
                    const uint32_t sc2 = b2 | (b2 << 16);
#pragma unroll
                    for (int s = 0; s < 4; ++s) {
                        a[mt][s][h] = mul_bf16x2(a[mt][s][h], sc2);
                        a[mt][s][2 + h] = mul_bf16x2(a[mt][s][2 + h], sc2);
                    }
                }
    };

    float acc[kMT][NT / 2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int i = 0; i < NT / 2; ++i) acc[mt][i] = 0.0f;

    // 128-token tiles leave one stage's MMAs in flight while the next stage dequantises (into the other of two
    // fragment sets: 16 registers each); the refill then goes to the stage whose MMAs are done, two tiles back.
    // 64-token tiles (32-register fragments) keep one set and run each stage's MMAs to completion.
    constexpr int kInFlight = NT == 128 ? 1 : 0;
    constexpr int kLoadAhead = kStages - 1 - kInFlight;
#pragma unroll
    for (int s = 0; s < kLoadAhead; ++s) {
        if (s < KT) load(s, s);
        cp_async_commit();
    }
    // One k64 stage: wait for its tile, refill the stage whose MMAs every thread has seen complete (the barrier),
    // dequantise, issue the MMAs, and wait until at most kInFlight stages' MMAs are left running.
    auto stage = [&](int kt, uint32_t (&frag)[kMT][4][4]) {
        cp_async_wait<kLoadAhead - 1>();
        proxy_fence();
        __syncthreads();
        if (kt + kLoadAhead < KT) load(kt + kLoadAhead, (kt + kLoadAhead) % kStages);
        cp_async_commit();
        const uint8_t* st = smem + (kt % kStages) * S::kStage;
        dequantise(st, kt, frag);
        const uint32_t b0 = smem_addr(st);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) wgmma_rs(acc[mt], frag[mt][s], desc_sw128(b0 + s * 32));
        wgmma_commit();
        wgmma_wait<kInFlight>();
    };
    uint32_t frag[1 + kInFlight][kMT][4][4];
    for (int kt = 0; kt < KT; kt += 1 + kInFlight) {
        stage(kt, frag[0]);
        if constexpr (kInFlight > 0)
            if (kt + 1 < KT) stage(kt + 1, frag[1]);
    }
    wgmma_wait<0>();
    cp_async_wait<0>();
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int i = 0; i < NT / 2; ++i) hold(acc[mt][i]);

    // acc[mt][4j + q]: row wq*16 + g4 + 8*(q >> 1) of tile mt, token column 8j + 2*t4 + (q & 1).
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int j = 0; j < NT / 8; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int col = 8 * j + 2 * t4 + c;
                if (col >= rows) continue;
                const int64_t pair = g.row_map[row0 + col];
                float* out = g.y + pair * g.N + n0;
                if constexpr (GATED) {
                    out[(wg * kMT + mt) * 32 + wq * 8 + g4] =
                        gated_out(acc[mt][4 * j + c], acc[mt][4 * j + 2 + c], g.limit, g.route_w[pair]);
                } else {
                    const int f = wg * (64 * kMT) + mt * 64 + wq * 16 + g4;
                    out[f] = round_bf16(acc[mt][4 * j + c]);
                    out[f + 8] = round_bf16(acc[mt][4 * j + 2 + c]);
                }
            }
}

template <int NT>
void launch(const GemmArgs& g, bool gated, unsigned max_tiles) {
    using S = Shape<NT>;
    smem_opt_in<fp4_wgmma_kernel<true, NT>>(S::kSmem);
    smem_opt_in<fp4_wgmma_kernel<false, NT>>(S::kSmem);
    const dim3 grid(static_cast<unsigned>(g.N / (gated ? S::kRows / 2 : S::kRows)), max_tiles);
    if (gated) fp4_wgmma_kernel<true, NT><<<grid, kThreads, S::kSmem>>>(g);
    else fp4_wgmma_kernel<false, NT><<<grid, kThreads, S::kSmem>>>(g);
    PG_LAUNCHED();
}

}  // namespace

bool wgmma_supported(int K, int N, bool gated) {
    // Every output column block of 256 weight rows (128 gated) also splits into the 128-token shape's 128 (64).
    return K > 0 && K % 128 == 0 && N > 0 && N % (gated ? 128 : 256) == 0;
}

void launch_wgmma(const GemmArgs& g, bool gated, int tile_tokens, unsigned max_tiles) {
    if (tile_tokens == 128) launch<128>(g, gated, max_tiles);
    else launch<64>(g, gated, max_tiles);
}

}  // namespace peregrine::cuda::fp4g
