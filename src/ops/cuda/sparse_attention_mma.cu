// Tensor-core sparse attention (Numerics::Fast): for each query token t, the 64 heads of one head group
// attend to the token's key list (one shared K=V latent of 512 per key) as two small GEMMs per block of 64
// keys on bf16 mma.sync m16n8k16 with fp32 accumulation: S = Q K^T [64 heads x 64 keys], the block's online
// softmax, O += P V [64 x 512].
//
// Numerics against the exact kernel (attention_kernels.cu, cf. cpu/attention.cpp sparse_attend):
//  - Operands are exact in bf16: queries are bf16-rounded (linear output, RoPE rounds to bf16), keys are
//    e4m3 values times power-of-two scales (window, V4 compressed; V4's RoPE dims are bf16) or e2m1 times
//    e4m3 scales (V4.1 compressed): at most 6 significant bits, far inside bf16's range. So every product is
//    the reference's; only the summation order differs: q.k in fp32 in tensor-core order instead of exactly
//    (double) then rounded, the block sum of probabilities as a tree instead of in key order, and P.V
//    accumulated straight into the fp32 output accumulators (after the rescale) instead of a per-block
//    double sum added to them.
//  - Kept: the 64-key blocks from the first key, the running maximum starting at -1e30, the scale applied to
//    the fp32 dot product, probabilities exp(s - m) summed unrounded but multiplied into V rounded to bf16,
//    the sink added unscaled to the denominator at the end, the output rounded to bf16. The per-key
//    exponentials use CUDA's expf (within 2 ulp; correctly rounded exp_cr in double would cost as much as
//    the block's mma work, and the fp32 dot products already move s by more than that); the per-row
//    rescales and the sink use exp_cr as the exact kernel does.
//  - Split keys (few queries: decode): each split of whole 64-key blocks runs its own online softmax and a
//    combine kernel merges them (max, rescaled sums, then the sink). The probabilities are then rounded to
//    bf16 relative to the split's running maximum instead of the whole list's, so outputs can move by a
//    bf16 step of their size (the single-split path keeps the reference's maxima).
//
// Layout: one CTA (8 or 16 warps, see sparse_warps) per (query, group of 64 heads, key split). Shared memory
// holds the queries as bf16 (64 x 512) and two 64-key K=V buffers as bf16, filled from the packed state entries
// (kv/entry_format.h: e4m3 or e2m1 codes with their scales, V4's bf16 RoPE dims) by a register prefetch of the next
// block's raw bytes in four 16-key chunks interleaved with the current block's math, decoded exactly as they are
// stored to shared memory. S: warp (mh, ng) computes heads 32 mh.. x keys 16 ng..; the row maxima and sums cross
// the four key groups through shared memory. P.V: warp w owns output dims 64 w.. of all 64 heads (128 fp32
// accumulators per thread). With 16 warps each has half of that and of S (kernel comment).
#include "ops/cuda/device_math.cuh"
#include "util/switches.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/rope_qdq.cuh"
#include "ops/cuda/sparse_keys.cuh"

#include <cuda_bf16.h>

#include <algorithm>

namespace peregrine::cuda {

namespace {

using namespace sparse;

constexpr int kRow = kDim + 8;   // bf16 per shared row of Q and K: 1040 B, so ldmatrix rows hit distinct banks
constexpr int kPRow = kBlk + 8;  // bf16 per shared row of P: 144 B

constexpr size_t kSmemBytes =
    sizeof(__nv_bfloat16) * (static_cast<size_t>(kHeads) * kRow + 2 * kBlk * kRow + kHeads * kPRow) +
    sizeof(float) * (2 * 4 * kHeads + 3 * kHeads) + sizeof(int) * 2 * kBlk;

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __nv_bfloat16* p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* dst, float4 v) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
}

// Decodes the chunk into its shared-memory row.
__device__ __forceinline__ void store_chunk(const Chunk& c, __nv_bfloat16* kbuf, int* valid, int chunk) {
    const int kc = threadIdx.x >> 4, part = threadIdx.x & 15;
    const int r = chunk * kChunkKeys + kc;
    uint32_t o[kPartDims / 2];  // bf16 pairs
    const bool real = decode_chunk(c, o);
    uint4* dst = reinterpret_cast<uint4*>(kbuf + r * kRow + kPartDims * part);
#pragma unroll
    for (int u = 0; u < kPartDims / 8; ++u) dst[u] = make_uint4(o[4 * u], o[4 * u + 1], o[4 * u + 2], o[4 * u + 3]);
    if (part == 0) valid[r] = real;
}

// NW warps: 8 (warp (mh, ng): heads 32 mh.. x keys 16 ng.. of S; output dims 64 w..) or 16 (heads 16 mh.. x keys
// 16 ng..; output dims 32 w..: half the accumulators a thread, twice the warps an SM can switch between). Every
// output sums the same products in the same order either way, so the two give the same bits. The first 256
// threads prefetch and decode the keys.
template <int NW>
__global__ void __launch_bounds__(NW * 32, 1) sparse_attention_mma_kernel(MmaArgs a) {
    pdl_enter();
    static_assert(NW == 8 || NW == 16, "warps");
    constexpr int MI = NW == 8 ? 2 : 1;  // m16 head tiles of S a warp
    constexpr int HG = 4 / MI;           // head groups of S (x 4 key groups = NW warps)
    constexpr int DW = kDim / NW;        // output dims a warp
    constexpr int NP = DW / 16;          // 16-dim V fragments a warp per key step
    extern __shared__ float4 smem_f4[];
    __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem_f4);  // [kHeads][kRow]
    __nv_bfloat16* Ks = Qs + kHeads * kRow;                          // [2][kBlk][kRow]
    __nv_bfloat16* Ps = Ks + 2 * kBlk * kRow;                        // [kHeads][kPRow]
    float* red_max = reinterpret_cast<float*>(Ps + kHeads * kPRow);  // [4][kHeads]
    float* red_sum = red_max + 4 * kHeads;                           // [4][kHeads]
    float* m_run = red_sum + 4 * kHeads;                             // [kHeads]
    float* l_run = m_run + kHeads;
    float* resc = l_run + kHeads;                                    // per block rescale, at the end the sum
    int* valid = reinterpret_cast<int*>(resc + kHeads);              // [2][kBlk]

    const int G = a.H / kHeads;
    const int64_t t = blockIdx.x / G;
    const int hg = static_cast<int>(blockIdx.x % G);
    const int split = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    const bool loader = tid < kCtaThreads;
    const int64_t row0 = t * a.H + static_cast<int64_t>(hg) * kHeads;  // first (token, head) row of the CTA

    const int n = a.keys.count(t), nwin = a.keys.windows(t);
    const int nblk = (n + kBlk - 1) / kBlk;
    const int b_begin = split * a.blocks_per_split, b_end = min(nblk, b_begin + a.blocks_per_split);

    if (tid < kHeads) {
        m_run[tid] = -1e30f;
        l_run[tid] = 0.0f;
    }
    {  // queries -> bf16 (exact: they are bf16 values)
        const float4* q4 = reinterpret_cast<const float4*>(a.q + row0 * kDim);
        for (int i = tid; i < kHeads * kDim / 4; i += NW * 32) {
            const int r = i / (kDim / 4), c4 = i % (kDim / 4);
            store_bf16x4(Qs + r * kRow + 4 * c4, __ldg(q4 + i));
        }
    }
    Chunk pf;
    if (b_begin < b_end && loader)
        for (int c = 0; c < kChunks; ++c) {
            bool w = true;
            const uint8_t* p = chunk_key(a.keys, t, n, nwin, b_begin * kBlk + c * kChunkKeys, &w);
            load_chunk(pf, p, w ? a.keys.r.win : a.keys.r.comp);
            store_chunk(pf, Ks, valid, c);
        }
    __syncthreads();

    float acc[4][2 * NP][4];  // O: heads 16 mt + g (+8), dims DW warp + 8 nt + 2 tq (+1)
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2 * NP; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

    const int mh = warp % HG, ng = warp / HG;  // S tile: heads 16 MI mh .. + 16 MI, keys 16 ng .. +16
    for (int b = b_begin; b < b_end; ++b) {
        const int buf = (b - b_begin) & 1;
        const bool next = b + 1 < b_end;
        const __nv_bfloat16* K = Ks + buf * kBlk * kRow;
        __nv_bfloat16* Kn = Ks + (buf ^ 1) * kBlk * kRow;
        int* vn = valid + (buf ^ 1) * kBlk;
        // The next block's key addresses up front, so that each chunk's loads wait for one latency only.
        const uint8_t* kp[kChunks];
        bool kw[kChunks];
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
            kw[c] = true;
            kp[c] = next && loader ? chunk_key(a.keys, t, n, nwin, (b + 1) * kBlk + c * kChunkKeys, &kw[c]) : nullptr;
        }

        // ---- S = Q K^T for the warp's 16 MI heads x 16 keys, in two halves of the 512 dims.
        float s[MI][2][4];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int nj = 0; nj < 2; ++nj)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mi][nj][e] = 0.0f;
        const __nv_bfloat16* qa = Qs + (16 * MI * mh + (lane & 15)) * kRow + (lane >> 4) * 8;
        const __nv_bfloat16* kb = K + (16 * ng + (lane & 7) + ((lane >> 4) << 3)) * kRow + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (next && loader) {
                if (half == 1) store_chunk(pf, Kn, vn, 0);
                load_chunk(pf, kp[half], kw[half] ? a.keys.r.win : a.keys.r.comp);
            }
#pragma unroll
            for (int kk = half * 16; kk < half * 16 + 16; ++kk) {
                uint32_t qf[MI][4], kf[4];
#pragma unroll
                for (int mi = 0; mi < MI; ++mi) ldsm_x4(qf[mi], qa + 16 * mi * kRow + 16 * kk);
                ldsm_x4(kf, kb + 16 * kk);
#pragma unroll
                for (int mi = 0; mi < MI; ++mi) {
                    mma_bf16(s[mi][0], qf[mi], kf[0], kf[1]);
                    mma_bf16(s[mi][1], qf[mi], kf[2], kf[3]);
                }
            }
        }

        // ---- Online softmax of the block (rows = heads). Masked keys score -inf.
        const int* vb = valid + buf * kBlk;
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int nj = 0; nj < 2; ++nj)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = 16 * ng + 8 * nj + 2 * tq + (e & 1);
                    s[mi][nj][e] = vb[key] ? s[mi][nj][e] * a.scale : -INFINITY;
                }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                float mx =
                    fmaxf(fmaxf(s[mi][0][2 * hf], s[mi][0][2 * hf + 1]), fmaxf(s[mi][1][2 * hf], s[mi][1][2 * hf + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                if (tq == 0) red_max[ng * kHeads + 16 * MI * mh + 16 * mi + 8 * hf + g] = mx;
            }
        __syncthreads();
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = 16 * MI * mh + 16 * mi + 8 * hf + g;
                const float m_new = fmaxf(fmaxf(m_run[r], fmaxf(red_max[r], red_max[kHeads + r])),
                                          fmaxf(red_max[2 * kHeads + r], red_max[3 * kHeads + r]));
                float sum = 0.0f;
#pragma unroll
                for (int nj = 0; nj < 2; ++nj) {
                    const float p0 = expf(s[mi][nj][2 * hf] - m_new), p1 = expf(s[mi][nj][2 * hf + 1] - m_new);
                    sum += p0 + p1;
                    *reinterpret_cast<uint32_t*>(Ps + r * kPRow + 16 * ng + 8 * nj + 2 * tq) = pack_bf16(p0, p1);
                }
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                if (tq == 0) red_sum[ng * kHeads + r] = sum;
            }
        __syncthreads();
        if (tid < kHeads) {
            const int r = tid;
            const float m_old = m_run[r];
            const float m_new = fmaxf(fmaxf(m_old, fmaxf(red_max[r], red_max[kHeads + r])),
                                      fmaxf(red_max[2 * kHeads + r], red_max[3 * kHeads + r]));
            const float rs = exp_cr(m_old - m_new);
            l_run[r] = l_run[r] * rs +
                       (((red_sum[r] + red_sum[kHeads + r]) + red_sum[2 * kHeads + r]) + red_sum[3 * kHeads + r]);
            m_run[r] = m_new;
            resc[r] = rs;
        }
        __syncthreads();

        // ---- O = O * rescale + P V over the warp's DW dims, in two halves of the 64 keys.
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
            const float r0 = resc[16 * mt + g], r1 = resc[16 * mt + g + 8];
#pragma unroll
            for (int nt = 0; nt < 2 * NP; ++nt) {
                acc[mt][nt][0] *= r0;
                acc[mt][nt][1] *= r0;
                acc[mt][nt][2] *= r1;
                acc[mt][nt][3] *= r1;
            }
        }
        const __nv_bfloat16* pa = Ps + (lane & 15) * kPRow + (lane >> 4) * 8;
        const __nv_bfloat16* vbp = K + ((lane & 7) + ((lane >> 3) & 1) * 8) * kRow + DW * warp + (lane >> 4) * 8;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (next && loader) {
                store_chunk(pf, Kn, vn, 1 + half);
                load_chunk(pf, kp[2 + half], kw[2 + half] ? a.keys.r.win : a.keys.r.comp);
            }
#pragma unroll
            for (int ks = 2 * half; ks < 2 * half + 2; ++ks) {
                uint32_t pf4[4][4];
#pragma unroll
                for (int mt = 0; mt < 4; ++mt) ldsm_x4(pf4[mt], pa + 16 * mt * kPRow + 16 * ks);
#pragma unroll
                for (int np = 0; np < NP; ++np) {
                    uint32_t vf[4];
                    ldsm_x4_trans(vf, vbp + 16 * ks * kRow + 16 * np);
#pragma unroll
                    for (int mt = 0; mt < 4; ++mt) {
                        mma_bf16(acc[mt][2 * np], pf4[mt], vf[0], vf[1]);
                        mma_bf16(acc[mt][2 * np + 1], pf4[mt], vf[2], vf[3]);
                    }
                }
            }
        }
        if (next && loader) store_chunk(pf, Kn, vn, 3);
        __syncthreads();  // the next block's keys are in place; this block's buffers may be refilled
    }

    if (a.out) {  // one split: the sink, normalise, round
        if (tid < kHeads) resc[tid] = l_run[tid] + exp_cr(a.sink[hg * kHeads + tid] - m_run[tid]);
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = 16 * mt + 8 * hf + g;
                const float l = resc[r];
                float* o = a.out + (row0 + r) * kDim + DW * warp + 2 * tq;
#pragma unroll
                for (int nt = 0; nt < 2 * NP; ++nt)
                    *reinterpret_cast<float2*>(o + 8 * nt) =
                        make_float2(round_bf16(acc[mt][nt][2 * hf] / l), round_bf16(acc[mt][nt][2 * hf + 1] / l));
            }
    } else {  // partial result of this split
        const int64_t prow = static_cast<int64_t>(split) * a.T * a.H + row0;
        if (tid < kHeads) {
            a.part_ml[(prow + tid) * 2] = m_run[tid];
            a.part_ml[(prow + tid) * 2 + 1] = l_run[tid];
        }
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = 16 * mt + 8 * hf + g;
                float* o = a.part_o + (prow + r) * kDim + DW * warp + 2 * tq;
#pragma unroll
                for (int nt = 0; nt < 2 * NP; ++nt)
                    *reinterpret_cast<float2*>(o + 8 * nt) = make_float2(acc[mt][nt][2 * hf], acc[mt][nt][2 * hf + 1]);
            }
    }
}

// Merges the key splits of one (token, head) row: common maximum, rescaled sums, the sink, bf16. Block (row, y)
// writes dims 128 y.., a thread each; each split's factor exp(m_s - m) is computed once, by a thread of its own
// (a block per row recomputing it per output and split, in double, took ~14 us a call at decode). With rope.pos,
// then the inverse RoPE of the rotary dims: rope_pair on the pair (c, c + 1) held by two neighbouring lanes, each
// keeping its own result (rope_kernel's arithmetic on the rounded outputs, the same bits).
constexpr int kCombineThreads = 128;
constexpr int kMaxSplits = 256;
__global__ void sparse_attention_combine_kernel(const float* part_o, const float* part_ml, int64_t rows, int nsplit,
                                                int H, const float* sink, float* out, OutputRope rope) {
    pdl_enter();
    __shared__ float f[kMaxSplits];
    const int64_t row = blockIdx.x;
    const int h = static_cast<int>(row % H);
    float m = -INFINITY;
    for (int s = 0; s < nsplit; ++s) m = fmaxf(m, part_ml[(s * rows + row) * 2]);
    for (int s = threadIdx.x; s < nsplit; s += blockDim.x) f[s] = exp_cr(part_ml[(s * rows + row) * 2] - m);
    __syncthreads();
    float l = 0.0f;
    for (int s = 0; s < nsplit; ++s) l += part_ml[(s * rows + row) * 2 + 1] * f[s];
    l += exp_cr(sink[h] - m);
    const int c = blockIdx.y * kCombineThreads + threadIdx.x;
    float o = 0.0f;
    for (int s = 0; s < nsplit; ++s) o += part_o[(s * rows + row) * kDim + c] * f[s];
    float v = round_bf16(o / l);
    if (rope.pos) {
        const float other = __shfl_xor_sync(0xffffffffu, v, 1);
        const int from = kDim - rope.dim;
        if (c >= from) {
            const bool odd = c & 1;
            float a = odd ? other : v, b = odd ? v : other;
            rope_pair(a, b, rope.pos[row / H], rope.freqs, (c - from) / 2, true);
            v = odd ? b : a;
        }
    }
    out[row * kDim + c] = v;
}
static_assert(kDim % kCombineThreads == 0, "combine: whole blocks of dims");

// Key splits: one per 64-key block at most, enough CTAs to cover the SMs once (one CTA fills an SM).
int split_count(int64_t T, int H, int maxk) {
    const int64_t ctas = T * (H / kHeads);
    const int nblk = std::max((maxk + kBlk - 1) / kBlk, 1);
    if (ctas >= sm_count()) return 1;
    return static_cast<int>(
        std::clamp<int64_t>(sm_count() / std::max<int64_t>(ctas, 1), 1, std::min(nblk, kMaxSplits)));
}

// A format the chunk loader reads: 16-byte aligned pieces of 32 dims, at most four scales per piece.
bool mma_format_supported(const EntryFormat& f) {
    if (f.dim != kDim || f.block <= 0 || f.bytes % 16 != 0) return false;
    const bool blocks =
        f.block >= kPartDims ? f.block % kPartDims == 0 : (kPartDims % f.block == 0 && kPartDims / f.block <= 4);
    if (f.kind == kEntryFp8)
        return blocks && f.quant_dims % kPartDims == 0 && f.quant_dims % f.block == 0 && f.bf16_offset % 16 == 0;
    return blocks && f.quant_dims == f.dim;
}

// 0: by size. On the H200 16-warp CTAs took 2.71 against 3.02 ms at 4,096 queries and 0.25 against 0.28 at 256,
// but were no faster or slower at decode sizes (0.050 against 0.042 ms at 8 queries), where there are few CTAs.
int& sparse_warps() {  // PEREGRINE_SPARSE_WARPS=8 or 16 fixes the CTA size
    static int nw = switch_is("PEREGRINE_SPARSE_WARPS", "16") ? 16 : switch_is("PEREGRINE_SPARSE_WARPS", "8") ? 8 : 0;
    return nw;
}
constexpr int64_t kWideFrom = 256;  // queries from which CTAs have 16 warps, when by size

}  // namespace

void sparse_attention_mma_use_warps(int nw) { sparse_warps() = nw == 16 || nw == 8 ? nw : 0; }

bool sparse_attention_mma_supported(int H, int D, const EntryFormat& win, const EntryFormat& comp) {
    return D == kDim && H > 0 && H % kHeads == 0 && mma_format_supported(win) && mma_format_supported(comp);
}

size_t sparse_attention_mma_workspace(int64_t T, int H, int D, int maxk) {
    if (T == 0 || D != kDim || H <= 0 || H % kHeads != 0) return 0;
    const int ns = split_count(T, H, maxk);
    return ns == 1 ? 0 : sizeof(float) * static_cast<size_t>(ns) * T * H * (kDim + 2);
}

void sparse_attention_mma(const float* q, int64_t T, int H, int D, float scale, const float* sink,
                          const KeyRefs& keys, float* out, void* workspace, const OutputRope& rope) {
    if (T == 0) return;
    if (!sparse_attention_mma_supported(H, D, keys.win, keys.nwin ? keys.comp : keys.win))
        cuda_fail(cudaErrorInvalidValue,
                  "sparse_attention_mma: needs 512-wide heads in groups of 64 and readable key formats", __FILE__,
                  __LINE__);
    const int maxk = keys.maxk;
    const int64_t ctas = T * (H / kHeads);
    if (ctas > 0x7fffffff) cuda_fail(cudaErrorInvalidValue, "sparse_attention_mma: too many rows", __FILE__, __LINE__);
    smem_opt_in<sparse_attention_mma_kernel<8>>(kSmemBytes);
    smem_opt_in<sparse_attention_mma_kernel<16>>(kSmemBytes);
    const int ns = split_count(T, H, maxk);
    const int nblk = std::max((maxk + kBlk - 1) / kBlk, 1);
    MmaArgs a{q, T, H, scale, sink, KeyList{keys}, out, nullptr, nullptr, (nblk + ns - 1) / ns};
    if (ns > 1) {
        if (!workspace) cuda_fail(cudaErrorInvalidValue, "sparse_attention_mma: workspace missing", __FILE__, __LINE__);
        a.out = nullptr;
        a.part_o = static_cast<float*>(workspace);
        a.part_ml = a.part_o + static_cast<size_t>(ns) * T * H * kDim;
    }
    const dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>(ns));
    const int nw = sparse_warps() ? sparse_warps() : T >= kWideFrom ? 16 : 8;
    if (nw == 16)
        launch_pdl(sparse_attention_mma_kernel<16>, grid, dim3(16 * 32), kSmemBytes, a);
    else
        launch_pdl(sparse_attention_mma_kernel<8>, grid, dim3(8 * 32), kSmemBytes, a);
    if (ns > 1) {
        launch_pdl(sparse_attention_combine_kernel, dim3(static_cast<unsigned>(T * H), kDim / kCombineThreads),
                   dim3(kCombineThreads), 0, a.part_o, a.part_ml, T * H, ns, H, sink, out, rope);
    } else if (rope.pos) {
        cuda::rope(out, T, H, static_cast<int64_t>(H) * kDim, kDim, kDim - rope.dim, rope.pos, rope.freqs, rope.dim,
                   true);
    }
}

}  // namespace peregrine::cuda
