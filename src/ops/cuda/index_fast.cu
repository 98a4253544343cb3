// Fast indexer kernels (Numerics::Fast): scoring every query against every compressed key, and the top-k
// selections over the scores (cf. attention_kernels.cu for the exact ones, cpu/attention.cpp for the
// reference).
//
// Scoring keeps the reference's rounding points per head: bf16(q.k), relu, x weight, bf16, summed over heads
// in head order in fp32, bf16. Only the 128-term dot products are summed in fp32 instead of exactly: q and k
// are fp4 (e2m1) values times a power-of-two scale per 32 dims, so every product is exact and the partial
// sums are exact too whenever the four blocks' scales lie within 2^10 of each other (then the fp32 result is
// the reference's); otherwise they differ by fp32 rounding before the bf16 rounding.
//  - index_scores_stream (decode, or few rows per sequence): one thread per (row, key) holds the 128-float
//    key in registers and reads the row's queries from shared memory, so keys stream at memory speed.
//  - index_scores_mma (prefill: many rows of one sequence against the same keys): q and k are exact in bf16
//    (fp4 values with power-of-two scales, already bf16-rounded), so bf16 mma.sync m16n8k16 with fp32
//    accumulation computes the same products; a 64-query x 128-key tile runs every head through the tensor
//    cores and folds the per-head result into the score in registers, so no [T*heads, keys] intermediate is
//    written.
// Selection: a radix select per row (one CTA per row) that streams the row: four 8-bit histogram passes with
// warp-aggregated shared atomics (bf16 scores pile up in few bins), stopping early once the k-th value's bin
// is taken whole, then one counting pass and one ordered write pass per warp-contiguous chunk (ballots).
// The selected set and order are the exact kernels' (ties to the lower index), so only scoring differs.
#include "ops/cuda/cp_async.cuh"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/entry_decode.h"
#include "util/switches.h"
#include "ops/cuda/gemv_common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/pdl.cuh"

#include <cuda_bf16.h>

#include <algorithm>

namespace peregrine::cuda {

namespace {

// ---------------------------------------------------------------------------------------------------
// Streaming scorer.
constexpr int kStreamThreads = 128, kStreamMaxDim = 128;  // ~170 registers: 3 CTAs per SM overlap loads and math

// The key's values decoded from its packed entry: the indexer's fp4 keys of 128 (ue8m0 per 32) as four 16-byte
// code loads and one word of scales; any other format value by value.
__device__ __forceinline__ void load_key(const uint8_t* p, const EntryFormat& kf, float (&k)[kStreamMaxDim]) {
    if (kf.kind == kEntryFp4Ue8m0 && kf.dim == 128 && kf.block == 32 && kf.scale_offset == 64 &&
        (reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
        const uint4* p4 = reinterpret_cast<const uint4*>(p);
        const uint32_t sw = __ldg(reinterpret_cast<const uint32_t*>(p + 64));
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // 16 bytes = 32 values = one scale block
            const uint4 v = __ldg(p4 + q);
            const float s = sf_ue8m0(static_cast<uint8_t>(sw >> (8 * q)));
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int n = 0; n < 8; ++n)
                    k[32 * q + 8 * i + n] = sf_e2m1(static_cast<uint8_t>((w[i] >> (4 * n)) & 15u)) * s;
        }
    } else {
#pragma unroll
        for (int c = 0; c < kStreamMaxDim; ++c)
            if (c < kf.dim) k[c] = entry_value(kf, p, c);
    }
}

// Grid: x over keys, y over the listed rows. Shared: the row's queries [nh, hd] then its weights [nh].
__global__ void __launch_bounds__(kStreamThreads) index_stream_kernel(
    const float* iq, const float* wts, const int32_t* row_list, int n_rows, int nh, int hd, const int64_t* width,
    const int64_t* visible, const int64_t* keybase, const uint8_t* const* keys, EntryFormat kf, int64_t stride,
    float* scores) {
    pdl_enter();
    extern __shared__ float4 stream_smem[];
    float* qs = reinterpret_cast<float*>(stream_smem);
    float* ws = qs + nh * hd;
    for (int ri = blockIdx.y; ri < n_rows; ri += gridDim.y) {
        const int64_t t = row_list ? row_list[ri] : ri;
        __syncthreads();
        for (int i = threadIdx.x; i < nh * hd; i += blockDim.x) qs[i] = iq[t * nh * hd + i];
        for (int i = threadIdx.x; i < nh; i += blockDim.x) ws[i] = wts[t * nh + i];
        __syncthreads();
        const int64_t lim = min(width[t], visible[t]);
        for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < stride;
             j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
            float out = -INFINITY;
            if (j < lim) {
                float k[kStreamMaxDim];
                load_key(keys[keybase[t] + j], kf, k);
                float acc = 0.0f;
                for (int h = 0; h < nh; ++h) {
                    const float* q = qs + h * hd;
                    // Four interleaved fp32 partial sums (dims c mod 4), added pairwise at the end.
                    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll
                    for (int c = 0; c < kStreamMaxDim; c += 4)
                        if (c < hd) {
                            const float4 qv = *reinterpret_cast<const float4*>(q + c);
                            s0 = __fmaf_rn(qv.x, k[c], s0);
                            s1 = __fmaf_rn(qv.y, k[c + 1], s1);
                            s2 = __fmaf_rn(qv.z, k[c + 2], s2);
                            s3 = __fmaf_rn(qv.w, k[c + 3], s3);
                        }
                    const float d = round_bf16((s0 + s1) + (s2 + s3));
                    acc += round_bf16(fmaxf(d, 0.0f) * ws[h]);
                }
                out = round_bf16(acc);
            }
            scores[t * stride + j] = out;
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Tensor-core scorer: CTA tile of kBT queries x kBN keys, 8 warps as 2 (queries) x 4 (keys), 32 x 32 each.
constexpr int kBT = 64, kBN = 128, kHD = 128, kRowE = kHD + 8;  // smem rows padded by 16 B: no bank conflicts
constexpr int kMmaThreads = 256, kMmaMaxHeads = 64;

__device__ __forceinline__ uint32_t lds32(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// m16n8k16 operand fragments from bf16 rows kRowE apart in shared memory, p at this lane's row (g) and k (2 tq):
// A, 16 rows x 16 k; B, 8 keys x 16 k.
__device__ __forceinline__ void frag_a(const __nv_bfloat16* p, uint32_t (&a)[4]) {
    a[0] = lds32(p);
    a[1] = lds32(p + 8 * kRowE);
    a[2] = lds32(p + 8);
    a[3] = lds32(p + 8 * kRowE + 8);
}
__device__ __forceinline__ void frag_b(const __nv_bfloat16* p, uint32_t (&b)[2]) {
    b[0] = lds32(p);
    b[1] = lds32(p + 8);
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

constexpr size_t kMmaSmemBytes = sizeof(__nv_bfloat16) * (kBN + 2 * kBT) * kRowE +
                                 sizeof(float) * kMmaMaxHeads * kBT + sizeof(int64_t) * kBT;

// tiles[4 * y] = (first row, rows <= kBT, first key in kb, keys of the sequence); x: key tile.
__global__ void __launch_bounds__(kMmaThreads) index_mma_kernel(const __nv_bfloat16* qb, const float* wts, int nh,
                                                                const int64_t* tiles, const __nv_bfloat16* kb,
                                                                const int64_t* visible, int64_t stride,
                                                                float* scores) {
    pdl_enter();
    extern __shared__ float4 mma_smem[];
    __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(mma_smem);
    __nv_bfloat16* Qs = Ks + kBN * kRowE;  // two buffers of [kBT][kRowE]
    float* Ws = reinterpret_cast<float*>(Qs + 2 * kBT * kRowE);  // [nh][kBT]
    int64_t* Lim = reinterpret_cast<int64_t*>(Ws + kMmaMaxHeads * kBT);  // per row: min(width, visible)
    const int64_t* td = tiles + 4 * static_cast<int64_t>(blockIdx.y);
    const int64_t row0 = td[0], kbase = td[2], width = td[3];
    const int nrows = static_cast<int>(td[1]);
    const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kBN;
    if (j0 >= stride) return;
    const int tid = threadIdx.x;
    for (int r = tid; r < kBT; r += blockDim.x) Lim[r] = r < nrows ? min(width, visible[row0 + r]) : 0;
    __syncthreads();
    int64_t lim_max = 0;
    for (int r = 0; r < nrows; ++r) lim_max = max(lim_max, Lim[r]);
    const int64_t jend = min(stride, j0 + kBN);
    if (j0 >= lim_max) {  // nothing visible in this tile
        for (int i = tid; i < nrows * kBN; i += blockDim.x) {
            const int64_t j = j0 + i % kBN;
            if (j < jend) scores[(row0 + i / kBN) * stride + j] = -INFINITY;
        }
        return;
    }
    // Keys (once) and the first head's queries.
    for (int i = tid; i < kBN * (kHD / 8); i += blockDim.x) {
        const int r = i / (kHD / 8), ch = i % (kHD / 8);
        const int64_t j = j0 + r;
        const bool ok = j < width;
        cp_async16(Ks + r * kRowE + ch * 8, ok ? kb + (kbase + j) * kHD + ch * 8 : kb, ok ? 16 : 0);
    }
    auto load_q = [&](int h, int buf) {
        __nv_bfloat16* dst = Qs + buf * kBT * kRowE;
        for (int i = tid; i < kBT * (kHD / 8); i += blockDim.x) {
            const int r = i / (kHD / 8), ch = i % (kHD / 8);
            const bool ok = r < nrows;
            cp_async16(dst + r * kRowE + ch * 8, ok ? qb + ((row0 + r) * nh + h) * kHD + ch * 8 : qb, ok ? 16 : 0);
        }
    };
    load_q(0, 0);
    cp_async_commit();
    for (int i = tid; i < nh * kBT; i += blockDim.x) {
        const int h = i / kBT, r = i % kBT;
        Ws[i] = r < nrows ? wts[(row0 + r) * nh + h] : 0.0f;
    }
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int wm = warp & 1, wn = warp >> 1;
    float acc[2][4][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

    for (int h = 0; h < nh; ++h) {
        if (h + 1 < nh) {
            load_q(h + 1, (h + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const __nv_bfloat16* Q = Qs + (h & 1) * kBT * kRowE;
        float dot[2][4][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) dot[mt][nt][e] = 0.0f;
#pragma unroll
        for (int k0 = 0; k0 < kHD; k0 += 16) {
            uint32_t a[2][4], b[4][2];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) frag_a(Q + (wm * 32 + mt * 16 + g) * kRowE + k0 + 2 * tq, a[mt]);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) frag_b(Ks + (wn * 32 + nt * 8 + g) * kRowE + k0 + 2 * tq, b[nt]);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) mma_bf16(dot[mt][nt], a[mt], b[nt][0], b[nt][1]);
        }
        // The reference's per-head rounding points, in head order.
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            const int ra = wm * 32 + mt * 16 + g;
            const float wa = Ws[h * kBT + ra], wb = Ws[h * kBT + ra + 8];
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float d = round_bf16(dot[mt][nt][e]);
                    acc[mt][nt][e] += round_bf16(fmaxf(d, 0.0f) * (e < 2 ? wa : wb));
                }
        }
        __syncthreads();  // the buffer just read is refilled next iteration
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = wm * 32 + mt * 16 + g + (e < 2 ? 0 : 8);
                const int64_t j = j0 + wn * 32 + nt * 8 + 2 * tq + (e & 1);
                if (r < nrows && j < jend)
                    scores[(row0 + r) * stride + j] = j < Lim[r] ? round_bf16(acc[mt][nt][e]) : -INFINITY;
            }
}

__global__ void to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* y) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void gather_keys_kernel(const uint8_t* const* keys, int64_t n, EntryFormat kf, __nv_bfloat16* out) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int hd = kf.dim;
    if (i >= n * hd) return;
    out[i] = __float2bfloat16_rn(entry_value(kf, keys[i / hd], static_cast<int>(i % hd)));
}

// ---------------------------------------------------------------------------------------------------
// Decode scorer on the tensor cores: a CTA takes one query row (its heads as the mma's M, up to 16 x MT) and walks
// its keys 64 at a time (4 warps x 16 keys as N), decoding the packed fp4 keys into bf16 shared memory on the
// integer pipe (entry_decode.h; e2m1 x ue8m0 values are bf16 values; so are the fp4-quantised queries). The per-head
// fold (bf16(dot), relu, x weight, bf16) and the sum over heads in head order are the streaming kernel's; only the
// dot products' fp32 sums run in another order (within a bf16 step of the streaming kernel's where they are not
// exact). The loads run ahead of the math: while a chunk of keys is scored, its successor's codes are in flight into
// registers and the chunk after that has its key addresses read, so the table lookup and the entry load (two
// dependent trips to memory) overlap the scoring instead of standing before it.
constexpr int kDecKeys = 64, kDecThreads = 128, kDecMaxHeads = 64;
constexpr int kDecItems = kDecKeys * 4 / kDecThreads;  // a thread's quarter keys per chunk (16 bytes of codes each)

template <int MT>
__global__ void __launch_bounds__(kDecThreads) index_decode_mma_kernel(
    const float* iq, const float* wts, const int32_t* row_list, int n_rows, int nh, const int64_t* width,
    const int64_t* visible, const int64_t* keybase, const uint8_t* const* keys, int64_t stride, float* scores) {
    pdl_enter();
    constexpr int NH = 16 * MT, VS = kDecKeys + 1;
    constexpr bool kQRegs = MT <= 2;  // 64 registers of fragments at 32 heads; 128 at 64 would spill
    __shared__ __align__(16) __nv_bfloat16 Qs[NH * kRowE];
    // The keys [kDecKeys][kRowE] (bf16), then, once every warp has read them, the folded values [NH][VS] (fp32).
    __shared__ __align__(16) float KV[kDecKeys * kRowE / 2];
    static_assert(NH * VS <= kDecKeys * kRowE / 2, "the folded values fit where the keys were");
    __shared__ float Ws[NH];
    __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(KV);
    float* Vs = KV;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * kDecKeys;
    const int64_t step = static_cast<int64_t>(gridDim.x) * kDecKeys;
    for (int ri = blockIdx.y; ri < n_rows; ri += gridDim.y) {
        const int64_t t = row_list ? row_list[ri] : ri;
        const int64_t lim = min(width[t], visible[t]);
        const uint8_t* const* row_keys = keys + keybase[t];
        // This CTA's chunks start at first + c * step; those below lim (a prefix of them) have keys to score.
        const int64_t n_vis = first < lim ? (lim - first + step - 1) / step : 0;
        // Item u of a chunk: key (tid + kDecThreads * u) / 4, its quarter (16 bytes of codes, scale byte q).
        auto key_of = [&](int64_t c, int u) { return first + c * step + ((tid + kDecThreads * u) >> 2); };
        const int q = tid & 3;  // the same quarter for every item: kDecThreads is a multiple of 4
        const uint8_t* ptr[kDecItems];
        uint4 code[kDecItems];
        uint32_t scale[kDecItems];
        auto read_ptrs = [&](int64_t c, const uint8_t* (&p)[kDecItems]) {
#pragma unroll
            for (int u = 0; u < kDecItems; ++u)
                p[u] = c < n_vis && key_of(c, u) < lim ? row_keys[key_of(c, u)] : nullptr;
        };
        auto read_codes = [&](const uint8_t* const (&p)[kDecItems], uint4 (&v)[kDecItems], uint32_t (&sc)[kDecItems]) {
#pragma unroll
            for (int u = 0; u < kDecItems; ++u) {
                v[u] = p[u] ? __ldg(reinterpret_cast<const uint4*>(p[u]) + q) : make_uint4(0, 0, 0, 0);
                sc[u] = p[u] ? __ldg(p[u] + 64 + q) : 0u;
            }
        };
        read_ptrs(0, ptr);
        read_codes(ptr, code, scale);
        read_ptrs(1, ptr);
        __syncthreads();  // the previous row is done with Qs and Ws
        for (int i = tid; i < NH * (kHD / 2); i += blockDim.x) {
            const int h = i / (kHD / 2), c = 2 * (i % (kHD / 2));
            const float2 v =
                h < nh ? *reinterpret_cast<const float2*>(iq + (t * nh + h) * kHD + c) : make_float2(0.0f, 0.0f);
            *reinterpret_cast<__nv_bfloat162*>(Qs + h * kRowE + c) = __floats2bfloat162_rn(v.x, v.y);
        }
        for (int i = tid; i < NH; i += blockDim.x) Ws[i] = i < nh ? wts[t * nh + i] : 0.0f;
        // The queries' mma fragments, the same for every chunk: held in registers where they fit.
        uint32_t qa[kQRegs ? MT : 1][kHD / 16][4];
        if constexpr (kQRegs) {
            __syncthreads();
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int k = 0; k < kHD / 16; ++k) frag_a(Qs + (mt * 16 + g) * kRowE + 16 * k + 2 * tq, qa[mt][k]);
        }
        for (int64_t c = 0; c < n_vis; ++c) {
            const int64_t j0 = first + c * step;
            // Chunk c + 1's codes and chunk c + 2's addresses go out before chunk c is scored.
            uint4 next_code[kDecItems];
            uint32_t next_scale[kDecItems];
            read_codes(ptr, next_code, next_scale);
            read_ptrs(c + 2, ptr);
            // Codes placed into bf16 bits and scaled exactly (entry_decode.h); zeros past the visible keys.
#pragma unroll
            for (int u = 0; u < kDecItems; ++u) {
                const int r = (tid + kDecThreads * u) >> 2;
                uint4* d = reinterpret_cast<uint4*>(Ks + r * kRowE + 32 * q);
                // 16-byte stores; quarters 2 and 3 (128 bytes on, the same banks as 0 and 1) start one store later.
                const int rot = q >> 1;
                if (key_of(c, u) < lim) {
                    const ScaleFactors f = e2m1_ue8m0_factors(static_cast<uint8_t>(scale[u]));
                    const uint32_t w[4] = {code[u].x, code[u].y, code[u].z, code[u].w};
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        uint32_t pr[4];
                        e2m1x8_to_bf16(rot ? w[(k + 1) & 3] : w[k], pr);
                        d[(k + rot) & 3] =
                            make_uint4(apply(f, pr[0]), apply(f, pr[1]), apply(f, pr[2]), apply(f, pr[3]));
                    }
                } else {
#pragma unroll
                    for (int k = 0; k < 4; ++k) d[k] = make_uint4(0u, 0u, 0u, 0u);
                }
                code[u] = next_code[u];
                scale[u] = next_scale[u];
            }
            __syncthreads();
            float dot[MT][2][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) dot[mt][nt][e] = 0.0f;
#pragma unroll
            for (int k0 = 0; k0 < kHD; k0 += 16) {
                uint32_t b[2][2];
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) frag_b(Ks + (warp * 16 + nt * 8 + g) * kRowE + k0 + 2 * tq, b[nt]);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    uint32_t a[4];
                    if constexpr (kQRegs) {
#pragma unroll
                        for (int i = 0; i < 4; ++i) a[i] = qa[mt][k0 / 16][i];
                    } else {
                        frag_a(Qs + (mt * 16 + g) * kRowE + k0 + 2 * tq, a);
                    }
#pragma unroll
                    for (int nt = 0; nt < 2; ++nt) mma_bf16(dot[mt][nt], a, b[nt][0], b[nt][1]);
                }
            }
            __syncthreads();  // every warp has read the keys: their space takes the folded values
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int h = mt * 16 + g + (e < 2 ? 0 : 8), key = warp * 16 + nt * 8 + 2 * tq + (e & 1);
                        const float d = round_bf16(dot[mt][nt][e]);
                        Vs[h * VS + key] = round_bf16(fmaxf(d, 0.0f) * Ws[h]);
                    }
            __syncthreads();
            if (tid < kDecKeys && j0 + tid < stride) {
                const int64_t j = j0 + tid;
                float acc = 0.0f;
                for (int h = 0; h < nh; ++h) acc += Vs[h * VS + tid];
                scores[t * stride + j] = j < lim ? round_bf16(acc) : -INFINITY;
            }
            __syncthreads();  // the folded values are read before the next keys overwrite them
        }
        for (int64_t j0 = first + n_vis * step; j0 < stride; j0 += step)  // nothing visible
            for (int i = tid; i < kDecKeys; i += blockDim.x)
                if (j0 + i < stride) scores[t * stride + j0 + i] = -INFINITY;
    }
}

// ---------------------------------------------------------------------------------------------------
// Selection.
constexpr int kSelThreads = 512, kSelWarps = kSelThreads / 32;

__device__ __forceinline__ uint32_t order_key(float x) {
    if (x == 0.0f) x = 0.0f;
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Rows of at least kCompactMinRow keys whose remaining candidates fit in kCompactMax are finished in shared memory
// (see select_stream); shorter rows are cheap enough to read again.
constexpr int kCompactMax = 4096;
constexpr int64_t kCompactMinRow = 8192;
constexpr int kRun = 8;   // consecutive keys a thread takes per step of a row

// Exclusive prefix sum of x over the block in thread order; *total gets the sum. Every thread calls it.
__device__ __forceinline__ int block_scan(int x, int* warp_sums, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int incl = x;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += y;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    int before = 0, sum = 0;
    for (int w = 0; w < kSelWarps; ++w) {
        const int c = warp_sums[w];
        before += w < warp ? c : 0;
        sum += c;
    }
    __syncthreads();  // warp_sums may be reused
    *total = sum;
    return before + incl - x;
}

// The k largest of v[0..n) (ties to the lower index), written to sel in ascending index order; returns
// min(k, n). Every thread of the block calls it (blockDim.x == kSelThreads). 8-bit radix passes over the
// order keys find the k-th key; as soon as the keys that can still be selected (those above the current prefix
// and those sharing it) fit in shared memory, one pass copies them there in index order and the remaining
// passes and the selection run on that copy: two or three reads of the row instead of up to five. A thread
// reads 8 consecutive keys a step (two 16-byte loads when the row is aligned).
template <bool GUESS>
__device__ int select_stream(const float* v, int64_t n, int k, int32_t* sel) {
    __shared__ int hist[256];
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ int s_remaining, s_done, s_fit;
    __shared__ int64_t w_gt[kSelWarps], w_eq[kSelWarps];
    __shared__ int w_sum[kSelWarps];
    __shared__ int32_t c_idx[kCompactMax];
    __shared__ uint32_t c_key[kCompactMax];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kk = static_cast<int>(min(static_cast<int64_t>(k), n));
    if (kk <= 0) return 0;
    if (n <= k) {  // everything
        for (int64_t j = tid; j < n; j += blockDim.x) sel[j] = static_cast<int32_t>(j);
        __syncthreads();
        return kk;
    }
    bool compacted = false;  // uniform
    int nc = 0;
    if (n <= kCompactMax) {  // a short row (decode at 8K: 2,048 keys): into shared memory at once
        for (int j = tid; j < static_cast<int>(n); j += blockDim.x) {
            c_key[j] = order_key(__ldg(v + j));
            c_idx[j] = j;
        }
        nc = static_cast<int>(n);
        compacted = true;
        __syncthreads();
    }
    const bool aligned = (reinterpret_cast<uintptr_t>(v) & 15) == 0;
    // Calls f(j0, keys) for every step of the row: keys[i] is the order key of v[j0 + i] (valid when j0 + i < n);
    // the whole block calls it, every thread every step (f may use warp collectives and barriers).
    auto stream_row = [&](auto&& f) {
        for (int64_t base = 0; base < n; base += kRun * static_cast<int64_t>(blockDim.x)) {
            const int64_t j0 = base + kRun * static_cast<int64_t>(tid);
            float x[kRun];
            if (aligned && j0 + kRun <= n) {
#pragma unroll
                for (int u = 0; u < kRun / 4; ++u) {
                    const float4 q = __ldg(reinterpret_cast<const float4*>(v + j0) + u);
                    x[4 * u] = q.x, x[4 * u + 1] = q.y, x[4 * u + 2] = q.z, x[4 * u + 3] = q.w;
                }
            } else {
#pragma unroll
                for (int i = 0; i < kRun; ++i) x[i] = j0 + i < n ? __ldg(v + j0 + i) : 0.0f;
            }
            uint32_t keys[kRun];
#pragma unroll
            for (int i = 0; i < kRun; ++i) keys[i] = order_key(x[i]);
            f(j0, keys);
        }
    };
    auto count_bin = [&](uint32_t key, bool valid, uint32_t prefix, uint32_t mask, int shift) {
        const bool cand = valid && (key & mask) == prefix;
        const uint32_t bin = cand ? (key >> shift) & 255u : 256u;
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (cand && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
    };
    // 8-bit radix passes for the target-th largest key (of the copy when compacted, else of the row): leave its
    // bits in s_prefix (under s_mask) and in s_remaining how many keys equal to it under the mask are taken.
    auto radix = [&](int target) {
        if (tid == 0) {
            s_prefix = 0;
            s_mask = 0;
            s_remaining = target;
            s_done = 0;
        }
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
            __syncthreads();
            if (s_done) break;  // uniform: read after the barrier
            const uint32_t prefix = s_prefix, mask = s_mask;
            if (compacted) {
                for (int base = 0; base < nc; base += blockDim.x) {
                    const int i = base + tid;
                    count_bin(i < nc ? c_key[i] : 0u, i < nc, prefix, mask, shift);
                }
            } else {
                stream_row([&](int64_t j0, const uint32_t (&keys)[kRun]) {
#pragma unroll
                    for (int i = 0; i < kRun; ++i) count_bin(keys[i], j0 + i < n, prefix, mask, shift);
                });
            }
            __syncthreads();
            if (tid == 0) {
                int cum = 0, b = 255;
                const int remaining = s_remaining;
                for (; b > 0; --b) {
                    if (cum + hist[b] >= remaining) break;
                    cum += hist[b];
                }
                s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
                s_mask = mask | (255u << shift);
                s_remaining = remaining - cum;
                if (hist[b] == remaining - cum) s_done = 1;  // the whole bin is taken: no tie to break
                // Selected so far (above the new prefix) plus those sharing it.
                s_fit = !compacted && n >= kCompactMinRow && (kk - s_remaining) + hist[b] <= kCompactMax;
            }
            __syncthreads();
            if (s_fit) {  // uniform: copy every key at or above the prefix (its bits) with its index, in index order
                const uint32_t p = s_prefix, m = s_mask;
                nc = 0;
                stream_row([&](int64_t j0, const uint32_t (&keys)[kRun]) {
                    int cnt = 0;
#pragma unroll
                    for (int i = 0; i < kRun; ++i) cnt += j0 + i < n && (keys[i] & m) >= p;
                    int total;
                    int pos = nc + block_scan(cnt, w_sum, &total);
#pragma unroll
                    for (int i = 0; i < kRun; ++i)
                        if (j0 + i < n && (keys[i] & m) >= p) {
                            c_idx[pos] = static_cast<int32_t>(j0 + i);
                            c_key[pos] = keys[i];
                            ++pos;
                        }
                    nc += total;
                });
                __syncthreads();
                compacted = true;
                if (tid == 0) s_fit = 0;
                __syncthreads();
            }
        }
    };
    // GUESS: long rows first guess a threshold from a strided sample of kCompactMax keys: the sample's key of the
    // rank that leaves about (k + kCompactMax) / 2 of the row's keys at or above it. One pass copies those keys with
    // their indices to shared memory in index order; when they number k to kCompactMax, the top k are among them
    // (every key tied with the k-th too) and the radix passes run on the copy: one read of the row instead of three.
    // Otherwise (a skewed row, a large tie group) the row is read as before.
    if (GUESS && !compacted && n >= kCompactMinRow && kk < kCompactMax) {
        for (int i = tid; i < kCompactMax; i += blockDim.x)
            c_key[i] = order_key(__ldg(v + static_cast<int64_t>(i) * n / kCompactMax));
        nc = kCompactMax;
        compacted = true;
        __syncthreads();
        const int64_t target = (kk + kCompactMax) / 2;
        radix(static_cast<int>(max(static_cast<int64_t>(1), target * kCompactMax / n)));
        const uint32_t guess = s_prefix;  // keys >= guess: exactly those at or above the prefix under the mask
        nc = 0;
        stream_row([&](int64_t j0, const uint32_t (&keys)[kRun]) {
            int cnt = 0;
#pragma unroll
            for (int i = 0; i < kRun; ++i) cnt += j0 + i < n && keys[i] >= guess;
            int total;
            int pos = nc + block_scan(cnt, w_sum, &total);
#pragma unroll
            for (int i = 0; i < kRun; ++i)
                if (j0 + i < n && keys[i] >= guess) {
                    if (pos < kCompactMax) {
                        c_idx[pos] = static_cast<int32_t>(j0 + i);
                        c_key[pos] = keys[i];
                    }
                    ++pos;
                }
            nc += total;
        });
        __syncthreads();
        compacted = nc >= kk && nc <= kCompactMax;  // uniform: every thread summed the same totals
    }
    radix(kk);
    const uint32_t thr = s_prefix, mask = s_mask;
    const int need = s_remaining;  // how many of the keys equal to thr (under mask) are taken
    // The candidates in index order: the row, or its copy. Warp-contiguous chunks: count, scan over warps, then
    // write in index order.
    const int64_t items = compacted ? nc : n;
    auto key_at = [&](int64_t i) { return compacted ? c_key[i] : order_key(v[i]); };
    auto index_at = [&](int64_t i) { return compacted ? c_idx[i] : static_cast<int32_t>(i); };
    const int64_t chunk = ((items + kSelWarps - 1) / kSelWarps + 31) / 32 * 32;
    const int64_t c0 = warp * chunk, c1 = min(items, c0 + chunk);
    int64_t gt = 0, eq = 0;
    for (int64_t base = c0; base < c1; base += 32) {
        const int64_t j = base + lane;
        const uint32_t key = j < c1 ? key_at(j) & mask : 0u;
        gt += __popc(__ballot_sync(0xffffffffu, j < c1 && key > thr));
        eq += __popc(__ballot_sync(0xffffffffu, j < c1 && key == thr));
    }
    if (lane == 0) {
        w_gt[warp] = gt;
        w_eq[warp] = eq;
    }
    __syncthreads();
    if (tid == 0) {
        int64_t g = 0, e = 0;
        for (int w = 0; w < kSelWarps; ++w) {
            const int64_t a = w_gt[w], b = w_eq[w];
            w_gt[w] = g;
            w_eq[w] = e;
            g += a;
            e += b;
        }
    }
    __syncthreads();
    int64_t g = w_gt[warp], e = w_eq[warp];
    const unsigned lt = (1u << lane) - 1u;
    for (int64_t base = c0; base < c1; base += 32) {
        const int64_t j = base + lane;
        const uint32_t key = j < c1 ? key_at(j) & mask : 0u;
        const bool is_gt = j < c1 && key > thr, is_eq = j < c1 && key == thr;
        const unsigned bg = __ballot_sync(0xffffffffu, is_gt), be = __ballot_sync(0xffffffffu, is_eq);
        const int64_t eq_before = e + __popc(be & lt);
        if (is_gt || (is_eq && eq_before < need))
            sel[g + __popc(bg & lt) + min(eq_before, static_cast<int64_t>(need))] = index_at(j);
        g += __popc(bg);
        e += __popc(be);
    }
    __syncthreads();
    return kk;
}

__global__ void __launch_bounds__(kSelThreads) topk_fast_kernel(const float* scores, int64_t stride,
                                                                const int64_t* width, const int64_t* visible, int k,
                                                                bool ascending, int32_t* tmp, int32_t* out,
                                                                int32_t* count) {
    pdl_enter();
    extern __shared__ float4 topk_smem[];
    const int64_t t = blockIdx.x;
    const float* v = scores + t * stride;
    int32_t* sel = tmp + t * k;
    int32_t* o = out + t * k;
    const int kk = select_stream<true>(v, width[t], k, sel);
    if (threadIdx.x == 0) count[t] = kk;
    const int64_t vis = visible[t];
    if (ascending) {
        for (int i = threadIdx.x; i < kk; i += blockDim.x) o[i] = sel[i] < vis ? sel[i] : -1;
        return;
    }
    // By (value desc, index asc): ranks among the selected, values staged in shared memory.
    float* sv = reinterpret_cast<float*>(topk_smem);
    int32_t* si = reinterpret_cast<int32_t*>(sv + k);
    for (int i = threadIdx.x; i < kk; i += blockDim.x) {
        si[i] = sel[i];
        sv[i] = v[sel[i]];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kk; i += blockDim.x) {
        const float x = sv[i];
        const int32_t j = si[i];
        int p = 0;
        for (int q = 0; q < kk; ++q) p += (sv[q] > x) || (sv[q] == x && si[q] < j);
        o[p] = j < vis ? j : -1;
    }
}

__global__ void __launch_bounds__(kSelThreads) candidate_fast_kernel(const float* scores, int64_t stride,
                                                                     const int64_t* width, const int64_t* visible,
                                                                     int bs, int topb, float* bscore, int32_t* bsel,
                                                                     int64_t bstride, uint8_t* mask, int64_t mstride) {
    pdl_enter();
    const int64_t t = blockIdx.x;
    const int64_t w = width[t], vis = visible[t];
    if (w == 0) return;
    const int64_t nb = (w + bs - 1) / bs, last = vis >= 1 ? (vis - 1) / bs : -1;
    float* bsr = bscore + t * bstride;
    int32_t* sel = bsel + t * bstride;
    uint8_t* mr = mask + t * mstride;
    const float* sr = scores + t * stride;
    // Block maxima; 8-entry blocks of an aligned row as two 16-byte loads.
    const bool vec8 = bs == 8 && (reinterpret_cast<uintptr_t>(sr) & 15) == 0;
    for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
        float m = -INFINITY;
        if (vec8 && (b + 1) * bs <= w) {
            const float4* p4 = reinterpret_cast<const float4*>(sr + b * bs);
            const float4 p = __ldg(p4), q = __ldg(p4 + 1);
            m = fmaxf(fmaxf(fmaxf(p.x, p.y), fmaxf(p.z, p.w)), fmaxf(fmaxf(q.x, q.y), fmaxf(q.z, q.w)));
        } else {
            for (int64_t j = b * bs; j < min(w, (b + 1) * bs); ++j) m = fmaxf(m, sr[j]);
        }
        bsr[b] = b == last ? INFINITY : m;
    }
    for (int64_t j = threadIdx.x; j < (nb + 31) / 32; j += blockDim.x) reinterpret_cast<unsigned int*>(mr)[j] = 0u;
    __syncthreads();
    const int kk = select_stream<false>(bsr, nb, topb, sel);  // the guess's extra registers cost occupancy here
    for (int i = threadIdx.x; i < kk; i += blockDim.x) {
        const int64_t b = sel[i];
        if (bsr[b] > -INFINITY) atomicOr(reinterpret_cast<unsigned int*>(mr) + b / 32, 1u << (b % 32));
    }
}

}  // namespace

bool index_scores_stream_supported(int nh, int hd) {
    return hd <= kStreamMaxDim && hd % 4 == 0 && static_cast<size_t>(nh) * (hd + 1) * sizeof(float) <= 48 * 1024;
}

namespace {
// The decode scorer's CTAs resident on the device at once.
template <int MT>
int decode_resident() {
    static const int n = [] {
        int per_sm = 0;
        PG_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, index_decode_mma_kernel<MT>, kDecThreads, 0));
        return std::max(per_sm, 1) * sm_count();
    }();
    return n;
}

int& index_decode_choice() {  // PEREGRINE_INDEX_DECODE=stream: the CUDA-core kernel for every decode row (A/B)
    static int on = switch_is("PEREGRINE_INDEX_DECODE", "stream") ? 0 : 1;
    return on;
}
}  // namespace

void index_scores_decode_use_mma(bool on) { index_decode_choice() = on ? 1 : 0; }

void index_scores_stream(const float* iq, const float* wts, const int32_t* row_list, int n_rows, int nh, int hd,
                         const int64_t* width, const int64_t* visible, const int64_t* keybase,
                         const uint8_t* const* keys, const EntryFormat& kf, int64_t stride, float* scores) {
    if (n_rows == 0 || stride == 0) return;
    if (!index_scores_stream_supported(nh, hd) || kf.dim != hd)
        cuda_fail(cudaErrorInvalidValue, "index_scores_stream: unsupported head shape", __FILE__, __LINE__);
    if (index_decode_choice() && hd == kHD && nh <= kDecMaxHeads && kf.kind == kEntryFp4Ue8m0 && kf.dim == kHD &&
        kf.block == 32 && kf.scale_offset == 64 && kf.bytes % 16 == 0) {
        // One wave of CTAs, the rows sharing it (each CTA stages its row's queries once and walks its share of the
        // keys, its loads running ahead of its math).
        const int64_t chunks = (stride + kDecKeys - 1) / kDecKeys;
        const int mt = (nh + 15) / 16;
        auto run = [&](auto kernel, int resident) {
            const dim3 grid(static_cast<unsigned>(std::clamp<int64_t>(resident / n_rows, 1, chunks)),
                            static_cast<unsigned>(std::min(n_rows, 65535)));
            launch_pdl(kernel, grid, dim3(kDecThreads), 0, iq, wts, row_list, n_rows, nh, width, visible, keybase, keys,
                       stride, scores);
        };
        if (mt == 1) run(index_decode_mma_kernel<1>, decode_resident<1>());
        else if (mt == 2) run(index_decode_mma_kernel<2>, decode_resident<2>());
        else run(index_decode_mma_kernel<4>, decode_resident<4>());  // 3 takes 4: the extra heads are zero, not summed
        return;
    }
    const dim3 grid(blocks_for(stride, kStreamThreads), static_cast<unsigned>(std::min(n_rows, 65535)));
    const size_t smem = sizeof(float) * static_cast<size_t>(nh) * (hd + 1);
    launch_pdl(index_stream_kernel, grid, dim3(kStreamThreads), smem, iq, wts, row_list, n_rows, nh, hd, width, visible,
               keybase, keys, kf, stride, scores);
}

bool index_scores_mma_supported(int nh, int hd) { return hd == kHD && nh >= 1 && nh <= kMmaMaxHeads; }

namespace {
int& index_wgmma_choice() {
    static int on = switch_is("PEREGRINE_INDEX_GEMM", "mma") ? 0 : 1;
    return on;
}
}  // namespace

void index_scores_use_wgmma(bool on) { index_wgmma_choice() = on ? 1 : 0; }

void index_scores_mma(const uint16_t* qb, const float* wts, int nh, const int64_t* tiles, int n_tiles,
                      const uint16_t* kb, const int64_t* visible, int64_t stride, float* scores) {
    if (n_tiles == 0 || stride == 0) return;
    if (index_wgmma_choice() && index_scores_wgmma_supported(nh, kHD))
        return index_scores_wgmma(qb, wts, nh, tiles, n_tiles, kb, visible, stride, scores);
    if (!index_scores_mma_supported(nh, kHD) || n_tiles > 65535)
        cuda_fail(cudaErrorInvalidValue, "index_scores_mma: unsupported shape", __FILE__, __LINE__);
    smem_opt_in<index_mma_kernel>(kMmaSmemBytes);
    const dim3 grid(static_cast<unsigned>((stride + kBN - 1) / kBN), static_cast<unsigned>(n_tiles));
    launch_pdl(index_mma_kernel, grid, dim3(kMmaThreads), kMmaSmemBytes, reinterpret_cast<const __nv_bfloat16*>(qb),
               wts, nh, tiles, reinterpret_cast<const __nv_bfloat16*>(kb), visible, stride, scores);
}

void to_bf16(const float* x, int64_t n, uint16_t* y) {
    if (n == 0) return;
    launch_pdl(to_bf16_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, x, n, reinterpret_cast<__nv_bfloat16*>(y));
}

void gather_keys_bf16(const uint8_t* const* keys, int64_t n, const EntryFormat& kf, uint16_t* out) {
    if (n * kf.dim == 0) return;
    launch_pdl(gather_keys_kernel, dim3(blocks_for(n * kf.dim)), dim3(kThreads), 0, keys, n, kf,
               reinterpret_cast<__nv_bfloat16*>(out));
}

void topk_rows_fast(const float* scores, int64_t T, int64_t stride, const int64_t* width, const int64_t* visible,
                    int k, bool ascending, int32_t* tmp, int32_t* out, int32_t* count) {
    if (T == 0 || k == 0) return;
    const size_t smem = ascending ? 0 : static_cast<size_t>(k) * (sizeof(float) + sizeof(int32_t));
    if (smem > 48 * 1024) cuda_fail(cudaErrorInvalidValue, "topk_rows_fast: k too large", __FILE__, __LINE__);
    launch_pdl(topk_fast_kernel, dim3(static_cast<unsigned>(T)), dim3(kSelThreads), smem, scores, stride, width,
               visible, k, ascending, tmp, out, count);
}

void candidate_blocks_fast(const float* scores, int64_t T, int64_t stride, const int64_t* width,
                           const int64_t* visible, int bs, int topb, float* bscore, int32_t* bsel, int64_t bstride,
                           uint8_t* mask, int64_t mask_stride) {
    if (T == 0) return;
    if (mask_stride % 4 != 0)
        cuda_fail(cudaErrorInvalidValue, "candidate_blocks_fast: mask rows must be words", __FILE__, __LINE__);
    launch_pdl(candidate_fast_kernel, dim3(static_cast<unsigned>(T)), dim3(kSelThreads), 0, scores, stride, width,
               visible, bs, topb, bscore, bsel, bstride, mask, mask_stride);
}

}  // namespace peregrine::cuda
