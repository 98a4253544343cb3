// Tensor-core sparse attention on Hopper's warpgroup MMA (Numerics::Fast, one key split: prefill). The same
// contract as sparse_attention_mma.cu (read its numerics notes): the same 64-key blocks, running maximum from
// -1e30, scale on the fp32 dot product, probabilities exp(s - m) summed unrounded and multiplied into V rounded
// to bf16, per-row rescales and the sink with exp_cr, bf16 output. Only fp32 summation orders differ from the
// mma.sync kernel: the tensor cores' within q.k, and the block sums' tree.
//
// One CTA per (query, group of 64 heads), three warpgroups with separate jobs, so that loading and decoding the
// keys overlaps the MMAs instead of alternating with them:
//  - the producer (warpgroup 2) copies a block's 64 key entries whole into a staging area (cp.async), decodes
//    them into one of two bf16 key tiles once the consumers have released it, then starts the next block's
//    copies; named barriers FULL[b] / EMPTY[b] hand the tiles over;
//  - the two consumers (warpgroups 0 and 1) each compute the whole S = Q K^T [64 heads x 64 keys] (m64n64k16
//    over the 512 dims, both operands K-major in shared memory; identical copies, so no scores cross warpgroups),
//    run the online softmax in registers (a row's 64 keys sit in one quad of lanes), and consumer w adds P V for
//    output dims 256 w .. +256 (m64n128k16 twice a 16-key step, P from registers in the accumulator's layout, V
//    read MN-major from the same key tile).
// Shared memory: queries and key tiles as bf16 in the 128-byte swizzle, as eight 64-dim slices of [rows][128 B].
// The consumers take 224 registers a thread and the producer 56 (setmaxnreg): the two must add up to at most the
// CTA's launch allocation (168 x 384), or the consumers' allocation waits forever.
#include "ops/cuda/cp_async.cuh"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/sparse_keys.cuh"
#include "ops/cuda/wgmma.cuh"

namespace peregrine::cuda::sparse {

namespace {

using namespace wgmma;

constexpr int kSlice = 64;                        // dims per 128-byte row
constexpr int kTileBytes = kDim / kSlice * kBlk * 128;  // 64 rows (heads or keys) x 512 dims of bf16: 64 KB
constexpr int kSliceBytes = kBlk * 128;           // one slice of a tile: 8 KB
constexpr int kMaxSlot = 528;                     // staged bytes a key: V4.1's fp8 window entry (512 + 16)
constexpr int kStageBytes = kBlk * kMaxSlot;      // a whole block's entries
constexpr int kThreads = 384, kConsumers = 256, kProducers = 128;
constexpr int kConsumerRegs = 224, kProducerRegs = 56;
static_assert(kConsumers * kConsumerRegs + kProducers * kProducerRegs <= kThreads * 168, "register pool");
// alignment, Q, two key tiles, staging, valid flags [2][kBlk], key addresses [kBlk]
constexpr int kSmem = 1024 + 3 * kTileBytes + kStageBytes + 2 * kBlk * 4 + kBlk * 8;
static_assert(kHeads == kBlk, "a tile is 64 rows of heads or of keys");
// Named barriers (0 is __syncthreads): key tile b full / empty, the producers among themselves, the consumers.
constexpr int kFull = 1, kEmpty = 3, kProducerBar = 5, kConsumerBar = 6;

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

// Descriptor of V read MN-major: rows of 128 bytes are keys (k), holding 64 dims (n) each; the next 8 keys are
// the next 1024-byte atom (stride offset) and the next 64 dims the next slice (leading offset).
__device__ __forceinline__ uint64_t desc_v(uint32_t addr) {
    return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (static_cast<uint64_t>(kSliceBytes >> 4) << 16) |
           (static_cast<uint64_t>(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// s (m64 x n64, fp32) = Q (m64 x k16) K^T (+ s when ACC), both K-major bf16 tiles in shared memory.
template <int ACC>
__device__ __forceinline__ void wgmma_qk(float (&d)[32], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, %34, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "n"(ACC));
}

// o (m64 x n128, fp32) += P (m64 x k16 bf16, registers) V (k16 x n128), V MN-major in shared memory.
__device__ __forceinline__ void wgmma_pv(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
        "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
        "%59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// Byte offset of dims 8u .. 8u + 7 of row r in a tile (u < 64: the 16-byte unit along the 512 dims).
__device__ __forceinline__ uint32_t tile_offset(int r, int u) { return (u >> 3) * kSliceBytes + sw128_offset(r, u & 7); }

// ---- Producer (p = thread 0..127 of warpgroup 2).

// Starts copying block b's entries whole into the staging area, `slot` bytes a key: the key addresses first
// (one load each, through shared memory), then 16-byte copies of every present entry.
__device__ __forceinline__ void stage_block(const MmaArgs& a, int64_t t, int n, int nwin, int b, int slot, int p,
                                            uint8_t* st, const uint8_t** kaddr) {
    if (p < kBlk) {
        const int j = b * kBlk + p;
        kaddr[p] = j < n ? a.keys.at(t, j) : nullptr;
    }
    bar_sync(kProducerBar, kProducers);
    const int pieces = slot >> 4;
    for (int q = p; q < kBlk * pieces; q += kProducers) {
        const int k = q / pieces, piece = q - k * pieces;
        const uint8_t* src = kaddr[k];
        const int bytes = (b * kBlk + k < nwin ? a.keys.r.win : a.keys.r.comp).bytes;
        if (src && piece * 16 < bytes) cp_async16(st + k * slot + piece * 16, src + piece * 16);
    }
    cp_async_commit();
}

// Decodes the staged block b into key tile `tile` and its valid flags: part (key q / 16, dims 32 (q % 16) ..)
// for q = p, p + 128, ...; q % 16 == p % 16, the part load_chunk reads for this thread.
__device__ __forceinline__ void decode_block(const MmaArgs& a, int nwin, int b, int slot, int p, const uint8_t* st,
                                             const uint8_t* const* kaddr, uint8_t* tile, int* valid) {
    for (int q = p; q < kBlk * 16; q += kProducers) {
        const int k = q >> 4, part = q & 15;
        Chunk ch;
        load_chunk<false>(ch, kaddr[k] ? st + k * slot : nullptr, b * kBlk + k < nwin ? a.keys.r.win : a.keys.r.comp);
        uint32_t o[kPartDims / 2];
        const bool real = decode_chunk(ch, o);
#pragma unroll
        for (int u = 0; u < kPartDims / 8; ++u)
            *reinterpret_cast<uint4*>(tile + tile_offset(k, part * (kPartDims / 8) + u)) =
                make_uint4(o[4 * u], o[4 * u + 1], o[4 * u + 2], o[4 * u + 3]);
        if (part == 0) valid[k] = real;
    }
}

__global__ void __launch_bounds__(kThreads, 1) sparse_attention_wgmma_kernel(MmaArgs a) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* sm = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    uint8_t* Qs = sm;
    uint8_t* Kb = sm + kTileBytes;                                 // [2] key tiles
    uint8_t* St = sm + 3 * kTileBytes;                             // staging
    int* valid = reinterpret_cast<int*>(St + kStageBytes);         // [2][kBlk]
    const uint8_t** kaddr = reinterpret_cast<const uint8_t**>(valid + 2 * kBlk);  // [kBlk]

    const int G = a.H / kHeads;
    const int64_t t = blockIdx.x / G;
    const int hg = static_cast<int>(blockIdx.x % G);
    const int tid = threadIdx.x;
    const int64_t row0 = t * a.H + static_cast<int64_t>(hg) * kHeads;  // first (token, head) row of the CTA
    const int n = a.keys.count(t), nwin = a.keys.windows(t);
    const int nblk = (n + kBlk - 1) / kBlk;

    if (tid >= kConsumers) {  // ---- producer
        setmaxnreg_dec<kProducerRegs>();
        const int p = tid - kConsumers;
        const int slot = a.keys.r.nwin ? max(a.keys.r.win.bytes, a.keys.r.comp.bytes) : a.keys.r.win.bytes;
        if (nblk > 0) stage_block(a, t, n, nwin, 0, slot, p, St, kaddr);
        for (int b = 0; b < nblk; ++b) {
            const int buf = b & 1;
            cp_async_wait<0>();
            bar_sync(kProducerBar, kProducers);  // every copy of block b has landed
            if (b >= 2) bar_sync(kEmpty + buf, kThreads);  // the consumers are done with block b - 2's tile
            decode_block(a, nwin, b, slot, p, St, kaddr, Kb + buf * kTileBytes, valid + buf * kBlk);
            bar_sync(kProducerBar, kProducers);  // the staging area and the addresses are free
            if (b + 1 < nblk) stage_block(a, t, n, nwin, b + 1, slot, p, St, kaddr);
            proxy_fence();
            bar_arrive(kFull + buf, kThreads);
        }
        return;
    }

    // ---- consumers
    setmaxnreg_inc<kConsumerRegs>();
    const int lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3, g = lane >> 2, tq = lane & 3;
    const uint32_t q_addr = smem_addr(Qs), k_addr = smem_addr(Kb);
    {  // queries -> bf16 (exact: they are bf16 values); float4 i: head i / 128, dims 4 (i % 128) .., 8 loads in flight
        const float4* q4 = reinterpret_cast<const float4*>(a.q + row0 * kDim);
        for (int i0 = tid; i0 < kHeads * kDim / 4; i0 += 8 * kConsumers) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) v[u] = __ldg(q4 + i0 + u * kConsumers);
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int i = i0 + u * kConsumers, r = i >> 7, c4 = i & 127;
                *reinterpret_cast<uint2*>(Qs + tile_offset(r, c4 >> 1) + (c4 & 1) * 8) =
                    make_uint2(pack_bf16(v[u].x, v[u].y), pack_bf16(v[u].z, v[u].w));
            }
        }
    }
    proxy_fence();
    bar_sync(kConsumerBar, kConsumers);

    // o[h][4j + e]: head wq*16 + g + 8 (e >> 1), dim 256 wg + 128 h + 8j + 2 tq + (e & 1). Rows g and g + 8 of the
    // warp's 16 heads: m_run, l_run (the same in the four lanes of a quad).
    float o[2][64];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 64; ++i) o[h][i] = 0.0f;
    float m_run[2] = {-1e30f, -1e30f}, l_run[2] = {0.0f, 0.0f};

    for (int b = 0; b < nblk; ++b) {
        const int buf = b & 1;
        const uint32_t kt = k_addr + buf * kTileBytes;
        const int* vb = valid + buf * kBlk;
        bar_sync(kFull + buf, kThreads);  // the producer has decoded block b into this tile

        // ---- S = Q K^T: 32 k16 steps over the 512 dims (4 per 64-dim slice, 32 bytes apart).
        float s[32];
        wgmma_fence();
        wgmma_qk<0>(s, desc_sw128(q_addr), desc_sw128(kt));
#pragma unroll
        for (int kk = 1; kk < kDim / 16; ++kk) {
            const uint32_t off = (kk >> 2) * kSliceBytes + (kk & 3) * 32;
            wgmma_qk<1>(s, desc_sw128(q_addr + off), desc_sw128(kt + off));
        }
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 32; ++i) hold(s[i]);
        // ---- Online softmax of the block. s[4j + e]: head wq*16 + g + 8 (e >> 1), key 8j + 2 tq + (e & 1).
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const int key = 8 * (i >> 2) + 2 * tq + (i & 1);
            s[i] = vb[key] ? s[i] * a.scale : -INFINITY;
            mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
        }
        float rs[2], m_new[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            m_new[r] = fmaxf(m_run[r], mx[r]);
        }
        uint32_t pa[kBlk / 16][4];  // P as the A fragments of the four k16 steps
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float p0 = expf(s[4 * j] - m_new[0]), p1 = expf(s[4 * j + 1] - m_new[0]);
            const float p2 = expf(s[4 * j + 2] - m_new[1]), p3 = expf(s[4 * j + 3] - m_new[1]);
            sum[0] += p0 + p1;
            sum[1] += p2 + p3;
            pa[j >> 1][2 * (j & 1)] = pack_bf16(p0, p1);
            pa[j >> 1][2 * (j & 1) + 1] = pack_bf16(p2, p3);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
            rs[r] = exp_cr(m_run[r] - m_new[r]);
            l_run[r] = l_run[r] * rs[r] + sum[r];
            m_run[r] = m_new[r];
        }
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 64; ++i) o[h][i] *= rs[(i >> 1) & 1];

        // ---- O += P V over this warpgroup's 256 dims: slices 4 wg + 2 h, 16 keys (two atoms) a step.
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kBlk / 16; ++ks)
#pragma unroll
            for (int h = 0; h < 2; ++h) wgmma_pv(o[h], pa[ks], desc_v(kt + (4 * wg + 2 * h) * kSliceBytes + ks * 2048));
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 64; ++i) hold(o[h][i]);
        if (b + 2 < nblk) bar_arrive(kEmpty + buf, kThreads);  // the producer may refill this tile
    }

    // The sink, normalise, round.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int head = wq * 16 + g + 8 * r;
        const float l = l_run[r] + exp_cr(a.sink[hg * kHeads + head] - m_run[r]);
        float* out = a.out + (row0 + head) * kDim + 256 * wg + 2 * tq;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < 16; ++j)
                *reinterpret_cast<float2*>(out + 128 * h + 8 * j) =
                    make_float2(round_bf16(o[h][4 * j + 2 * r] / l), round_bf16(o[h][4 * j + 2 * r + 1] / l));
    }
}

}  // namespace

bool sparse_wgmma_supported(const EntryFormat& win, const EntryFormat& comp) {
    return win.bytes % 16 == 0 && comp.bytes % 16 == 0 && win.bytes <= kMaxSlot && comp.bytes <= kMaxSlot;
}

void launch_sparse_wgmma(const MmaArgs& a, unsigned ctas) {
    static bool attr = [] {
        PG_CUDA(cudaFuncSetAttribute(sparse_attention_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
        return true;
    }();
    (void)attr;
    sparse_attention_wgmma_kernel<<<ctas, kThreads, kSmem>>>(a);
    PG_LAUNCHED();
}

}  // namespace peregrine::cuda::sparse
