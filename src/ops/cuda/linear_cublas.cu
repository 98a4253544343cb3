// Operand preparation for the cuBLAS GEMMs. Every value written is exact: e4m3 and e2m1 codes times a
// power-of-two scale, bf16 activations and bf16 weights all fit bf16's 8-bit significand, so the GEMM sees
// the same products as the exact kernels. Each thread handles 8 consecutive k (one 16-byte bf16 store).
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/linear_cublas.h"

namespace peregrine::cuda::cublas_prep {

namespace {

__device__ __forceinline__ bool aligned(const void* p, unsigned bytes) {
    return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

__device__ __forceinline__ void store8(__nv_bfloat16* out, const float (&v)[8]) {
    uint4 u;
    __nv_bfloat162 h[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
    static_assert(sizeof(h) == sizeof(u), "8 bf16 in 16 bytes");
    memcpy(&u, h, sizeof(u));
    *reinterpret_cast<uint4*>(out) = u;
}

__device__ __forceinline__ void store8(float* out, const float (&v)[8]) {
    reinterpret_cast<float4*>(out)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(out)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

__device__ __forceinline__ void load8_f32(const float* p, float (&v)[8]) {
    if (aligned(p, 16)) {
        const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = p[j];
    }
}

__device__ __forceinline__ void load8_bf16(const uint16_t* p, float (&v)[8]) {
    if (aligned(p, 16)) {
        const uint4 u = *reinterpret_cast<const uint4*>(p);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            v[2 * j] = __uint_as_float(w[j] << 16);
            v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = bf16_bits_to_f32(p[j]);
    }
}

// e2m1 code -> value without a lookup table (0, 0.5, then 2^(e-1) * (1 + m/2) for e = code >> 1 >= 1).
__device__ __forceinline__ float e2m1_value(uint32_t code) {
    const uint32_t mag = code & 7, e = mag >> 1;
    const float v = e == 0 ? 0.5f * static_cast<float>(mag) : __uint_as_float(((e + 126u) << 23) | ((mag & 1u) << 22));
    return (code & 8) ? -v : v;
}

// Values k .. k+7 of weight row n, scaled (k % 8 == 0; FP8 blocks and FP4 groups are multiples of 8 wide).
__device__ __forceinline__ void weight8(const LinearDev& w, const void* base, const uint8_t* scale, int64_t n, int k,
                                        float (&v)[8]) {
    const int K = w.in;
    switch (w.kind) {
        case 0:
            if (w.w_bf16) load8_bf16(static_cast<const uint16_t*>(base) + n * K + k, v);
            else load8_f32(static_cast<const float*>(base) + n * K + k, v);
            return;
        case 1: load8_bf16(static_cast<const uint16_t*>(base) + n * K + k, v); return;
        case 2: {
            const uint8_t* p = static_cast<const uint8_t*>(base) + n * K + k;
            uint8_t b[8];
            if (aligned(p, 8)) {
                const uint2 u = *reinterpret_cast<const uint2*>(p);
                memcpy(b, &u, 8);
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) b[j] = p[j];
            }
            const int wb = w.weight_block;
            const float s = e8m0_to_f32(scale[(n / wb) * ((K + wb - 1) / wb) + k / wb]);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = e4m3_to_f32(b[j]) * s;
            return;
        }
        default: {
            const uint8_t* p = static_cast<const uint8_t*>(base) + n * (K / 2) + k / 2;
            uint8_t b[4];
            if (aligned(p, 4)) {
                const uint32_t u = *reinterpret_cast<const uint32_t*>(p);
                memcpy(b, &u, 4);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) b[j] = p[j];
            }
            const float s = e8m0_to_f32(scale[n * (K / 32) + k / 32]);
#pragma unroll
            for (int j = 0; j < 4; ++j) {  // low nibble: the even k
                v[2 * j] = e2m1_value(b[j] & 0xfu) * s;
                v[2 * j + 1] = e2m1_value(b[j] >> 4) * s;
            }
        }
    }
}

template <typename T>
__global__ void gather_activations_kernel(const float* x, const float* xs, int ab, int64_t rows, int K,
                                          const int32_t* row_map, int64_t row0, T* a) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int per = K / 8;
    if (i >= rows * per) return;
    const int64_t r = i / per;
    const int k = static_cast<int>(i % per) * 8;
    const int64_t src = row_map ? row_map[row0 + r] : row0 + r;
    float v[8];
    load8_f32(x + src * K + k, v);
    if (xs) {
        const float s = xs[src * (K / ab) + k / ab];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] *= s;
    }
    store8(a + i * 8, v);
}

template <typename T>
__global__ void dequantise_kernel(LinearDev w, const void* base, const uint8_t* scale, const void* const* tw,
                                  const uint8_t* const* ts, const int32_t* slot_expert, int64_t n0, int64_t rows,
                                  T* out) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int per = w.in / 8;
    if (i >= rows * per) return;
    if (slot_expert) {
        const int e = slot_expert[blockIdx.y];
        base = tw[e];
        scale = ts[e];
    }
    float v[8];
    weight8(w, base, scale, n0 + i / per, static_cast<int>(i % per) * 8, v);
    store8(out + static_cast<int64_t>(blockIdx.y) * rows * w.in + i * 8, v);
}

__global__ void scatter_rows_kernel(const float* ys, int64_t rows, int N, const int32_t* row_map, int64_t row0,
                                    bool round, float* y) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= rows * N) return;
    const int64_t r = i / N, c = i % N;
    const float v = ys[i];
    y[static_cast<int64_t>(row_map[row0 + r]) * N + c] = round ? round_bf16(v) : v;
}

__global__ void scatter_rows_bf16_kernel(const uint16_t* ys, int64_t rows, int N, const int32_t* row_map,
                                         int64_t row0, float* y) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= rows * N) return;
    const int64_t r = i / N, c = i % N;
    y[static_cast<int64_t>(row_map[row0 + r]) * N + c] = bf16_bits_to_f32(ys[i]);
}

// 8 columns a thread where rows, strides and pointers allow 16-byte accesses (vec), else one.
template <bool vec>
__global__ void widen_bf16_kernel(const uint16_t* ys, int64_t rows, int64_t cols, int64_t ldys, float* y,
                                  int64_t ldy) {
    constexpr int kPer = vec ? 8 : 1;
    const int64_t per_row = cols / kPer, i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= rows * per_row) return;
    const int64_t r = i / per_row, c = (i % per_row) * kPer;
    if constexpr (vec) {
        const uint4 u = *reinterpret_cast<const uint4*>(ys + r * ldys + c);
        const uint16_t* h = reinterpret_cast<const uint16_t*>(&u);
        float4* out = reinterpret_cast<float4*>(y + r * ldy + c);
        out[0] = make_float4(bf16_bits_to_f32(h[0]), bf16_bits_to_f32(h[1]), bf16_bits_to_f32(h[2]),
                             bf16_bits_to_f32(h[3]));
        out[1] = make_float4(bf16_bits_to_f32(h[4]), bf16_bits_to_f32(h[5]), bf16_bits_to_f32(h[6]),
                             bf16_bits_to_f32(h[7]));
    } else {
        y[r * ldy + c] = bf16_bits_to_f32(ys[r * ldys + c]);
    }
}

}  // namespace

void gather_activations(const float* x, const float* xs, int ab, int64_t rows, int K, const int32_t* row_map,
                        int64_t row0, bool to_bf16, void* a) {
    const int64_t n = rows * (K / 8);
    if (n == 0) return;
    if (to_bf16)
        gather_activations_kernel<<<blocks_for(n), kThreads>>>(x, xs, ab, rows, K, row_map, row0,
                                                               static_cast<__nv_bfloat16*>(a));
    else
        gather_activations_kernel<<<blocks_for(n), kThreads>>>(x, xs, ab, rows, K, row_map, row0,
                                                               static_cast<float*>(a));
    PG_LAUNCHED();
}

void dequantise_weights(const LinearDev& w, const void* base, const uint8_t* scale, const void* const* tw,
                        const uint8_t* const* ts, const int32_t* slot_expert, int slots, int64_t n0, int64_t rows,
                        bool to_bf16, void* out) {
    const int64_t n = rows * (w.in / 8);
    if (n == 0 || slots == 0) return;
    if (slots > 65535) cuda_fail(cudaErrorInvalidValue, "dequantise_weights: too many slots", __FILE__, __LINE__);
    const dim3 grid(blocks_for(n), static_cast<unsigned>(slot_expert ? slots : 1));
    if (to_bf16)
        dequantise_kernel<<<grid, kThreads>>>(w, base, scale, tw, ts, slot_expert, n0, rows,
                                              static_cast<__nv_bfloat16*>(out));
    else
        dequantise_kernel<<<grid, kThreads>>>(w, base, scale, tw, ts, slot_expert, n0, rows, static_cast<float*>(out));
    PG_LAUNCHED();
}

void scatter_rows(const float* ys, int64_t rows, int N, const int32_t* row_map, int64_t row0, bool round, float* y) {
    const int64_t n = rows * N;
    if (n == 0) return;
    scatter_rows_kernel<<<blocks_for(n), kThreads>>>(ys, rows, N, row_map, row0, round, y);
    PG_LAUNCHED();
}

void widen_bf16(const uint16_t* ys, int64_t rows, int64_t cols, int64_t ldys, float* y, int64_t ldy) {
    if (rows * cols == 0) return;
    const bool vec = cols % 8 == 0 && ldys % 8 == 0 && ldy % 4 == 0 && (reinterpret_cast<uintptr_t>(ys) & 15) == 0 &&
                     (reinterpret_cast<uintptr_t>(y) & 15) == 0;
    const int64_t n = rows * (vec ? cols / 8 : cols);
    if (vec) widen_bf16_kernel<true><<<blocks_for(n), kThreads>>>(ys, rows, cols, ldys, y, ldy);
    else widen_bf16_kernel<false><<<blocks_for(n), kThreads>>>(ys, rows, cols, ldys, y, ldy);
    PG_LAUNCHED();
}

void scatter_rows_bf16(const uint16_t* ys, int64_t rows, int N, const int32_t* row_map, int64_t row0, float* y) {
    const int64_t n = rows * N;
    if (n == 0) return;
    scatter_rows_bf16_kernel<<<blocks_for(n), kThreads>>>(ys, rows, N, row_map, row0, y);
    PG_LAUNCHED();
}

}  // namespace peregrine::cuda::cublas_prep
