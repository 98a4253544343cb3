// Row-wise transforms of the attention path: RoPE/YaRN rotation, KV and indexer quantise-dequantise
// (fp8 / fp4 with ue8m0 or e4m3 scales), Hadamard rotation, V4's bf16 head norm and scattered row stores.
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/rope_qdq.cuh"

namespace peregrine::cuda {

namespace {

__global__ void rope_kernel(float* x, int64_t rows, int heads, int64_t rs, int64_t hs, int offset, const int64_t* pos,
                            const float* freqs, int dim, bool inverse) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int half = dim / 2;
    if (i >= rows * heads * half) return;
    const int64_t r = i / (heads * half);
    const int h = static_cast<int>((i / half) % heads), k = static_cast<int>(i % half);
    float* v = x + r * rs + h * hs + offset + 2 * k;
    rope_pair(v[0], v[1], pos[r], freqs, k, inverse);
}

// A thread per block: the general case.
__global__ void qdq_kernel(float* x, int64_t rows, int64_t rs, int n, int block, int kind) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int nb = n / block;
    if (i >= rows * nb) return;
    float* xb = x + (i / nb) * rs + (i % nb) * block;
    float amax = 0.0f;
    for (int j = 0; j < block; ++j) amax = fmaxf(amax, fabsf(xb[j]));
    const float s = qdq_scale(amax, kind);
    for (int j = 0; j < block; ++j) xb[j] = qdq_value(xb[j], s, kind);
}

// Four floats a thread, block / 4 lanes a block (quad_blocks; rs % 4 == 0): coalesced 16-byte loads and stores.
// n4 = rows * n / 4 is a multiple of the lanes of a block, so a block's lanes are all live or all dead.
__global__ void qdq4_kernel(float* x, int64_t n4, int64_t rs, int n, int block, int kind) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const bool live = i < n4;
    const int64_t e = live ? i * 4 : 0;
    float* p = x + (e / n) * rs + e % n;
    const float4 v = *reinterpret_cast<const float4*>(p);
    const float amax = quad_amax(v, block / 4);
    if (!live) return;
    *reinterpret_cast<float4*>(p) = qdq_quad(v, amax, kind);
}

// RoPE on dims [offset, offset + dim) of each head of hs floats, then the quantise-dequantise of its dims [0, n) in
// blocks: rope_kernel's and qdq4_kernel's arithmetic on a quad (four floats) a thread, so the same bits in one
// launch (rope_qdq_quad).
__global__ void rope_qdq_kernel(float* x, int64_t quads, int heads, int64_t rs, int64_t hs, int offset,
                                const int64_t* pos, const float* freqs, int dim, bool inverse, int n, int block,
                                int kind) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    rope_qdq_quad(x, i, i < quads, heads, rs, hs, offset, pos, freqs, dim, inverse, n, block, kind);
}

constexpr int kMaxHadamard = 1024;

__global__ void hadamard_kernel(float* x, int64_t rows, int64_t rs, int n) {
    pdl_enter();
    __shared__ double v[kMaxHadamard];
    float* xr = x + static_cast<int64_t>(blockIdx.x) * rs;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = xr[i];
    __syncthreads();
    for (int len = 1; len < n; len <<= 1) {
        for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
            const int i = (p / len) * 2 * len + p % len;
            const double a = v[i], b = v[i + len];
            v[i] = a + b;
            v[i + len] = a - b;
        }
        __syncthreads();
    }
    const float scale = static_cast<float>(pow(static_cast<double>(n), -0.5));
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] = round_bf16(static_cast<float>(v[i]) * scale);
}

__global__ void head_norm_kernel(float* x, int64_t n_heads, int D, float eps) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n_heads) return;
    float* q = x + i * D;
    float ss = 0.0f;
    for (int c = 0; c < D; ++c) ss += round_bf16(q[c] * q[c]);
    const float mean = round_bf16(ss / static_cast<float>(D));
    const float r = round_bf16(1.0f / sqrtf(round_bf16(mean + eps)));
    for (int c = 0; c < D; ++c) q[c] = round_bf16(q[c] * r);
}


__global__ void scale_round_kernel(float* x, int64_t n, float s) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < n) x[i] = round_bf16(x[i] * s);
}
// Four values a thread (n % 4 == 0, x 16-byte aligned): GEMM outputs of 100+ MB in one pass at full bandwidth.
__global__ void scale_round4_kernel(float4* x, int64_t n4, float s) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n4) return;
    const float4 v = x[i];
    x[i] = make_float4(round_bf16(v.x * s), round_bf16(v.y * s), round_bf16(v.z * s), round_bf16(v.w * s));
}

// Launched plainly: it may write what the next kernel reads before its pdl_wait (random weights).
__global__ void fill_random_kernel(float* x, int64_t n, uint64_t seed) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    uint64_t z = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xD1B54A32D192ED69ull);
    z ^= z >> 31;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    x[i] = round_bf16(static_cast<float>(static_cast<uint32_t>(z >> 40)) / 16777216.0f * 2.0f - 1.0f);
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < n) y[i] += x[i];
}

__global__ void resolve_deferred_kernel(int32_t* ids, int64_t n, const int32_t* src, int stride) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const int32_t v = ids[i];
    if (v < 0 && v != INT32_MIN) ids[i] = src[static_cast<int64_t>(-1 - v) * stride];
}

}  // namespace

bool set_pdl(bool on) { return pdl_flag().exchange(on); }

void fill_random_bf16(float* x, int64_t n, uint64_t seed) {
    if (n == 0) return;
    fill_random_kernel<<<blocks_for(n), kThreads>>>(x, n, seed);
    PG_LAUNCHED();
}

void rope(float* x, int64_t rows, int heads, int64_t rs, int64_t hs, int offset, const int64_t* pos, const float* freqs,
          int dim, bool inverse) {
    const int64_t n = rows * heads * (dim / 2);
    if (n == 0) return;
    launch_pdl(rope_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, x, rows, heads, rs, hs, offset, pos, freqs, dim,
               inverse);
}

void qdq_rows(float* x, int64_t rows, int64_t rs, int n, int block, int kind) {
    const int64_t m = rows * (n / block);
    if (m == 0) return;
    if (quad_blocks(block) && rs % 4 == 0 && aligned16(x)) {
        const int64_t n4 = rows * (n / block) * block / 4;
        launch_pdl(qdq4_kernel, dim3(blocks_for(n4)), dim3(kThreads), 0, x, n4, rs, n, block, kind);
    } else {
        launch_pdl(qdq_kernel, dim3(blocks_for(m)), dim3(kThreads), 0, x, rows, rs, n, block, kind);
    }
}

void rope_qdq(float* x, int64_t rows, int heads, int64_t rs, int64_t hs, int offset, const int64_t* pos,
              const float* freqs, int dim, bool inverse, int n, int block, int kind) {
    if (rows * heads == 0) return;
    if (!rope_qdq_takes_quads(x, rs, hs, offset, dim, n, block)) {
        if (rs != heads * hs)
            cuda_fail(cudaErrorInvalidValue, "rope_qdq: heads must be contiguous", __FILE__, __LINE__);
        rope(x, rows, heads, rs, hs, offset, pos, freqs, dim, inverse);
        qdq_rows(x, rows * heads, hs, n, block, kind);
        return;
    }
    const int64_t quads = rows * heads * (hs / 4);
    launch_pdl(rope_qdq_kernel, dim3(blocks_for(quads)), dim3(kThreads), 0, x, quads, heads, rs, hs, offset, pos, freqs,
               dim, inverse, n, block, kind);
}

void hadamard_rows(float* x, int64_t rows, int64_t rs, int n) {
    if (rows == 0) return;
    if (n > kMaxHadamard || (n & (n - 1)) != 0)
        cuda_fail(cudaErrorInvalidValue, "hadamard: width must be a power of two <= 1024", __FILE__, __LINE__);
    launch_pdl(hadamard_kernel, dim3(static_cast<unsigned>(rows)), dim3(128), 0, x, rows, rs, n);
}

void head_norm_bf16(float* x, int64_t n_heads, int D, float eps) {
    if (n_heads == 0) return;
    launch_pdl(head_norm_kernel, dim3(blocks_for(n_heads)), dim3(kThreads), 0, x, n_heads, D, eps);
}

void resolve_deferred_ids(int32_t* ids, int64_t n, const int32_t* src, int stride) {
    if (n == 0) return;
    launch_pdl(resolve_deferred_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, ids, n, src, stride);
}

void scale_round_bf16(float* x, int64_t n, float s) {
    if (n == 0) return;
    if (n % 4 == 0 && aligned16(x))
        launch_pdl(scale_round4_kernel, dim3(blocks_for(n / 4)), dim3(kThreads), 0, reinterpret_cast<float4*>(x), n / 4,
                   s);
    else
        launch_pdl(scale_round_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, x, n, s);
}

void add(float* y, const float* x, int64_t n) {
    if (n == 0) return;
    launch_pdl(add_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, y, x, n);
}

}  // namespace peregrine::cuda
