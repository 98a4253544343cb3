// Routed FP4 expert GEMMs on the tensor cores without a bf16 copy of the weights: every block takes up to 64
// sorted rows of one expert and 128 output columns, streams the expert's packed e2m1 codes and ue8m0 scales
// into shared memory (cp.async, three stages) and dequantises them straight into mma.sync bf16 B fragments
// (a code pair is one byte: a 256-entry table gives the two bf16 values, one bf16x2 multiply applies the
// power-of-two scale; both steps are exact). Activations are gathered once per call into sorted bf16 rows with
// their ue8m0 scales folded in (exact: e4m3 x 2^k). Products are exact in fp32 and summed in fp32 in the
// tensor cores' order; outputs are rounded to bf16 as the reference rounds them, and scattered to the pair
// rows. The gated form runs w1 and w3 over the same rows in one pass and applies the clamped SwiGLU and the
// routing weight in the epilogue (moe_kernels.cu swiglu_kernel's arithmetic).
#include "ops/cuda/device_scratch.h"
#include "util/switches.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/moe_gemm_fp4.h"
#include "ops/cuda/moe_gemm_fp4_common.cuh"

#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>

namespace peregrine::cuda {

namespace {

using namespace fp4g;

constexpr int kBK = 128, kStages = 3, kGemmThreads = 128;  // 4 warps, each all 64 rows x 32 columns
constexpr int kWRows = 128;                                        // weight rows staged per block (all sets)
constexpr int kAStage = kBM * kBK * 2;                             // bf16, 16-byte chunks swizzled by row
constexpr int kWRow = 80;                                          // 64 code bytes + 16 (conflict-free reads)
constexpr int kWStage = kWRows * kWRow;
constexpr int kSStage = kWRows * 4;                                // 4 ue8m0 scales per row and k tile
constexpr int kStage = kAStage + kWStage + kSStage;
// The code-pair table, 16 copies interleaved so that lane l reads copy l % 16: random code bytes across a
// warp then cost at most two shared-memory wavefronts instead of ~3.5 (bank conflicts).
constexpr int kLutCopies = 16;
constexpr int kSmem = kStages * kStage + 256 * kLutCopies * 4;  // 97,792 bytes: two blocks per SM
static_assert(kStage % 16 == 0, "stages stay 16-byte aligned");

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// bf16 bits of an e2m1 code (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives).
__device__ __forceinline__ uint32_t e2m1_bf16(uint32_t code) {
    const uint32_t mag = code & 7;
    const uint32_t bits = mag == 0 ? 0u : mag == 1 ? 0x3f00u : 0x3f80u + ((mag - 2) << 6);
    return bits | ((code & 8) << 12);
}

// bf16x2 of the ue8m0 scale 2^(s-127) (s = 0: the subnormal 2^-127; s = 255 is NaN in ue8m0: left as inf).
__device__ __forceinline__ uint32_t scale_bf16x2(uint32_t s) {
    const uint32_t b = s == 0 ? 0x40u : s << 7;
    return b | (b << 16);
}

// Sorted row tiles of at most tr rows, one expert each, from the routing's tiles (rows of an expert are
// contiguous in the sorted order): out[i] = (expert, first sorted row, rows, 0).
__global__ void row_tiles_kernel(const int4* tiles, const int32_t* n_tiles, int E, int tr, unsigned max_out,
                                 int4* out, int32_t* n_out) {
    extern __shared__ int32_t sh[];
    int32_t *first = sh, *count = sh + E, *base = sh + 2 * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        first[e] = INT_MAX;
        count[e] = 0;
    }
    __syncthreads();
    const int nt = *n_tiles;
    for (int i = threadIdx.x; i < nt; i += blockDim.x) {
        const int4 t = tiles[i];
        if (t.z <= 0 || t.x < 0 || t.x >= E) continue;
        atomicMin(&first[t.x], t.y);
        atomicAdd(&count[t.x], t.z);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int n = 0;
        for (int e = 0; e < E; ++e) {
            base[e] = n;
            n += (count[e] + tr - 1) / tr;
        }
        *n_out = min(n, static_cast<int>(max_out));
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int r = 0, i = base[e]; r < count[e]; r += tr, ++i)
            if (i < static_cast<int>(max_out)) out[i] = make_int4(e, first[e] + r, min(tr, count[e] - r), 0);
}

// a[s, :] = bf16(x[row_map[s] / div, :] * xs[.., k / ab]) for the sorted rows s, 8 values per thread; with
// `slots`, each block of 64 in the wgmma kernel's order (slot c holds k = wgmma_k_source(c)).
__global__ void gather_sorted_kernel(const float* x, const float* xs, int ab, int64_t rows, int K,
                                     const int32_t* row_map, int div, bool slots, __nv_bfloat16* a) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int per = K / 8;
    if (i >= rows * per) return;
    const int64_t s = i / per;
    const int k = static_cast<int>(i % per) * 8;
    const int64_t src = row_map[s] / div;
    const float* xr = x + src * K;
    const float* sr = xs ? xs + src * (K / ab) : nullptr;
    float v[8];
    if (slots) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int kk = (k & ~63) + wgmma_k_source((k & 63) + j);
            v[j] = xr[kk] * (sr ? sr[kk / ab] : 1.0f);
        }
    } else {
        const float4 u = *reinterpret_cast<const float4*>(xr + k), w = *reinterpret_cast<const float4*>(xr + k + 4);
        const float sc = sr ? sr[k / ab] : 1.0f;
        v[0] = u.x * sc, v[1] = u.y * sc, v[2] = u.z * sc, v[3] = u.w * sc;
        v[4] = w.x * sc, v[5] = w.y * sc, v[6] = w.z * sc, v[7] = w.w * sc;
    }
    __nv_bfloat162 h[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
    uint4 o;
    memcpy(&o, h, sizeof(o));
    *reinterpret_cast<uint4*>(a + s * K + k) = o;
}

// GATED: the 128 staged weight rows are 64 of w1 then the same 64 of w3 (64 output columns per block);
// otherwise 128 rows of one weight (128 output columns). Each warp owns 4 n8 column tiles of the staged rows:
// GATED, 2 of w1 and the same 2 of w3.
template <bool GATED>
__global__ void __launch_bounds__(kGemmThreads) fp4_grouped_kernel(GemmArgs g) {
    constexpr int kSets = GATED ? 2 : 1, kCols = kWRows / kSets, kJ = 4 / kSets;
    extern __shared__ __align__(16) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    uint32_t* lut = reinterpret_cast<uint32_t*>(smem + kStages * kStage);
    for (int i = tid; i < 256 * kLutCopies; i += kGemmThreads) {
        const int b = i / kLutCopies;
        lut[i] = e2m1_bf16(b & 15) | (e2m1_bf16(b >> 4) << 16);
    }
    const uint32_t* my_lut = lut + (threadIdx.x & (kLutCopies - 1));
    if (static_cast<int>(blockIdx.y) >= *g.n_tiles) return;
    const int4 tile = g.tiles[blockIdx.y];
    const int e = tile.x, row0 = tile.y, rows = tile.z;
    const int n0 = blockIdx.x * kCols;
    const int K = g.K, KB = K / 2, KS = K / 32, KT = K / kBK;
    const uint8_t *wq0 = static_cast<const uint8_t*>(g.w0.w[e]), *ws0 = g.w0.scale[e];
    const uint8_t *wq1 = wq0, *ws1 = ws0;
    if constexpr (GATED) {
        wq1 = static_cast<const uint8_t*>(g.w1.w[e]);
        ws1 = g.w1.scale[e];
    }

    auto load = [&](int kt, int s) {
        uint8_t* st = smem + s * kStage;
        for (int c = tid; c < kBM * 16; c += kGemmThreads) {  // A: 64 rows x 16 chunks of 8 bf16
            const int r = c >> 4, ch = c & 15;
            const bool ok = r < rows;
            const __nv_bfloat16* src = g.a + static_cast<int64_t>(row0 + (ok ? r : 0)) * K + kt * kBK + ch * 8;
            cp_async16(st + r * (kBK * 2) + ((ch ^ (r & 7)) << 4), src, ok ? 16 : 0);
        }
        for (int c = tid; c < kWRows * 4; c += kGemmThreads) {  // codes: 128 rows x 4 chunks of 16 bytes
            const int r = c >> 2, ch = c & 3, set = r / kCols, n = n0 + r % kCols;
            const uint8_t* src = (GATED && set) ? wq1 : wq0;
            cp_async16(st + kAStage + r * kWRow + ch * 16,
                       src + static_cast<int64_t>(n) * KB + kt * (kBK / 2) + ch * 16, 16);
        }
        for (int r = tid; r < kWRows; r += kGemmThreads) {  // scales: 4 per row
            const int set = r / kCols, n = n0 + r % kCols;
            const uint8_t* src = (GATED && set) ? ws1 : ws0;
            cp_async4(st + kAStage + kWStage + r * 4, src + static_cast<int64_t>(n) * KS + kt * (kBK / 32));
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < KT) load(s, s);
        cp_async_commit();
    }
    const int g4 = lane >> 2, q = lane & 3;
    int wrow[4];  // staged weight row of this thread's column in n8 tile jj
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
        const int set = jj / kJ, j = jj % kJ;
        wrow[jj] = set * kCols + warp * (8 * kJ) + j * 8 + g4;
    }
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<kStages - 2>();
        __syncthreads();  // stage kt visible; everyone is past tile kt-1, whose stage is refilled next
        if (kt + kStages - 1 < KT) load(kt + kStages - 1, (kt + kStages - 1) % kStages);
        cp_async_commit();
        const uint8_t* st = smem + (kt % kStages) * kStage;
        const uint8_t* codes = st + kAStage;
        const uint32_t* scales = reinterpret_cast<const uint32_t*>(st + kAStage + kWStage);
        uint32_t s4[4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) s4[jj] = scales[wrow[jj]];
#pragma unroll
        for (int ks = 0; ks < kBK / 16; ++ks) {
            uint32_t af[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = i * 16 + (lane & 15), ch = ks * 2 + (lane >> 4);
                ldmatrix_x4(af[i], st + r * (kBK * 2) + ((ch ^ (r & 7)) << 4));
            }
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const uint8_t* p = codes + wrow[jj] * kWRow + ks * 8 + q;
                const uint32_t sc = scale_bf16x2((s4[jj] >> (8 * (ks >> 1))) & 0xffu);
                const uint32_t b0 = mul_bf16x2(my_lut[p[0] * kLutCopies], sc),
                               b1 = mul_bf16x2(my_lut[p[4] * kLutCopies], sc);
#pragma unroll
                for (int i = 0; i < 4; ++i) mma_bf16(acc[i][jj], af[i], b0, b1);
            }
        }
    }
    cp_async_wait<0>();

    // Epilogue: rows i*16 + g4 (+8), columns 2q, 2q+1 of each n8 tile.
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = i * 16 + g4 + 8 * h;
            if (r >= rows) continue;
            const int64_t pair = g.row_map[row0 + r];
            float* out = g.y + pair * g.N + n0 + warp * (8 * kJ) + 2 * q;
#pragma unroll
            for (int j = 0; j < kJ; ++j) {
                float v[2];
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    if constexpr (GATED) {
                        v[c] = gated_out(acc[i][j][2 * h + c], acc[i][kJ + j][2 * h + c], g.limit, g.route_w[pair]);
                    } else {
                        v[c] = round_bf16(acc[i][j][2 * h + c]);
                    }
                }
                *reinterpret_cast<float2*>(out + j * 8) = make_float2(v[0], v[1]);
            }
        }
}

// The sorted bf16 rows and the row tiles: one scratch per device and thread (threads have streams of their own),
// freed when the thread ends.
DeviceScratch& scratch() {
    int dev = 0;
    PG_CUDA(cudaGetDevice(&dev));
    thread_local std::map<int, DeviceScratch> per_device;
    return per_device[dev];
}

template <bool GATED>
void run(const float* x, const float* xs, int64_t M, int div, int E, const LinearDev& w, const ExpertTable& w0,
         const ExpertTable& w1, const LinearRouting& r, const float* route_w, float limit, float* y) {
    const int K = w.in, N = w.out;
    const int64_t P = M;  // sorted rows = pairs
    if (P == 0 || N == 0) return;
    if (E <= 0 || E > 4096 || div <= 0)
        cuda_fail(cudaErrorInvalidValue, "fp4_grouped: bad expert count", __FILE__, __LINE__);
    if (!fp4_grouped_supported(w))
        cuda_fail(cudaErrorInvalidValue, "fp4_grouped: unsupported shape", __FILE__, __LINE__);
    DeviceScratch& s = scratch();
    const bool wgmma = fp4_grouped_wgmma() && wgmma_supported(K, N, GATED);
    // The wgmma kernel takes 128-token tiles once the experts average 128 rows: a dequantised weight then feeds
    // twice the MMAs. Below that, half-empty tiles would cost more MMA time than the dequantisation saved.
    const int forced = fp4_grouped_wgmma_tile();
    const int tr = !wgmma ? kBM : forced ? forced : P >= 128 * int64_t(E) ? 128 : kBM;
    const unsigned max_tiles = static_cast<unsigned>((P + tr - 1) / tr + E);  // each expert adds <= 1 partial tile
    if (max_tiles > 65535u) cuda_fail(cudaErrorInvalidValue, "fp4_grouped: too many row tiles", __FILE__, __LINE__);
    const size_t abytes = (static_cast<size_t>(P) * K * 2 + 255) & ~size_t(255);
    char* base = s.reserve(abytes + sizeof(int4) * max_tiles + 16);
    auto* a = reinterpret_cast<__nv_bfloat16*>(base);
    auto* tiles = reinterpret_cast<int4*>(base + abytes);
    auto* n_tiles = reinterpret_cast<int32_t*>(base + abytes + sizeof(int4) * max_tiles);

    gather_sorted_kernel<<<blocks_for(P * (K / 8), 256), 256>>>(x, xs, w.act_block, P, K, r.row_map, div, wgmma, a);
    PG_LAUNCHED();
    row_tiles_kernel<<<1, 1024, 3 * sizeof(int32_t) * E>>>(reinterpret_cast<const int4*>(r.tiles), r.n_tiles, E, tr,
                                                            max_tiles, tiles, n_tiles);
    PG_LAUNCHED();

    GemmArgs args{a, K, N, w0, w1, r.row_map, tiles, n_tiles, y, route_w, limit};
    if (wgmma) {
        launch_wgmma(args, GATED, tr, max_tiles);
        return;
    }
    smem_opt_in<fp4_grouped_kernel<true>>(kSmem);
    smem_opt_in<fp4_grouped_kernel<false>>(kSmem);
    const int cols = GATED ? kWRows / 2 : kWRows;
    const dim3 grid(static_cast<unsigned>(N / cols), max_tiles);
    fp4_grouped_kernel<GATED><<<grid, kGemmThreads, kSmem>>>(args);
    PG_LAUNCHED();
}

// The wgmma kernel unless PEREGRINE_MOE_GEMM=mma (A/B) or a test chose.
int& wgmma_choice() {
    static int on = switch_is("PEREGRINE_MOE_GEMM", "mma") ? 0 : 1;
    return on;
}

// Its tile: by rows per expert (0) unless PEREGRINE_MOE_GEMM_TOKENS=64|128 (A/B) or a test chose.
int& wgmma_tile_choice() {
    static int t = switch_is("PEREGRINE_MOE_GEMM_TOKENS", "64")    ? 64
                   : switch_is("PEREGRINE_MOE_GEMM_TOKENS", "128") ? 128
                                                                   : 0;
    return t;
}

}  // namespace

void fp4_grouped_use_wgmma(bool on) { wgmma_choice() = on ? 1 : 0; }
bool fp4_grouped_wgmma() { return wgmma_choice() != 0; }
void fp4_grouped_wgmma_tile(int tokens) { wgmma_tile_choice() = tokens == 64 || tokens == 128 ? tokens : 0; }
int fp4_grouped_wgmma_tile() { return wgmma_tile_choice(); }

bool fp4_grouped_supported(const LinearDev& w) {
    return w.kind == 3 && w.in > 0 && w.in % kBK == 0 && w.out > 0 && w.out % kWRows == 0 && w.act_block > 0 &&
           w.act_block % 8 == 0 && w.in % w.act_block == 0;
}

void fp4_grouped_linear(const float* x, const float* xs, int64_t M, int div, int E, const LinearDev& w,
                        const ExpertTable& experts, const LinearRouting& r, float* y) {
    run<false>(x, xs, M, div, E, w, experts, experts, r, nullptr, 0.0f, y);
}

void fp4_grouped_swiglu(const float* x, const float* xs, int64_t M, int div, int E, const LinearDev& w1,
                        const ExpertTable& e1, const ExpertTable& e3, const LinearRouting& r, const float* route_w,
                        float limit, float* out) {
    run<true>(x, xs, M, div, E, w1, e1, e3, r, route_w, limit, out);
}

}  // namespace peregrine::cuda
