// Prefill indexer scoring on Hopper's warpgroup MMA: the same contract and rounding points as index_mma_kernel
// (index_fast.cu): per head bf16(q.k), relu, x weight, bf16, summed over heads in head order in fp32, bf16.
// A block scores 64 query rows against 384 keys: the keys' bf16 tile stays in shared memory and each of the three
// warpgroups runs m64 n128 k16 wgmmas (queries x its 128 keys, both operands from shared memory in the 128-byte
// swizzle), streaming the heads' query tiles through its own two buffers. The warpgroups take turns on the
// tensor cores, so that the others fold a head into their scores while one's MMAs run. (Overlapping within a
// warpgroup, head h + 1's MMAs in flight while head h is folded, made ptxas serialise every wgmma.)
#include "ops/cuda/cp_async.cuh"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/wgmma.cuh"

#include <cuda_bf16.h>

namespace peregrine::cuda {

namespace {

using namespace wgmma;

constexpr int kWgs = 3, kT = 64, kKeys = 128 * kWgs, kHD = 128, kBlockThreads = 128 * kWgs, kMaxHeads = 64;
constexpr int kKBytes = kKeys * kHD * 2;  // [2 halves of 64 dims][384 rows][128 B]
constexpr int kQBytes = kT * kHD * 2;     // [2 halves][64 rows][128 B]
constexpr int kQBufs = 2, kAhead = kQBufs - 1;  // query buffers per warpgroup: head h + 1 in flight
constexpr int kSmem = 1024 + kKBytes + kWgs * kQBufs * kQBytes + kMaxHeads * kT * 4 + kT * 8;
static_assert(kSmem <= 227 * 1024, "one block an SM");

// One head's fold of two scores of a row, relu(bf16(x)) x w rounded to bf16, packed (lo = x, hi = y): one
// conversion with relu and one bf16x2 multiply. The weights are bf16 values, so the product is exact before its
// one rounding, as round_bf16(fmaxf(bf16(x), 0) * w) in fp32; doing that in fp32 took twice the conversions
// (the conversion pipe runs at a sixteenth of the FP32 rate) and twice the issue slots, and bounded the kernel.
__device__ __forceinline__ uint32_t relu_times(float x, float y, uint32_t w2) {
    uint32_t p, r;
    asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(y), "f"(x));
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(p), "r"(w2));
    return r;
}

__device__ __forceinline__ uint32_t bf16_pair_of(float w) {  // w, a bf16 value, in both halves
    const uint32_t b = __float_as_uint(w) >> 16;
    return b | (b << 16);
}

// d (m64 x n128, fp32) = A (m64 x k16) B^T (+ d when ACC), both bf16 K-major tiles in shared memory.
template <int ACC>
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        PG_WGMMA_D64 ", %64, %65, %66, 1, 1, 0, 0;\n}\n"
        : PG_WGMMA_ACC64(d)
        : "l"(a), "l"(b), "n"(ACC));
}

// Named barriers: 1 + WG, a warpgroup's own (its query buffers); kTurn + WG, its turn to issue MMAs. The
// warpgroups take turns round robin: each issues a head's MMAs only after the previous one has issued its own,
// so that the others fold while one's MMAs run. Left alone they fall into step, all multiplying and then all
// folding, with the tensor cores idle during the folds. A fold (~300 instructions a warp, one warp an SM
// sub-partition issuing) takes longer than a head's MMAs, hence three warpgroups: two fold while one multiplies.
constexpr int kTurn = 1 + kWgs;

// The head loop of warpgroup WG into acc (its 128 keys of the block against the 64 query rows). WG is a
// template parameter so that the warpgroup's shared-memory addresses, and with them the wgmma descriptors, are
// uniform: built once on the uniform datapath, not per MMA on every thread. A thread copies the same 16-byte
// chunk of rows rr, rr + 8, ... of every head's query tile, so its copies' addresses are set up once.
template <int WG>
__device__ __forceinline__ void score_heads(uint32_t ks, const __nv_bfloat16* qb, const float* Ws, int nh,
                                            int64_t row0, int nrows, float (&acc)[64]) {
    const int wt = threadIdx.x & 127, lane = wt & 31, wq = wt >> 5, g = lane >> 2;
    const uint32_t kt_base = ks + WG * (128 * 128);                   // this warpgroup's 128 keys in each half
    const uint32_t q_base = ks + kKBytes + WG * kQBufs * kQBytes;     // this warpgroup's query buffers
    const int c = wt & 15, rr = wt >> 4;                              // chunk c of rows rr + 8m, m = 0..7
    int mvalid = (nrows - rr + 7) >> 3;                               // rows rr + 8m < nrows
    const char* qsrc = reinterpret_cast<const char*>(qb + ((row0 + rr) * nh) * kHD + c * 8);
    int64_t mstep = int64_t(8) * nh * kHD * 2;                        // bytes from row r to row r + 8
    uint32_t qdst = q_base + (c >> 3) * (kT * 128) + sw128_offset(rr, c & 7);  // + 1024 m: row rr + 8m
    // Kept in registers, not recomputed per head from the thread index.
    asm("" : "+l"(qsrc), "+l"(mstep), "+r"(mvalid), "+r"(qdst));
    auto load_q = [&](int h, int buf) {
        const char* src = qsrc + h * (kHD * 2);
        const uint32_t dst = qdst + buf * kQBytes;
        const char* p = src;
        if (mvalid >= 8) {  // a full tile: every row
#pragma unroll
            for (int m = 0; m < 8; ++m, p += mstep) cp_async16(dst + m * 1024, p, 16);
        } else {
#pragma unroll
            for (int m = 0; m < 8; ++m, p += mstep) {  // rows past the tile: zeros, from a valid address
                const bool ok = m < mvalid;
                cp_async16(dst + m * 1024, ok ? p : src, ok ? 16 : 0);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
        if (a < nh) load_q(a, a);
        else cp_async_commit();
    }
    cp_async_wait<kAhead - 1>();  // the keys (every thread's share) and this warpgroup's first queries
    proxy_fence();
    asm volatile("bar.sync 0;\n" ::: "memory");  // every warpgroup (each from its own instance)

    const uint64_t kdesc = desc_sw128(kt_base);
    if (WG == kWgs - 1) named_arrive(kTurn, 2 * 128);  // warpgroup 0 takes the first turn
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    float d[64];
    for (int h = 0, buf = 0; h < nh; ++h, buf = buf == kQBufs - 1 ? 0 : buf + 1) {
        if (h > 0) {  // head h's queries, copied by this warpgroup kAhead heads ago (later heads' may be in flight)
            cp_async_wait<kAhead - 1>();
            proxy_fence();
            named_sync(1 + WG, 128);
        }
        // Head h + kAhead into the buffer head h - 1 read: its MMAs are done (every warp waited before the
        // barrier). An empty group when there is no such head keeps the wait above counting right.
        if (h + kAhead < nh) load_q(h + kAhead, buf == 0 ? kQBufs - 1 : buf - 1);
        else cp_async_commit();
        // Descriptor of k16 step s: the tile's start advanced by s's offset (the address field cannot carry out).
        const uint64_t qdesc = desc_sw128(q_base + buf * kQBytes);
        named_sync(kTurn + WG, 2 * 128);  // this warpgroup's turn on the tensor cores
        wgmma_fence();
        wgmma_ss<0>(d, qdesc, kdesc);
#pragma unroll
        for (int s = 1; s < 8; ++s)
            wgmma_ss<1>(d, qdesc + (((s >> 2) * (kT * 128) + (s & 3) * 32) >> 4),
                        kdesc + (((s >> 2) * (kKeys * 128) + (s & 3) * 32) >> 4));
        wgmma_commit();
        // The next warpgroup's turn: its MMAs queue behind these (the last one's final arrival has no taker).
        if (WG < kWgs - 1 || h + 1 < nh) named_arrive(kTurn + (WG + 1) % kWgs, 2 * 128);
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 64; ++i) hold(d[i]);
        // d[4j + e]: query row wq*16 + g + 8*(e >> 1), key 8j + 2t + (e & 1) of this warpgroup's 128.
        const uint32_t wa = bf16_pair_of(Ws[h * kT + wq * 16 + g]), wb = bf16_pair_of(Ws[h * kT + wq * 16 + g + 8]);
#pragma unroll
        for (int i = 0; i < 64; i += 2) {  // columns i, i + 1 share their row
            const uint32_t v = relu_times(d[i], d[i + 1], (i & 2) ? wb : wa);
            acc[i] += __uint_as_float(v << 16);
            acc[i + 1] += __uint_as_float(v & 0xffff0000u);
        }
        // The barrier at the top of head h + 1 then tells every thread of this warpgroup that these MMAs are done.
    }
}

// tiles[4 * y] = (first row, rows <= kT, first key in kb, keys of the sequence); x: key tile of kKeys.
__global__ void __launch_bounds__(kBlockThreads, 1)
    index_wgmma_kernel(const __nv_bfloat16* qb, const float* wts, int nh, const int64_t* tiles, const __nv_bfloat16* kb,
                       const int64_t* visible, int64_t stride, float* scores) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* sm = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
    const uint32_t ks = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
    float* Ws = reinterpret_cast<float*>(sm + kKBytes + kWgs * kQBufs * kQBytes);  // [nh][kT]
    int64_t* Lim = reinterpret_cast<int64_t*>(Ws + kMaxHeads * kT);    // per row: min(width, visible)
    const int64_t* td = tiles + 4 * static_cast<int64_t>(blockIdx.y);
    const int64_t row0 = td[0], kbase = td[2], width = td[3];
    const int nrows = static_cast<int>(td[1]);
    const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kKeys;
    if (j0 >= stride) return;
    const int tid = threadIdx.x;
    for (int r = tid; r < kT; r += kBlockThreads) Lim[r] = r < nrows ? min(width, visible[row0 + r]) : 0;
    __syncthreads();
    int64_t lim_max = 0;
    for (int r = 0; r < nrows; ++r) lim_max = max(lim_max, Lim[r]);
    const int64_t jend = min(stride, j0 + kKeys);
    if (j0 >= lim_max) {  // nothing visible in this tile
        for (int i = tid; i < nrows * kKeys; i += kBlockThreads) {
            const int64_t j = j0 + i % kKeys;
            if (j < jend) scores[(row0 + i / kKeys) * stride + j] = -INFINITY;
        }
        return;
    }
    // 16-byte chunk c of a 256-byte row goes to half c / 8 of the tile, chunk c % 8 of the row there.
    for (int i = tid; i < kKeys * 16; i += kBlockThreads) {
        const int r = i >> 4, c = i & 15;
        const int64_t j = j0 + r;
        const bool ok = j < width;
        cp_async16(ks + (c >> 3) * (kKeys * 128) + sw128_offset(r, c & 7), ok ? kb + (kbase + j) * kHD + c * 8 : kb,
                   ok ? 16 : 0);
    }
    cp_async_commit();
    for (int i = tid; i < nh * kT; i += kBlockThreads) {
        const int h = i / kT, r = i % kT;
        Ws[i] = r < nrows ? wts[(row0 + r) * nh + h] : 0.0f;
    }
    float acc[64];
    const int wg = tid >> 7;
    static_assert(kWgs == 3, "one instance per warpgroup");
    if (wg == 0) score_heads<0>(ks, qb, Ws, nh, row0, nrows, acc);
    else if (wg == 1) score_heads<1>(ks, qb, Ws, nh, row0, nrows, acc);
    else score_heads<2>(ks, qb, Ws, nh, row0, nrows, acc);
    const int lane = tid & 31, wq = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        const int r = wq * 16 + g + ((i & 2) ? 8 : 0);
        const int64_t j = j0 + wg * 128 + 8 * (i >> 2) + 2 * t + (i & 1);
        if (r < nrows && j < jend) scores[(row0 + r) * stride + j] = j < Lim[r] ? round_bf16(acc[i]) : -INFINITY;
    }
}

}  // namespace

bool index_scores_wgmma_supported(int nh, int hd) { return hd == kHD && nh >= 1 && nh <= kMaxHeads; }

void index_scores_wgmma(const uint16_t* qb, const float* wts, int nh, const int64_t* tiles, int n_tiles,
                        const uint16_t* kb, const int64_t* visible, int64_t stride, float* scores) {
    if (n_tiles == 0 || stride == 0) return;
    if (!index_scores_wgmma_supported(nh, kHD) || n_tiles > 65535)
        cuda_fail(cudaErrorInvalidValue, "index_scores_wgmma: unsupported shape", __FILE__, __LINE__);
    smem_opt_in<index_wgmma_kernel>(kSmem);
    const dim3 grid(static_cast<unsigned>((stride + kKeys - 1) / kKeys), static_cast<unsigned>(n_tiles));
    index_wgmma_kernel<<<grid, kBlockThreads, kSmem>>>(reinterpret_cast<const __nv_bfloat16*>(qb), wts, nh, tiles,
                                                      reinterpret_cast<const __nv_bfloat16*>(kb), visible, stride,
                                                      scores);
    PG_LAUNCHED();
}

}  // namespace peregrine::cuda
