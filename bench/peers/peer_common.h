#pragma once
// What the peer harnesses share (one translation unit each): error checks, TMA descriptors built by hand (the peers'
// host code that builds them is not shipped or needs torch), random operands, and the timing loop with the L2
// flushed before each run.
#include <cuda.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace peers {

#define CHECK_CUDA(x)                                                                                  \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                              \
        }                                                                                              \
    } while (0)

constexpr uint32_t kSms = 132;  // H200: the persistent grids (checked at run time by check_device)

inline void check_device(cudaDeviceProp& prop) {
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    if (prop.multiProcessorCount != static_cast<int>(kSms) || prop.major != 9) {
        std::fprintf(stderr, "built for sm_90a with %u SMs; this device is sm_%d%d with %d\n", kSms, prop.major,
                     prop.minor, prop.multiProcessorCount);
        std::exit(1);
    }
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiled encode_tiled() {
    static EncodeTiled fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
        CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
        if (!p || q != cudaDriverEntryPointSuccess) {
            std::fprintf(stderr, "no cuTensorMapEncodeTiled in the driver\n");
            std::exit(1);
        }
        return reinterpret_cast<EncodeTiled>(p);
    }();
    return fn;
}

// A tensor of `rank` (2 or 3) dimensions, innermost first, of `elem`-byte values; strides[i] is the byte stride of
// dimension i + 1; loaded or stored in boxes `box`.
inline CUtensorMap tensor_map(void* base, CUtensorMapDataType type, uint32_t rank, const cuuint64_t* dims,
                              const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swizzle) {
    CUtensorMap m{};
    const cuuint32_t step[3] = {1, 1, 1};
    const CUresult r = encode_tiled()(&m, type, rank, base, dims, strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                      swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        std::fprintf(stderr, "cuTensorMapEncodeTiled failed (%d)\n", static_cast<int>(r));
        std::exit(1);
    }
    return m;
}

// A 2-D row-major tensor [outer, inner] of `elem` bytes, loaded or stored in boxes [box_outer, box_inner].
inline CUtensorMap tensor_map(void* base, CUtensorMapDataType type, size_t elem, uint64_t inner, uint64_t outer,
                              uint32_t box_inner, uint32_t box_outer, CUtensorMapSwizzle swizzle) {
    const cuuint64_t dims[2] = {inner, outer};
    const cuuint64_t strides[1] = {inner * elem};
    const cuuint32_t box[2] = {box_inner, box_outer};
    return tensor_map(base, type, 2, dims, strides, box, swizzle);
}

__host__ __device__ inline uint32_t mix(uint32_t h) {
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    return h;
}

// Device arrays, and copies to and from them.
template <typename T>
T* device(size_t n) {
    T* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, sizeof(T) * n));
    return p;
}
template <typename T>
T* upload(const std::vector<T>& v) {
    T* p = device<T>(v.size());
    CHECK_CUDA(cudaMemcpy(p, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice));
    return p;
}
template <typename T>
std::vector<T> download(const T* p, size_t n) {
    std::vector<T> v(n);
    CHECK_CUDA(cudaMemcpy(v.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost));
    return v;
}

// e4m3 values spread over most of its range.
__global__ void fill_fp8(__nv_fp8_e4m3* p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const uint32_t h = mix(static_cast<uint32_t>(i) * 2654435761u ^ seed);
        p[i] = __nv_fp8_e4m3((static_cast<float>(h & 0xffff) / 32768.0f - 1.0f) * 224.0f);
    }
}

// Powers of two in [2^-12, 2^-5], as ue8m0 scales are.
__global__ void fill_scales(float* p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const uint32_t h = mix(static_cast<uint32_t>(i) * 2246822519u ^ seed);
        p[i] = exp2f(static_cast<float>(h % 8) - 12.0f);
    }
}

// Uniform in [-scale, scale).
__global__ void fill_uniform(float* p, size_t n, uint32_t seed, float scale) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const uint32_t h = mix(static_cast<uint32_t>(i) * 2654435761u ^ seed);
        p[i] = (static_cast<float>(h & 0xffff) / 32768.0f - 1.0f) * scale;
    }
}

// Median milliseconds of `reps` runs of f, each after a write of `flush_bytes` (L2 flushed).
template <typename F>
double median_ms(F&& f, int reps, void* flush, size_t flush_bytes) {
    f();  // warm-up (and the first launch's set-up)
    std::vector<float> t;
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    for (int r = 0; r < reps; ++r) {
        CHECK_CUDA(cudaMemsetAsync(flush, r & 0xff, flush_bytes));
        CHECK_CUDA(cudaEventRecord(a));
        f();
        CHECK_CUDA(cudaEventRecord(b));
        CHECK_CUDA(cudaEventSynchronize(b));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaEventDestroy(a));
    CHECK_CUDA(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// The harness's JSON: {"device", "peer", "results": [rows]}, rows already joined; false if the file cannot be written.
inline bool write_json(const std::string& path, const char* device, const char* peer, const std::string& rows) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return false;
    std::fprintf(f, "{\"device\": \"%s\", \"peer\": \"%s\", \"results\": [\n  %s\n]}\n", device, peer, rows.c_str());
    return std::fclose(f) == 0;
}

}  // namespace peers
