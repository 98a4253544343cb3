// Memory-bound GEMM for decode (few activation rows per weight read), every checkpoint format. Each weight
// byte is read from HBM once per call with 16-byte loads and dequantised in registers; the activations of a
// block's rows (at most 8: a dense row tile or a routed expert tile) and its K slice are staged once in
// shared memory, already multiplied by their e4m3 block scales. A warp owns kRows weight rows; each lane
// walks 16-byte chunks of them (a chunk never straddles a scale block), sums the chunk's products in fp32
// per row, folds them into its accumulator after the weight scale, and the warp reduces over lanes at the
// end. Small N gets a K split (partial sums reduced in slice order), so enough blocks stream weights to
// fill HBM. Products are exact (e4m3 x e4m3/e2m1 and the power-of-two scales); only the fp32 summation
// order differs from the exact kernels, before the same bf16 rounding.
//
// This is GemvKernel::cuda_cores (a block per 32-row group, a register double buffer, a separate split reduction
// kernel). The defaults are the streaming kernels of linear_gemv_stream.cu (see kernels.h and launch_rows);
// mma_sync is the older tensor-core one in linear_gemv_mma.cu.
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/device_memory.h"
#include "util/switches.h"
#include "ops/cuda/gemv_common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/launch_stream.h"
#include "ops/cuda/pdl.cuh"
#include "util/error.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace peregrine::cuda {

namespace {

enum Fmt { kF32 = 0, kBF16 = 1, kFP8 = 2, kFP4 = 3 };  // stored weight format (F32 kind may store bf16)

constexpr int kWarps = 8, kRows = 4, kThreadsPerBlock = kWarps * 32, kBlockRows = kWarps * kRows;
constexpr int kMaxTileRows = 8;
constexpr int kSmemBytes = 96 * 1024;  // activation slice budget (dynamic shared memory, opted in)

// Values per 32-bit word of a 16-byte chunk.
template <int F>
__host__ __device__ constexpr int word_values() {
    return F == kF32 ? 1 : F == kBF16 ? 2 : F == kFP8 ? 4 : 8;
}
template <int F>
__host__ __device__ constexpr int chunk_values() {
    return 4 * word_values<F>();
}

// Decodes one 32-bit word of weights into WV floats (FP4: the values x 2^-6, see below).
template <int F>
__device__ __forceinline__ void decode_word(uint32_t w, float* f) {
    if constexpr (F == kF32) {
        f[0] = __uint_as_float(w);
    } else if constexpr (F == kBF16) {
        f[0] = __uint_as_float(w << 16);
        f[1] = __uint_as_float(w & 0xffff0000u);
    } else if constexpr (F == kFP8) {
        const float2 lo = __half22float2(
            __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3)));
        const float2 hi =
            __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3)));
        f[0] = lo.x;
        f[1] = lo.y;
        f[2] = hi.x;
        f[3] = hi.y;
    } else {
        // An e2m1 nibble s.ee.m placed as the e4m3 byte s.0 0ee.m00 is exactly its value x 2^-6 (normal and
        // subnormal alike), so the hardware e4m3 conversion decodes it; the 2^6 goes into the weight scale.
        uint32_t p, q;
        fp4x8_to_e4m3(w, p, q);
        const uint32_t pairs[4] = {p & 0xffffu, p >> 16, q & 0xffffu, q >> 16};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 v = __half22float2(
                __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pairs[i]), __NV_E4M3)));
            f[2 * i] = v.x;
            f[2 * i + 1] = v.y;
        }
    }
}

__device__ __forceinline__ uint4 load_stream(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Block work: rows of x (a dense tile of <= MR rows or a routed tile), kBlockRows weight rows from n0, and
// chunks [c0, c1) of K. Activation layout in shared memory, per row, word q and sub-vector h of AV floats:
// [(m*4 + q)*NS + h][chunk][AV], so consecutive lanes (consecutive chunks) read consecutive addresses.
template <int F, int MR>
__global__ void __launch_bounds__(kThreadsPerBlock) gemv_kernel(const float* x, const float* xs, int64_t M, LinearDev w,
                                                                 float* y, float* partial, int splits, int mtiles,
                                                                 ExpertTable experts, const int32_t* row_map,
                                                                 const int4* tiles, const int32_t* n_tiles) {
    pdl_enter();
    constexpr int WV = word_values<F>(), VEC = chunk_values<F>(), AV = WV < 4 ? WV : 4, NS = WV / AV;
    constexpr int EB = F == kF32 ? 4 : F == kBF16 ? 2 : 1;  // bytes per element (FP4: handled by VEC)
    constexpr bool kScaled = F >= kFP8;
    extern __shared__ float4 smem4[];
    float* act = reinterpret_cast<float*>(smem4);
    __shared__ int64_t row_s[MR];

    const int N = w.out, K = w.in;
    // Block coordinates: dense tiles vary fastest (they share weights, so their reads meet in L2).
    int bx = static_cast<int>(blockIdx.x);
    const int mt = bx % mtiles;
    bx /= mtiles;
    const int split = bx % splits;
    const int nb = bx / splits;
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
        m0 = static_cast<int64_t>(mt) * MR;
        rows = static_cast<int>(min(static_cast<int64_t>(MR), M - m0));
    }
    if (threadIdx.x < MR)
        row_s[threadIdx.x] =
            static_cast<int>(threadIdx.x) < rows ? (row_map ? row_map[m0 + threadIdx.x] : m0 + threadIdx.x) : 0;

    // This block's K chunks.
    const int chunks = K / VEC, per = (chunks + splits - 1) / splits;
    const int c0 = split * per, c1 = min(chunks, c0 + per), C = c1 - c0;
    const int ab = kScaled ? w.act_block : 1;
    __syncthreads();

    // Stage activations (times their scales) for the block's rows and K slice, AV floats at a time (one
    // activation block: AV <= 4 divides every act_block).
    constexpr int UPC = VEC / AV;  // units per chunk
    const int per_row = C * UPC;
    for (int u = threadIdx.x; u < rows * per_row; u += kThreadsPerBlock) {
        const int m = u / per_row, ul = u - m * per_row;
        const int c = ul / UPC, within = ul % UPC, q = within / NS, h = within % NS;
        const int k = c0 * VEC + ul * AV;
        const int64_t r = row_s[m];
        float v[AV];
        if constexpr (AV == 4) {
            const float4 t = *reinterpret_cast<const float4*>(x + r * K + k);
            v[0] = t.x;
            v[1] = t.y;
            v[2] = t.z;
            v[3] = t.w;
        } else if constexpr (AV == 2) {
            const float2 t = *reinterpret_cast<const float2*>(x + r * K + k);
            v[0] = t.x;
            v[1] = t.y;
        } else {
            v[0] = x[r * K + k];
        }
        float* dst = act + (((m * 4 + q) * NS + h) * C + c) * AV;
#pragma unroll
        for (int i = 0; i < AV; ++i) {
            if constexpr (kScaled) v[i] *= xs[r * (K / ab) + k / ab];
            dst[i] = v[i];
        }
    }
    __syncthreads();
    if (C <= 0) return;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nw = nb * kBlockRows + warp * kRows;  // first weight row of this warp
    const int64_t row_bytes = static_cast<int64_t>(K) * EB / (F == kFP4 ? 2 : 1);
    const uint8_t* wrow[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
        wrow[r] = static_cast<const uint8_t*>(wb) + static_cast<int64_t>(min(nw + r, N - 1)) * row_bytes;
    const int wblk = F == kFP8 ? w.weight_block : 32, nkb = (K + wblk - 1) / wblk;

    float acc[kRows][MR];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int m = 0; m < MR; ++m) acc[r][m] = 0.0f;

    uint4 cur[kRows], nxt[kRows];
    int c = lane;
    if (c < C) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) cur[r] = load_stream(wrow[r] + static_cast<int64_t>(c0 + c) * 16);
    }
    for (; c < C; c += 32) {
        if (c + 32 < C) {
#pragma unroll
            for (int r = 0; r < kRows; ++r) nxt[r] = load_stream(wrow[r] + static_cast<int64_t>(c0 + c + 32) * 16);
        }
        float part[kRows][MR];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int m = 0; m < MR; ++m) part[r][m] = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            float wf[kRows][WV];
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                const uint32_t word = q == 0 ? cur[r].x : q == 1 ? cur[r].y : q == 2 ? cur[r].z : cur[r].w;
                decode_word<F>(word, wf[r]);
            }
#pragma unroll
            for (int m = 0; m < MR; ++m) {
                if (m >= rows) break;
                float a[WV];
#pragma unroll
                for (int h = 0; h < NS; ++h) {
                    const float* src = act + (((m * 4 + q) * NS + h) * C + c) * AV;
                    if constexpr (AV == 4) {
                        const float4 v = *reinterpret_cast<const float4*>(src);
                        a[h * 4] = v.x;
                        a[h * 4 + 1] = v.y;
                        a[h * 4 + 2] = v.z;
                        a[h * 4 + 3] = v.w;
                    } else if constexpr (AV == 2) {
                        const float2 v = *reinterpret_cast<const float2*>(src);
                        a[0] = v.x;
                        a[1] = v.y;
                    } else {
                        a[0] = src[0];
                    }
                }
#pragma unroll
                for (int r = 0; r < kRows; ++r)
#pragma unroll
                    for (int i = 0; i < WV; ++i) part[r][m] = __fmaf_rn(wf[r][i], a[i], part[r][m]);
            }
        }
        // Fold the chunk in after its weight scale (FP4: times the 2^6 of the decode).
        const int kb = (c0 + c) * VEC / wblk;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            float s = 1.0f;
            if constexpr (F == kFP8)
                s = e8m0_to_f32(__ldg(sb + static_cast<int64_t>(min(nw + r, N - 1) / wblk) * nkb + kb));
            if constexpr (F == kFP4)
                s = e8m0_to_f32(__ldg(sb + static_cast<int64_t>(min(nw + r, N - 1)) * (K / 32) + kb)) * 64.0f;
#pragma unroll
            for (int m = 0; m < MR; ++m) {
                if (m >= rows) break;
                acc[r][m] = kScaled ? __fmaf_rn(part[r][m], s, acc[r][m]) : acc[r][m] + part[r][m];
            }
        }
        if (c + 32 < C) {
#pragma unroll
            for (int r = 0; r < kRows; ++r) cur[r] = nxt[r];
        }
    }

    // Reduce over the warp's lanes; lane (r*MR + m) % 32 writes output (r, m).
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int m = 0; m < MR; ++m) {
            if (m >= rows) break;
            float v = acc[r][m];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            const int n = nw + r;
            if (lane == (r * MR + m) % 32 && n < N) {
                const int64_t idx = row_s[m] * N + n;
                if (splits > 1) partial[static_cast<int64_t>(split) * M * N + idx] = v;
                else y[idx] = w.kind == 0 ? v : round_bf16(v);
            }
        }
}

// y = sum of the slices' partial sums in slice order, then the output rounding.
__global__ void gemv_reduce_kernel(const float* partial, int splits, int64_t n, bool round, float* y) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    float s = partial[i];
    for (int k = 1; k < splits; ++k) s += partial[k * n + i];
    y[i] = round ? round_bf16(s) : s;
}

int stored_format(const LinearDev& w) {
    if (w.kind == 0) return w.w_bf16 ? kBF16 : kF32;
    return w.kind;
}

template <int F, int MR>
void launch(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y, const ExpertTable* experts,
            const LinearRouting* routing) {
    constexpr int VEC = chunk_values<F>();
    const int N = w.out, chunks = w.in / VEC;
    const int nblocks = (N + kBlockRows - 1) / kBlockRows;
    const int mtiles = routing ? 1 : static_cast<int>((M + MR - 1) / MR);
    // Routed: at most one tile per row, and the launch covers max_tiles (blocks past n_tiles exit at once).
    const int64_t tiles = routing ? std::min<int64_t>(routing->max_tiles, M) : 1;
    if (tiles > 65535) fail("linear_gemv: {} routed tiles exceed the grid limit", tiles);
    // K split: the activation slice must fit shared memory; beyond that, split until ~4 blocks per SM
    // stream weights, keeping at least one chunk per lane and slice.
    const int max_chunks_smem = kSmemBytes / (MR * VEC * static_cast<int>(sizeof(float)));
    const int min_splits = (chunks + max_chunks_smem - 1) / max_chunks_smem;
    const int64_t blocks = static_cast<int64_t>(nblocks) * mtiles * tiles;
    const int64_t want = (4 * static_cast<int64_t>(sm_count()) + blocks - 1) / blocks;
    const int max_splits = std::max(min_splits, chunks / 32);
    int splits =
        static_cast<int>(std::clamp<int64_t>(want, min_splits, std::max(min_splits, std::min(max_splits, 32))));
    // Slices of whole rounds of 32 chunks where shared memory allows (every lane busy), none empty.
    int per = (chunks + splits - 1) / splits;
    if (per > 32 && (per + 31) / 32 * 32 <= max_chunks_smem) per = (per + 31) / 32 * 32;
    splits = (chunks + per - 1) / per;
    const size_t smem = static_cast<size_t>(MR) * per * VEC * sizeof(float);
    smem_opt_in<gemv_kernel<F, MR>>(kSmemBytes);

    std::shared_ptr<void> keep;  // freed in stream order after the reduction
    float* partial = nullptr;
    if (splits > 1) {
        keep = device_alloc(sizeof(float) * static_cast<size_t>(splits) * static_cast<size_t>(M) * N);
        partial = static_cast<float*>(keep.get());
    }
    const int64_t gx = static_cast<int64_t>(nblocks) * splits * mtiles;
    if (gx > 0x7fffffff) fail("linear_gemv: grid of {} blocks is too large", gx);
    dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(tiles));
    launch_pdl(gemv_kernel<F, MR>, grid, dim3(kThreadsPerBlock), smem, x, xs, M, w, y, partial, splits, mtiles,
               experts ? *experts : ExpertTable{}, routing ? routing->row_map : nullptr,
               routing ? reinterpret_cast<const int4*>(routing->tiles) : nullptr, routing ? routing->n_tiles : nullptr);
    if (splits > 1) {
        const int64_t n = M * N;
        launch_pdl(gemv_reduce_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, partial, splits, n, w.kind != 0, y);
    }
}

// Kernel per stored format (F32, BF16, FP8, FP4), from the environment at start (see kernels.h). The defaults are
// the fastest end to end on the H200 (bench engine, 4 layers, 8K context): stream_256x4 for bf16 and FP8; for the
// routed FP4 experts fp4_16warps up to 384 pairs (about a pair per expert: 2627 against 2545 GB/s for
// persistent_256x4 at 192 pairs, which had taken batch 64 in 11.6 ms of routed experts against 13.6 with 12 warps)
// and fp4_12warps above (batch 128: 12.6 ms against 19.2 with 8 warps), unless a kernel was asked for.
struct Kernels {
    GemvKernel k[4] = {GemvKernel::cuda_cores, GemvKernel::stream_256x4, GemvKernel::stream_256x4,
                       GemvKernel::fp4_16warps};
    bool fuse = true;
    bool fp4_auto = true;  // FP4 not set by the environment or a setter
};
// F32 linears take the CUDA-core kernel; BF16 has no mma_sync form.
GemvKernel clamp_kernel(int format, GemvKernel k) {
    if (format == kF32) return GemvKernel::cuda_cores;
    if (format == kBF16 && k == GemvKernel::mma_sync) return GemvKernel::cuda_cores;
    return k;
}
Kernels& kernels() {
    static Kernels ks = [] {
        Kernels r;
        const std::string spec = switch_value("PEREGRINE_GEMV_KERNEL");
        size_t at = 0;
        while (at < spec.size()) {  // "<name>" or "fmt=<name>,..."
            const size_t end = std::min(spec.find(',', at), spec.size());
            const std::string item = spec.substr(at, end - at);
            at = end + 1;
            const size_t eq = item.find('=');
            const std::string fmt = eq == std::string::npos ? "" : item.substr(0, eq);
            const GemvKernel k = gemv_kernel_named(eq == std::string::npos ? item : item.substr(eq + 1));
            static const char* formats[4] = {"f32", "bf16", "fp8", "fp4"};
            bool known = fmt.empty();
            for (int f = 0; f < 4; ++f)
                if (fmt.empty() || fmt == formats[f]) {
                    known = true;
                    r.k[f] = clamp_kernel(f, k);
                    if (f == kFP4) r.fp4_auto = false;
                }
            if (!known) fail("PEREGRINE_GEMV_KERNEL: no stored format '{}' (f32, bf16, fp8, fp4)", fmt);
        }
        r.fuse = switch_is("PEREGRINE_GEMV_FUSE", "1");
        return r;
    }();
    return ks;
}

// The kernel a call of M rows uses (routed: M pairs).
GemvKernel kernel_for(int format, int64_t M, bool routed) {
    const Kernels& ks = kernels();
    if (format == kFP4 && routed && ks.fp4_auto && M > 384) return GemvKernel::fp4_12warps;
    return ks.k[format];
}

template <int F>
void launch_rows(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y, const ExpertTable* experts,
                 const LinearRouting* routing) {
    const int64_t rows = routing ? routing->tile_rows : M;
    const GemvKernel k = kernel_for(F, M, routing != nullptr);
    // The streaming kernels (the defaults); mma_sync, the older tensor-core kernel for FP8/FP4; else this one. (A
    // cp.async-pipelined CUDA-core kernel measured 1.2-1.8x slower than the tensor-core one on every FP8/FP4 shape on
    // the H200, and slower than this one on the bf16 LM head and the grouped wo_a.)
    if (gemv_kernel_streams(k) && linear_gemv_stream_supported(w)) {
        linear_gemv_stream(k, x, xs, M, w, y, experts, routing);
        return;
    }
    if (F >= kFP8 && xs == nullptr) fail("linear_gemv: unquantised activations need a quantising kernel");
    if (k != GemvKernel::cuda_cores && linear_gemv_mma_supported(w)) {
        linear_gemv_mma(x, xs, M, w, y, experts, routing);
        return;
    }
    if (rows <= 1) launch<F, 1>(x, xs, M, w, y, experts, routing);
    else if (rows <= 2) launch<F, 2>(x, xs, M, w, y, experts, routing);
    else if (rows <= 4) launch<F, 4>(x, xs, M, w, y, experts, routing);
    else launch<F, 8>(x, xs, M, w, y, experts, routing);
}

}  // namespace

int sm_count() {
    static const int n = [] {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            v = 132;
        return v;
    }();
    return n;
}

// Stream-ordered on the launch stream of its set, so the next call there may reuse it at once; the tickets are left
// zero by the kernels. One per device, thread and set: threads run on streams of their own (ranks sharing a GPU),
// and a side stream's GEMVs run beside the thread's, so they must not share partial sums or tickets. Freed when the
// thread ends.
void* gemv_scratch(int which, size_t bytes, bool zero, int set) {
    struct Scratch {
        void* p = nullptr;
        size_t bytes = 0;
        ~Scratch() {
            if (p) cudaFree(p);
        }
    };
    constexpr int kMaxDevices = 16;
    thread_local Scratch table[kMaxDevices][kGemvScratchSets][3];
    const cudaStream_t stream = launch_stream();
    if (set < 0) set = stream == cudaStreamPerThread ? 0 : 1;
    int dev = 0;
    PG_CUDA(cudaGetDevice(&dev));
    if (dev < 0 || dev >= kMaxDevices || which < 0 || which > 2 || set >= kGemvScratchSets)
        fail("linear_gemv: no scratch {} of set {} on device {}", which, set, dev);
    Scratch& s = table[dev][set][which];
    if (bytes > s.bytes) {
        if (s.p) PG_CUDA(cudaFreeAsync(s.p, stream));
        s.bytes = std::max(bytes, 2 * s.bytes);
        PG_CUDA(cudaMallocAsync(&s.p, s.bytes, stream));
        if (zero) PG_CUDA(cudaMemsetAsync(s.p, 0, s.bytes, stream));
    }
    return s.p;
}

void linear_gemv_pair(const float* x, const float* xs, int64_t M, const LinearDev& a, float* ya, const LinearDev& b,
                      float* yb, const ExpertTable* ea, const ExpertTable* eb, const LinearRouting* routing) {
    static const bool on = switch_is("PEREGRINE_GEMV_PAIR", "1");
    const bool routed = routing != nullptr;
    const GemvKernel k = kernel_for(stored_format(a), M, routed);
    if (on && M > 0 && gemv_kernel_streams(k) && kernel_for(stored_format(b), M, routed) == k &&
        linear_gemv_stream_pairs(a, b)) {
        linear_gemv_stream_pair(k, x, xs, M, a, ya, b, yb, ea, eb, routing);
        return;
    }
    linear_gemv(x, xs, M, a, ya, ea, routing);
    linear_gemv(x, xs, M, b, yb, eb, routing);
}

const char* gemv_kernel_name(GemvKernel k) {
    switch (k) {
        case GemvKernel::cuda_cores: return "cuda-cores";
        case GemvKernel::mma_sync: return "mma-sync";
        case GemvKernel::stream_128x6: return "stream-128x6";
        case GemvKernel::stream_256x4: return "stream-256x4";
        case GemvKernel::stream_128x4_2ctas: return "stream-128x4-2ctas";
        case GemvKernel::persistent_128x6: return "persistent-128x6";
        case GemvKernel::persistent_256x4: return "persistent-256x4";
        case GemvKernel::fp4_12warps: return "fp4-12warps";
        case GemvKernel::fp4_16warps: return "fp4-16warps";
    }
    return "?";
}

GemvKernel gemv_kernel_named(const std::string& name) {
    std::string all;
    for (GemvKernel k : {GemvKernel::cuda_cores, GemvKernel::mma_sync, GemvKernel::stream_128x6,
                         GemvKernel::stream_256x4, GemvKernel::stream_128x4_2ctas, GemvKernel::persistent_128x6,
                         GemvKernel::persistent_256x4, GemvKernel::fp4_12warps, GemvKernel::fp4_16warps}) {
        if (name == gemv_kernel_name(k)) return k;
        all += std::string(all.empty() ? "" : ", ") + gemv_kernel_name(k);
    }
    fail("no decode GEMV kernel '{}' ({})", name, all);
}

void linear_gemv_set_kernel(GemvKernel k) {
    for (int f = 0; f < 4; ++f) kernels().k[f] = clamp_kernel(f, k);
    kernels().fp4_auto = false;
}
void linear_gemv_set_kernel(int format, GemvKernel k) {
    if (format < 0 || format > 3) fail("linear_gemv: no stored format {}", format);
    kernels().k[format] = clamp_kernel(format, k);
    if (format == kFP4) kernels().fp4_auto = false;
}
GemvKernel linear_gemv_kernel(int format) {
    return format >= 0 && format < 4 ? kernels().k[format] : GemvKernel::cuda_cores;
}
void linear_gemv_set_fuse(bool on) { kernels().fuse = on; }

bool linear_gemv_quantises(const LinearDev& w) {
    if (w.kind != kFP8 && w.kind != kFP4) return false;
    return kernels().fuse && gemv_kernel_streams(kernels().k[w.kind]) && linear_gemv_stream_quantises(w);
}

bool linear_gemv_supported(const LinearDev& w) {
    if (w.out <= 0 || w.in <= 0) return false;
    if (reinterpret_cast<uintptr_t>(w.w) % 16 != 0) return false;  // 16-byte weight loads
    switch (stored_format(w)) {
        case kF32: return w.in % 4 == 0;
        case kBF16: return w.in % 8 == 0;
        case kFP8:  // one activation scale per weight block (the reference's pairing), chunks inside a block
            return w.in % 16 == 0 && w.weight_block % 16 == 0 && w.act_block == w.weight_block &&
                   w.in % w.act_block == 0;
        default: return w.in % 32 == 0 && w.act_block > 0 && w.act_block % 32 == 0 && w.in % w.act_block == 0;
    }
}

void linear_gemv(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y, const ExpertTable* experts,
                 const LinearRouting* routing) {
    if (M == 0 || w.out == 0) return;
    if (reinterpret_cast<uintptr_t>(x) % 16 != 0) fail("linear_gemv: activations must be 16-byte aligned");
    if (!linear_gemv_supported(w)) fail("linear_gemv: unsupported linear (kind {}, in {}, blocks {}/{})", w.kind, w.in,
                                        w.weight_block, w.act_block);
    if (routing && routing->tile_rows > kMaxTileRows)
        fail("linear_gemv: routed tiles of {} rows (at most {})", routing->tile_rows, kMaxTileRows);
    switch (stored_format(w)) {
        case kF32: launch_rows<kF32>(x, xs, M, w, y, experts, routing); break;
        case kBF16: launch_rows<kBF16>(x, xs, M, w, y, experts, routing); break;
        case kFP8: launch_rows<kFP8>(x, xs, M, w, y, experts, routing); break;
        default: launch_rows<kFP4>(x, xs, M, w, y, experts, routing); break;
    }
}

}  // namespace peregrine::cuda
