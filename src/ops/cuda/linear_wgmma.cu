// Dense FP8 linears of decode batches (1-2 and 9 to 256 rows) on Hopper's warpgroup MMA (bf16 in, fp32 sums). The e4m3
// weights are read once, as stored, and are the A operand from registers: each thread places its codes' bits into
// bf16 and applies the block scale by an exact bf16x2 multiply (entry_decode.h, as the state entries). The
// activations' exact bf16 images (act_quant_bf16 in the wgmma order, so that a thread's 16 code bytes of a stage are
// contiguous) are the B operand, read by the tensor cores from shared memory in the 128-byte swizzle. Above 32 rows
// this replaces the cuBLAS path, which dequantised the whole weight to bf16 on every call (5 bytes of traffic a
// weight instead of 1); below, the GEMV's rows but 3-8 (linear_dispatch.cpp). Two linears of one input (wq_a and
// wkv, the shared expert's w1 and w3) run as one call: one quantisation, one launch, one reduction.
//
// A block is two warpgroups of 64 weight rows each over a tile of 64 or 128 token rows (the wgmma N) and a slice
// of K; token tiles vary fastest in the grid, so the blocks that share weights run side by side and the second
// read comes from L2. Slices (as many as fill the GPU with at least four k64 stages each) leave fp32 partial sums
// that reduce_kernel adds in slice order and rounds to bf16. Pipeline: four cp.async stages of tokens and codes;
// two blocks per SM, so that four warpgroups take turns between dequantising and the tensor cores (a warpgroup
// runs a stage's MMAs to completion: leaving them in flight over six stages measured 5-10% slower).
#include "ops/cuda/cp_async.cuh"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/device_memory.h"
#include "ops/cuda/entry_decode.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/wgmma.cuh"

#include <cuda_bf16.h>

#include <algorithm>

namespace peregrine::cuda {

namespace {

using namespace wgmma;

constexpr int kThreads = 256;        // two warpgroups
constexpr int kRows = 128;           // weight rows (outputs) a block: 64 a warpgroup
constexpr int kBK = 64;              // k a stage: one 128-byte swizzle row of bf16 tokens, 64 code bytes a weight row
constexpr int kStages = 4;
constexpr int kScaleBytes = 2048;    // the block's weight scales for all of K: (128 / block) x ceil(K / block)
constexpr int kMinSliceStages = 4;

template <int NT>
struct Shape {
    static constexpr int kBStage = NT * kBK * 2;      // token rows: 1024-byte atoms of 8 rows
    static constexpr int kCStage = kRows * kBK;       // codes, 64 bytes a row
    static constexpr int kStage = kBStage + kCStage;  // a multiple of 1024
    static constexpr int kSmem = kStages * kStage + 1024;  // + alignment of the first stage to 1024 bytes
};

// One linear of a call: a call is one, or two of the same input (a pair: the second's blocks follow the first's in
// grid y, and its outputs follow the first's in the partial sums' rows).
struct Weights {
    const uint8_t* w;      // [N, K] e4m3 codes
    const uint8_t* scale;  // [ceil(N / block), ceil(K / block)] ue8m0
    int N;
    float* y;              // [M, N], bf16-rounded
};

struct Args {
    const __nv_bfloat16* a;  // [M, K] bf16 images of the quantised activations, k in the wgmma order
    Weights l0, l1;          // l1.N == 0: no second linear
    int M, K, block;         // block: the weights' square scale block (32, 64 or 128)
    int splits;              // slices of K (grid z)
    float* partial;          // [splits, M, l0.N + l1.N] fp32 sums (splits > 1)
};

template <int NT>
__global__ void __launch_bounds__(kThreads, 2) fp8_wgmma_kernel(Args g) {
    using S = Shape<NT>;
    extern __shared__ uint8_t smem_raw[];
    __shared__ uint8_t scales[kScaleBytes];
    uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
    const int nb0 = g.l0.N / kRows, second = static_cast<int>(blockIdx.y) >= nb0;
    const Weights l = second ? g.l1 : g.l0;  // by value: a reference into the parameters goes through the stack
    const int m0 = blockIdx.x * NT, n0 = (blockIdx.y - (second ? nb0 : 0)) * kRows, split = blockIdx.z;
    const int K = g.K, KT = K / kBK, nkb = (K + g.block - 1) / g.block;
    const int kt0 = static_cast<int>(static_cast<int64_t>(split) * KT / g.splits);
    const int kt1 = static_cast<int>(static_cast<int64_t>(split + 1) * KT / g.splits);

    // The block's scales and the codes of its first stages (weights: never written during a step, so read before
    // waiting on the previous kernel).
    const int srows = kRows / g.block;
    for (int i = tid; i < srows * nkb; i += kThreads)
        scales[i] = l.scale[static_cast<int64_t>(n0 / g.block + i / nkb) * nkb + i % nkb];
    // This thread's copies, the same every stage: token rows tid/8 + 32i (16-byte chunk tid % 8), code rows
    // tid/4 + 64i (chunk tid % 4).
    constexpr int kTokCopies = NT / 32, kCodeCopies = kRows / 64;
    const uint8_t* csrc[kCodeCopies];
    uint32_t cdst[kCodeCopies];
#pragma unroll
    for (int i = 0; i < kCodeCopies; ++i) {
        const int r = (tid >> 2) + 64 * i, ch = tid & 3;
        csrc[i] = l.w + static_cast<int64_t>(n0 + r) * K + ch * 16;
        cdst[i] = S::kBStage + r * kBK + ch * 16;
    }
    auto load_codes = [&](int kt, int s) {
        uint8_t* st = smem + s * S::kStage;
#pragma unroll
        for (int i = 0; i < kCodeCopies; ++i) cp_async16(st + cdst[i], csrc[i] + kt * kBK, 16);
    };
    constexpr int kLoadAhead = kStages - 1;
    for (int s = 0; s < kLoadAhead && kt0 + s < kt1; ++s) load_codes(kt0 + s, s);
    pdl_enter();

    const __nv_bfloat16* tsrc[kTokCopies];
    uint32_t tdst[kTokCopies], tbytes[kTokCopies];
#pragma unroll
    for (int i = 0; i < kTokCopies; ++i) {
        const int r = (tid >> 3) + 32 * i, ch = tid & 7, m = m0 + r;
        tbytes[i] = m < g.M ? 16 : 0;
        tsrc[i] = g.a + static_cast<int64_t>(m < g.M ? m : 0) * K + ch * 8;
        tdst[i] = sw128_offset(r, ch);
    }
    auto load_tokens = [&](int kt, int s) {
        uint8_t* st = smem + s * S::kStage;
#pragma unroll
        for (int i = 0; i < kTokCopies; ++i) cp_async16(st + tdst[i], tsrc[i] + kt * kBK, tbytes[i]);
    };

    // a[s]: the m64 x k16 A fragment of k16 step s of the stage: rows g and g + 8 of the warp's 16, this thread's
    // code bytes 16 t4 .. 16 t4 + 15 (one scale block), bytes 4s, 4s + 1 at fragment k 2t4, 2t4 + 1 and bytes
    // 4s + 2, 4s + 3 at 2t4 + 8, 2t4 + 9 (the order act_quant_bf16 gives the token rows).
    const int g4 = lane >> 2, t4 = lane & 3, R0 = wg * 64 + wq * 16 + g4;
    const uint8_t* srow = scales + (R0 / g.block) * nkb;
    auto dequantise = [&](const uint8_t* st, int kt, uint32_t (&a)[4][4]) {
        const uint4 c0 = *reinterpret_cast<const uint4*>(st + S::kBStage + R0 * kBK + 16 * t4);
        const uint4 c1 = *reinterpret_cast<const uint4*>(st + S::kBStage + (R0 + 8) * kBK + 16 * t4);
        const ScaleFactors f = e4m3_ue8m0_factors(srow[(kt * kBK + 16 * t4) / g.block]);
        const uint32_t w0[4] = {c0.x, c0.y, c0.z, c0.w}, w1[4] = {c1.x, c1.y, c1.z, c1.w};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            uint32_t p0[2], p1[2];
            e4m3x4_to_bf16(w0[s], p0);
            e4m3x4_to_bf16(w1[s], p1);
            a[s][0] = mul_bf16x2_rn(p0[0], f.f1);
            a[s][1] = mul_bf16x2_rn(p1[0], f.f1);
            a[s][2] = mul_bf16x2_rn(p0[1], f.f1);
            a[s][3] = mul_bf16x2_rn(p1[1], f.f1);
        }
        if (__any_sync(0xffffffffu, f.two)) {  // scales above 2^7 (rare): a second multiply, warp-uniform
            const uint32_t f2 = f.two ? f.f2 : pow2_bf16x2(0);
#pragma unroll
            for (int s = 0; s < 4; ++s)
#pragma unroll
                for (int j = 0; j < 4; ++j) a[s][j] = mul_bf16x2_rn(a[s][j], f2);
        }
    };

    float acc[NT / 2];
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc[i] = 0.0f;
    // One commit group a stage (the first also holds the codes copied before the wait).
#pragma unroll
    for (int s = 0; s < kLoadAhead; ++s) {
        if (kt0 + s < kt1) load_tokens(kt0 + s, s);
        cp_async_commit();
    }
    uint32_t frag[4][4];
    for (int kt = kt0; kt < kt1; ++kt) {
        const int i = kt - kt0;
        cp_async_wait<kLoadAhead - 1>();
        proxy_fence();
        __syncthreads();  // every warpgroup's MMAs on the stage refilled next are complete (waited below)
        if (kt + kLoadAhead < kt1) {
            load_codes(kt + kLoadAhead, (i + kLoadAhead) % kStages);
            load_tokens(kt + kLoadAhead, (i + kLoadAhead) % kStages);
        }
        cp_async_commit();
        const uint8_t* st = smem + (i % kStages) * S::kStage;
        dequantise(st, kt, frag);
        const uint32_t b0 = smem_addr(st);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s) wgmma_rs(acc, frag[s], desc_sw128(b0 + s * 32));
        wgmma_commit();
        wgmma_wait<0>();
    }
    cp_async_wait<0>();
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) hold(acc[i]);

    // acc[4j + q]: weight row wq*16 + g4 + 8*(q >> 1) of the warpgroup's 64, token column 8j + 2*t4 + (q & 1).
    const int64_t N = l.N, NP = g.l0.N + g.l1.N, nP = second ? g.l0.N : 0;  // NP, nP: the partial sums' columns
#pragma unroll
    for (int j = 0; j < NT / 8; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int m = m0 + 8 * j + 2 * t4 + (q & 1);
            if (m >= g.M) continue;
            const int64_t n = n0 + R0 + 8 * (q >> 1);
            if (g.splits == 1) l.y[m * N + n] = round_bf16(acc[4 * j + q]);
            else g.partial[(static_cast<int64_t>(split) * g.M + m) * NP + nP + n] = acc[4 * j + q];
        }
}

// y = bf16(sum of the slices' partial sums, in slice order), four outputs a thread: row m's first N0 columns to
// y0 (N0 a row), the rest to y1.
__global__ void reduce_kernel(const float4* partial, int splits, int64_t n4, int N0, int N1, float* y0, float* y1) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n4) return;
    float4 s = partial[i];
    for (int k = 1; k < splits; ++k) {
        const float4 p = partial[k * n4 + i];
        s.x += p.x, s.y += p.y, s.z += p.z, s.w += p.w;
    }
    const int64_t m = 4 * i / (N0 + N1), n = 4 * i - m * (N0 + N1);  // N0 and N1 are multiples of 4
    float* y = n < N0 ? y0 + m * N0 + n : y1 + m * N1 + (n - N0);
    *reinterpret_cast<float4*>(y) = make_float4(round_bf16(s.x), round_bf16(s.y), round_bf16(s.z), round_bf16(s.w));
}

template <int NT>
void launch(const Args& g) {
    smem_opt_in<fp8_wgmma_kernel<NT>>(Shape<NT>::kSmem);
    const dim3 grid(static_cast<unsigned>((g.M + NT - 1) / NT), static_cast<unsigned>((g.l0.N + g.l1.N) / kRows),
                    static_cast<unsigned>(g.splits));
    launch_pdl(fp8_wgmma_kernel<NT>, grid, dim3(kThreads), Shape<NT>::kSmem, g);
}

}  // namespace

bool linear_wgmma_supported(const LinearDev& w, int64_t M) {
    const int b = w.weight_block;
    return w.kind == 2 && (b == 32 || b == 64 || b == 128) && w.act_block == b && w.scale != nullptr &&
           w.out % kRows == 0 && w.in % kBK == 0 && (kRows / b) * ((w.in + b - 1) / b) <= kScaleBytes && M > 0 &&
           M <= 256;
}

void linear_wgmma_pair(const float* x, int64_t M, const LinearDev& w0, float* y0, const LinearDev* w1, float* y1) {
    if (!linear_wgmma_supported(w0, M) || !act_quant_bf16_supported(x, w0.in, w0.act_block) ||
        (w1 && (!linear_wgmma_supported(*w1, M) || w1->in != w0.in || w1->weight_block != w0.weight_block)))
        cuda_fail(cudaErrorInvalidValue, "linear_wgmma: unsupported shape", __FILE__, __LINE__);
    const int K = w0.in, N0 = w0.out, N1 = w1 ? w1->out : 0, NT = M <= 64 ? 64 : 128;
    auto image = device_alloc(static_cast<size_t>(M) * K * 2);
    act_quant_bf16(x, M, K, w0.act_block, static_cast<uint16_t*>(image.get()), true);
    // Enough slices for two blocks on every SM, each at least kMinSliceStages stages long.
    const int64_t blocks = (M + NT - 1) / NT * ((N0 + N1) / kRows);
    const int splits = static_cast<int>(
        std::clamp<int64_t>((2 * sm_count() + blocks - 1) / blocks, 1, std::max(1, K / kBK / kMinSliceStages)));
    Args g{static_cast<const __nv_bfloat16*>(image.get()),
           {static_cast<const uint8_t*>(w0.w), w0.scale, N0, y0},
           {w1 ? static_cast<const uint8_t*>(w1->w) : nullptr, w1 ? w1->scale : nullptr, N1, y1},
           static_cast<int>(M), K, w0.weight_block, splits, nullptr};
    std::shared_ptr<void> partial;
    if (splits > 1) {
        partial = device_alloc(sizeof(float) * static_cast<size_t>(splits) * M * (N0 + N1));
        g.partial = static_cast<float*>(partial.get());
    }
    if (NT == 64) launch<64>(g);
    else launch<128>(g);
    if (splits > 1) {
        const int64_t n4 = M * (N0 + N1) / 4;
        launch_pdl(reduce_kernel, dim3(static_cast<unsigned>((n4 + 255) / 256)), dim3(256), 0,
                   reinterpret_cast<const float4*>(g.partial), splits, n4, N0, N1, y0, y1);
    }
}

void linear_wgmma(const float* x, int64_t M, const LinearDev& w, float* y) {
    linear_wgmma_pair(x, M, w, y, nullptr, nullptr);
}

}  // namespace peregrine::cuda
