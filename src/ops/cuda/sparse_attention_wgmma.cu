// Sparse attention over keys decoded to bf16 beforehand, on Hopper's warpgroup MMA (Numerics::Fast, one CTA per
// query: prefill-sized steps). The same contract as sparse_attention_mma.cu with one key split (read its numerics
// notes): the same 64-key blocks, running maximum from -1e30, scale on the fp32 dot product, probabilities
// exp(s - m) summed unrounded and multiplied into V rounded to bf16, per-row rescales and the sink with exp_cr,
// bf16 output. Only fp32 summation orders differ from the mma.sync kernel: the tensor cores' within q.k, and the
// block sums' tree.
//
// The mma.sync kernel decodes each packed key in every query's CTA, which costs as much as its MMAs; here the
// step's keys were decoded once (attention.cpp: device_window_rows, gather_keys_bf16), so a key block is a plain
// gather of 1 KB rows. One CTA per (query, group of 64 heads), three warpgroups:
//  - the producer (warpgroup 2) gathers a block's 64 rows into one of two key tiles with cp.async (a masked
//    key: zeros), two blocks in flight, each block's row addresses loaded a block ahead (with the addresses loaded
//    as the copies were issued, the consumers waited for keys a quarter of the time); named barriers FULL[b] /
//    EMPTY[b] hand the tiles over;
//  - the two consumers (warpgroups 0 and 1): consumer w computes S = Q K^T for the block's keys 32 w .. +32
//    (m64n32k16 over the 512 dims, both operands K-major in shared memory), runs the online softmax in registers
//    (a row's keys sit in one quad of lanes; the block's row maxima cross to the other consumer through shared
//    memory, each keeps its keys' share of the row sums), swaps its P fragments with the other's (thread i of
//    either holds the same heads), and adds P V for output dims 256 w .. +256 (m64n128k16 twice a 16-key step, P
//    from registers in the accumulator's layout, V read MN-major from the same key tile). Both computing the whole
//    S took 0.86 against 0.78 ms at 4,096 queries.
// Shared memory: queries and key tiles as bf16 in the 128-byte swizzle, as eight 64-dim slices of [rows][128 B].
// The consumers take 224 registers a thread and the producer 56 (setmaxnreg): the two must add up to at most the
// CTA's launch allocation (168 x 384), or the consumers' allocation waits forever.
#include "ops/cuda/cp_async.cuh"
#include "ops/cuda/device_math.cuh"
#include "util/switches.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/sparse_keys.cuh"
#include "ops/cuda/wgmma.cuh"

#include <cuda_bf16.h>

namespace peregrine::cuda {

namespace {

using namespace wgmma;

using sparse::kBlk;  // the mma.sync kernel's head group, latent width and key block
using sparse::kDim;
using sparse::kHeads;
using sparse::pack_bf16;
constexpr int kSlice = 64;                               // dims per 128-byte row
constexpr int kSliceBytes = kBlk * 128;                  // one slice of a tile: 8 KB
constexpr int kTileBytes = kDim / kSlice * kSliceBytes;  // 64 rows (heads or keys) x 512 dims of bf16: 64 KB
constexpr int kUnits = kDim * 2 / 16;                    // 16-byte units of a row
constexpr int kCtaThreads = 384, kConsumers = 256, kProducers = 128;
constexpr int kConsumerRegs = 224, kProducerRegs = 56;
static_assert(kConsumers * kConsumerRegs + kProducers * kProducerRegs <= kCtaThreads * 168, "register pool");
static_assert(kProducers == 2 * kBlk && kUnits == 64, "a producer warp copies 16 keys, a row as two 512-byte runs");
// alignment slack, Q, two key tiles, valid flags [2][kBlk], row maxima and sums [2][kHeads], P fragments [2][8][128]
constexpr int kSmem = 1024 + 3 * kTileBytes + 2 * kBlk * 4 + 2 * 2 * kHeads * 4 + 2 * 8 * 128 * 4;
static_assert(kHeads == kBlk, "a tile is 64 rows of heads or of keys");
// Named barriers (0 is __syncthreads): key tile b full / empty, the consumers among themselves.
constexpr int kFull = 1, kEmpty = 3, kConsumerBar = 5;

struct Args {
    const float* q;  // [T, H, kDim]
    int H;
    float scale;
    const float* sink;  // [H]
    const uint8_t* const* keys;  // [T, maxk] decoded rows (null: masked)
    const int32_t* nkeys;
    int maxk;
    float* out;  // [T, H, kDim]
};

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
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " PG_WGMMA_D32 ", %32, %33, %34, 1, 1, 0, 0;\n"
                 : PG_WGMMA_ACC32(d)
                 : "l"(a), "l"(b), "n"(ACC));
}

// s (m64 x n32, fp32) = Q (m64 x k16) K^T (+ s when ACC), both K-major bf16 tiles in shared memory.
template <int ACC>
__device__ __forceinline__ void wgmma_qk32(float (&d)[16], uint64_t a, uint64_t b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, %18, 1, 1, 0, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(a), "l"(b), "n"(ACC));
}

// o (m64 x n128, fp32) += P (m64 x k16 bf16, registers) V (k16 x n128), V MN-major in shared memory.
__device__ __forceinline__ void wgmma_pv(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " PG_WGMMA_D64
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                 : PG_WGMMA_ACC64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// Byte offset of dims 8u .. 8u + 7 of row r in a tile (u < 64: the 16-byte unit along the 512 dims).
__device__ __forceinline__ uint32_t tile_offset(int r, int u) {
    return (u >> 3) * kSliceBytes + sw128_offset(r, u & 7);
}

// Producer warp w (0..3) copies keys 16 w .. 16 w + 15 of a block. Lane l holds key 16 w + l % 16's row address,
// loaded a block ahead (block_row), so that no copy waits for its address; the warp copies each row as two runs of
// 512 contiguous bytes. A masked key or one past the list's end is zero-filled (any valid address as the source:
// nothing is read) and flagged.
__device__ __forceinline__ const uint8_t* block_row(const Args& a, int64_t t, int n, int b, int w, int lane) {
    const int j = b * kBlk + 16 * w + (lane & 15);
    return j < n ? a.keys[t * a.maxk + j] : nullptr;
}

__device__ __forceinline__ void gather_block(const Args& a, const uint8_t* row, int w, int lane, uint32_t tile,
                                             int* valid) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const uint8_t* r = reinterpret_cast<const uint8_t*>(
            __shfl_sync(0xffffffffu, static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(row)), i));
        const int k = 16 * w + i;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int u = 32 * h + lane;
            cp_async16(tile + tile_offset(k, u), r ? r + 16 * u : reinterpret_cast<const uint8_t*>(a.q), r ? 16 : 0);
        }
    }
    if (lane < 16) valid[16 * w + lane] = row != nullptr;
    cp_async_commit();
}

__global__ void __launch_bounds__(kCtaThreads, 1) sparse_attention_rows_kernel(Args a) {
    pdl_enter();
    extern __shared__ uint8_t smem_raw[];
    uint8_t* sm = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    uint8_t* Qs = sm;
    const uint32_t q_addr = smem_addr(Qs), k_addr = q_addr + kTileBytes;  // [2] key tiles after Q
    int* valid = reinterpret_cast<int*>(sm + 3 * kTileBytes);           // [2][kBlk]
    float* red_max = reinterpret_cast<float*>(valid + 2 * kBlk);        // [2][kHeads]
    float* red_sum = red_max + 2 * kHeads;                               // [2][kHeads]
    uint32_t* xchg = reinterpret_cast<uint32_t*>(red_sum + 2 * kHeads);  // [2][8][128]

    const int G = a.H / kHeads;
    const int64_t t = blockIdx.x / G;
    const int hg = static_cast<int>(blockIdx.x % G);
    const int tid = threadIdx.x;
    const int64_t row0 = t * a.H + static_cast<int64_t>(hg) * kHeads;  // first (token, head) row of the CTA
    const int n = a.nkeys[t];
    const int nblk = (n + kBlk - 1) / kBlk;

    if (tid >= kConsumers) {  // ---- producer: two blocks in flight
        setmaxnreg_dec<kProducerRegs>();
        const int w = (tid - kConsumers) >> 5, lane = tid & 31;
        const uint8_t* row = nblk > 0 ? block_row(a, t, n, 0, w, lane) : nullptr;  // the next block's
        for (int b = 0; b < 2 && b < nblk; ++b) {
            gather_block(a, row, w, lane, k_addr + b * kTileBytes, valid + b * kBlk);
            row = b + 1 < nblk ? block_row(a, t, n, b + 1, w, lane) : nullptr;
        }
        for (int b = 0; b < nblk; ++b) {
            const int buf = b & 1;
            if (b + 1 < nblk) cp_async_wait<1>();
            else cp_async_wait<0>();
            proxy_fence();
            named_arrive(kFull + buf, kCtaThreads);  // block b is in its tile
            if (b + 2 < nblk) {
                named_sync(kEmpty + buf, kCtaThreads);  // the consumers are done with block b
                gather_block(a, row, w, lane, k_addr + buf * kTileBytes, valid + buf * kBlk);
                row = b + 3 < nblk ? block_row(a, t, n, b + 3, w, lane) : nullptr;
            }
        }
        return;
    }

    // ---- consumers
    setmaxnreg_inc<kConsumerRegs>();
    const int lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3, g = lane >> 2, tq = lane & 3;
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
    named_sync(kConsumerBar, kConsumers);

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
        named_sync(kFull + buf, kCtaThreads);  // the producer has gathered block b into this tile

        float rs[2];
        uint32_t pa[kBlk / 16][4];  // P as the A fragments of the four k16 steps
        // ---- S = Q K^T for this warpgroup's 32 keys (32 wg ..: four 8-row atoms, 4 KB into each slice).
        float s[16];
        const uint32_t kw = kt + wg * 32 * 128;
        wgmma_fence();
        wgmma_qk32<0>(s, desc_sw128(q_addr), desc_sw128(kw));
#pragma unroll
        for (int kk = 1; kk < kDim / 16; ++kk) {
            const uint32_t off = (kk >> 2) * kSliceBytes + (kk & 3) * 32;
            wgmma_qk32<1>(s, desc_sw128(q_addr + off), desc_sw128(kw + off));
        }
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 16; ++i) hold(s[i]);
        // ---- Online softmax. s[4j + e]: head wq*16 + g + 8 (e >> 1), key 32 wg + 8j + 2 tq + (e & 1). The block's
        // row maxima cross warpgroups through shared memory; each keeps its own keys' share of the row sums.
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int key = 32 * wg + 8 * (i >> 2) + 2 * tq + (i & 1);
            s[i] = vb[key] ? s[i] * a.scale : -INFINITY;
            mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
        }
        float m_new[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            if (tq == 0) red_max[wg * kHeads + wq * 16 + g + 8 * r] = mx[r];
        }
        named_sync(kConsumerBar, kConsumers);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int head = wq * 16 + g + 8 * r;
            m_new[r] = fmaxf(m_run[r], fmaxf(red_max[head], red_max[kHeads + head]));
        }
        uint32_t own[2][4];  // P of this warpgroup's keys as the A fragments of k16 steps 2 wg, 2 wg + 1
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float p0 = expf(s[4 * j] - m_new[0]), p1 = expf(s[4 * j + 1] - m_new[0]);
            const float p2 = expf(s[4 * j + 2] - m_new[1]), p3 = expf(s[4 * j + 3] - m_new[1]);
            sum[0] += p0 + p1;
            sum[1] += p2 + p3;
            own[j >> 1][2 * (j & 1)] = pack_bf16(p0, p1);
            own[j >> 1][2 * (j & 1) + 1] = pack_bf16(p2, p3);
        }
        // Thread i of either warpgroup holds the same heads' fragments: swap through shared memory.
        uint32_t* xo = xchg + wg * 8 * 128 + (tid & 127);
#pragma unroll
        for (int i = 0; i < 8; ++i) xo[i * 128] = own[i >> 2][i & 3];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
            rs[r] = exp_cr(m_run[r] - m_new[r]);
            l_run[r] = l_run[r] * rs[r] + sum[r];
            m_run[r] = m_new[r];
        }
        named_sync(kConsumerBar, kConsumers);
        const uint32_t* xi = xchg + (wg ^ 1) * 8 * 128 + (tid & 127);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t other = xi[i * 128];
            pa[i >> 2][i & 3] = wg == 0 ? own[i >> 2][i & 3] : other;
            pa[2 + (i >> 2)][i & 3] = wg == 0 ? other : own[i >> 2][i & 3];
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
        if (b + 2 < nblk) named_arrive(kEmpty + buf, kCtaThreads);  // the producer may refill this tile
    }

    // The sink, normalise, round.
    {  // the row sums: both warpgroups' shares
#pragma unroll
        for (int r = 0; r < 2; ++r)
            if (tq == 0) red_sum[wg * kHeads + wq * 16 + g + 8 * r] = l_run[r];
        named_sync(kConsumerBar, kConsumers);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int head = wq * 16 + g + 8 * r;
            l_run[r] = red_sum[head] + red_sum[kHeads + head];
        }
    }
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

bool sparse_attention_rows_supported(int H, int D) { return D == kDim && H > 0 && H % kHeads == 0; }

namespace {
bool& rows_choice() {
    static bool on = switch_is("PEREGRINE_SPARSE_KERNEL", "rows");
    return on;
}
}  // namespace

bool sparse_attention_rows_enabled() { return rows_choice(); }
void sparse_attention_rows_use(bool on) { rows_choice() = on; }

void sparse_attention_rows(const float* q, int64_t T, int H, int D, float scale, const float* sink,
                           const uint8_t* const* keys, const int32_t* nkeys, int maxk, float* out) {
    if (T == 0) return;
    if (!sparse_attention_rows_supported(H, D))
        cuda_fail(cudaErrorInvalidValue, "sparse_attention_rows: needs 512-wide heads in groups of 64", __FILE__,
                  __LINE__);
    const int64_t ctas = T * (H / kHeads);
    if (ctas > 0x7fffffff) cuda_fail(cudaErrorInvalidValue, "sparse_attention_rows: too many rows", __FILE__, __LINE__);
    smem_opt_in<sparse_attention_rows_kernel>(kSmem);
    launch_pdl(sparse_attention_rows_kernel, dim3(static_cast<unsigned>(ctas)), dim3(kCtaThreads), kSmem,
               Args{q, H, scale, sink, keys, nkeys, maxk, out});
}

}  // namespace peregrine::cuda
