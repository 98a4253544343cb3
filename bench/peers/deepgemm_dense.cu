// SGLang's DeepGEMM fork (sgl-deep-gemm, from PyPI; nothing of it is in this repository) timed beside cuBLAS's bf16
// GEMM, which is the core of our shipped prefill linears (linear_cublas: bf16 tensor cores on exact bf16 images of
// the quantised operands), at V4.1-Flash's dense shapes, in one process with the same L2 flushing.
//
// The peer kernel is its native Hopper block-32 dense FP8 GEMM, sm90_fp8_gemm_1d2d_impl with SF_GRAN = 32: FP8 e4m3
// operands, one fp32 scale per activation row and 32 columns of K (MN-major, read by TMA), one per 32 x 32 weight
// block (K-major), wgmma m64nNk32 with promotion into fp32 at every 32-wide block, bf16 output. The wheel ships the
// kernel's headers but not the host code that configures and launches them (its _C.so needs another torch), so this
// file builds the TMA descriptors and tries tile configurations itself (kConfigs: BLOCK_M 64 or 128, a math warpgroup
// per 64 rows; BLOCK_N 64 or 128; BLOCK_K 128; 128-byte swizzles; as many stages as shared memory holds; TMA
// multicast over clusters of two or none; one persistent CTA per SM), reporting the fastest.
// Each shape is checked against an fp32 reference of the same quantised operands on sampled rows before it is timed.
//
//   deepgemm_dense [--m 16384] [--reps 10] [--json FILE]
#include <deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh>

#include "peer_common.h"

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace peers;

constexpr uint32_t kBlockK = 128, kGran = 32;
constexpr uint32_t kTmaThreads = 128;  // one producer warpgroup; a consumer warpgroup per 64 rows of the tile

// A tile configuration: BLOCK_M x BLOCK_N output tiles, the kernel's stages, TMA multicast across a cluster of
// `multicast` CTAs (of A's tiles or of B's).
struct Config {
    uint32_t bm, bn, stages, multicast;
    bool on_a;
    void* fn;
};

// Shared memory the kernel lays out (its own arithmetic, sm90_fp8_gemm_1d2d.cuh): the output tile, the stages of A,
// B and A's scales, B's scales for the whole K, the barriers.
constexpr uint32_t align_up(uint32_t x, uint32_t a) { return (x + a - 1) / a * a; }
uint32_t smem_bytes(const Config& c, uint32_t K) {
    const uint32_t d = align_up(c.bm * c.bn * 2, 1024);
    const uint32_t per_stage = c.bm * kBlockK + c.bn * kBlockK + align_up(c.bm * (kBlockK / kGran) * 4, 128);
    const uint32_t sfb = align_up((K + kGran - 1) / kGran * (c.bn / kGran) * 4, 8);
    return d + c.stages * per_stage + sfb + 2 * c.stages * 8;
}

template <uint32_t BM, uint32_t BN, uint32_t kStages, uint32_t kMulticast = 1, bool kOnA = false>
Config config() {
    return {BM, BN, kStages, kMulticast, kOnA,
            reinterpret_cast<void*>(
                &deep_gemm::sm90_fp8_gemm_1d2d_impl<cute::UMMA::Major::K, 0, 0, 0, 1, BM, BN, kBlockK, 128, 128, 128,
                                                    kStages, kTmaThreads, BM / 64 * 128, kMulticast, kOnA, kSms,
                                                    deep_gemm::GemmType::Normal, cutlass::bfloat16_t, kGran>)};
}
// The tiles tried at each shape (the fastest is reported), each with the most stages that fit at K up to 8192.
// Wider tiles spill the block-32 accumulators (64 x 192: 11.7 KB a thread).
const Config kConfigs[] = {config<128, 128, 5>(),          config<128, 64, 6>(),
                           config<64, 64, 8>(),            config<64, 128, 6>(),
                           config<64, 128, 6, 2, true>(),  config<64, 128, 6, 2, false>()};

__global__ void bf16_image(const __nv_fp8_e4m3* q, const float* s, size_t rows, uint32_t cols, bool row_scales,
                           uint32_t scale_rows, __nv_bfloat16* out) {
    // row_scales: s[(c / 32) * scale_rows + r] (activations, MN-major); else s[(r / 32) * (cols / 32) + c / 32]
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < rows * cols;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const size_t r = i / cols;
        const uint32_t c = static_cast<uint32_t>(i % cols);
        const float scale = row_scales ? s[(c / kGran) * scale_rows + r] : s[(r / kGran) * (cols / kGran) + c / kGran];
        out[i] = __float2bfloat16(static_cast<float>(q[i]) * scale);
    }
}

// The fp32 product of the dequantised operands for rows m0, m0 + stride, ...: ref[i, n].
__global__ void reference(const __nv_fp8_e4m3* a, const float* sfa, const __nv_fp8_e4m3* b, const float* sfb,
                          uint32_t M, uint32_t N, uint32_t K, uint32_t stride, float* ref) {
    const uint32_t n = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (n >= N) return;
    const size_t m = static_cast<size_t>(i) * stride;
    float acc = 0.0f;
    for (uint32_t k = 0; k < K; ++k)
        acc += static_cast<float>(a[m * K + k]) * sfa[(k / kGran) * M + m] * static_cast<float>(b[size_t(n) * K + k]) *
               sfb[(n / kGran) * (K / kGran) + k / kGran];
    ref[size_t(i) * N + n] = acc;
}

struct Shape {
    const char* name;
    uint32_t K, N;
};
// V4.1-Flash's dense FP8 linears (test_cuda_gemm's kDense).
const Shape kShapes[] = {{"wq_a 5120->1280", 5120, 1280},       {"wq_b 1280->32768", 1280, 32768},
                         {"wkv 5120->512", 5120, 512},          {"wo_b 8192->5120", 8192, 5120},
                         {"shared.w1 5120->2304", 5120, 2304},  {"shared.w2 2304->5120", 2304, 5120}};

}  // namespace

int main(int argc, char** argv) {
    uint32_t M = 16384;
    int reps = 10;
    std::string json;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--m")) M = static_cast<uint32_t>(std::atoi(argv[i + 1]));
        else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--json")) json = argv[i + 1];
    }
    cudaDeviceProp prop{};
    check_device(prop);
    const size_t flush_bytes = size_t(512) << 20;
    void* flush = nullptr;
    CHECK_CUDA(cudaMalloc(&flush, flush_bytes));
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return 1;

    std::printf("%s, M=%u, median of %d (L2 flushed before each)\n", prop.name, M, reps);
    std::string rows, table;
    bool failed = false;
    for (const Shape& sh : kShapes) {
        const uint32_t N = sh.N, K = sh.K, ks = K / kGran;
        __nv_fp8_e4m3 *a, *b;
        float *sfa, *sfb, *ref;
        __nv_bfloat16 *d, *a16, *b16, *c16;
        CHECK_CUDA(cudaMalloc(&a, size_t(M) * K));
        CHECK_CUDA(cudaMalloc(&b, size_t(N) * K));
        CHECK_CUDA(cudaMalloc(&sfa, sizeof(float) * ks * M));
        CHECK_CUDA(cudaMalloc(&sfb, sizeof(float) * (N / kGran) * ks));
        CHECK_CUDA(cudaMalloc(&d, sizeof(__nv_bfloat16) * size_t(M) * N));
        CHECK_CUDA(cudaMalloc(&a16, sizeof(__nv_bfloat16) * size_t(M) * K));
        CHECK_CUDA(cudaMalloc(&b16, sizeof(__nv_bfloat16) * size_t(N) * K));
        CHECK_CUDA(cudaMalloc(&c16, sizeof(__nv_bfloat16) * size_t(M) * N));
        fill_fp8<<<1024, 256>>>(a, size_t(M) * K, 1);
        fill_fp8<<<1024, 256>>>(b, size_t(N) * K, 2);
        fill_scales<<<256, 256>>>(sfa, size_t(ks) * M, 3);
        fill_scales<<<256, 256>>>(sfb, size_t(N / kGran) * ks, 4);
        bf16_image<<<1024, 256>>>(a, sfa, M, K, true, M, a16);
        bf16_image<<<1024, 256>>>(b, sfb, N, K, false, 0, b16);

        // cuBLAS, column-major: C^T [N, M] = B16 [N, K] x A16^T, i.e. C [M, N] row-major = A16 x B16^T.
        const float one = 1.0f, zero = 0.0f;
        auto blas_gemm = [&] {
            if (cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                             static_cast<int>(K), &one, b16, CUDA_R_16BF, static_cast<int>(K), a16, CUDA_R_16BF,
                             static_cast<int>(K), &zero, c16, CUDA_R_16BF, static_cast<int>(N), CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
                std::fprintf(stderr, "cublasGemmEx failed\n");
                std::exit(1);
            }
        };
        const uint32_t samples = 64, stride = M / samples;
        CHECK_CUDA(cudaMalloc(&ref, sizeof(float) * samples * N));
        reference<<<dim3((N + 127) / 128, samples), 128>>>(a, sfa, b, sfb, M, N, K, stride, ref);
        std::vector<float> r(size_t(samples) * N);
        CHECK_CUDA(cudaMemcpy(r.data(), ref, sizeof(float) * r.size(), cudaMemcpyDeviceToHost));

        // Every tile configuration: checked on the sampled rows (|peer - ref| against their largest |ref|), timed.
        double peer_ms = 0, err = 0;
        const Config* best = nullptr;
        for (const Config& c : kConfigs) {
            const uint32_t smem = smem_bytes(c, K);
            if (smem > static_cast<uint32_t>(prop.sharedMemPerBlockOptin)) continue;
            const CUtensorMap ta = tensor_map(a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, K, M, kBlockK, c.bm,
                                              CU_TENSOR_MAP_SWIZZLE_128B);
            const CUtensorMap tb = tensor_map(b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, K, N, kBlockK, c.bn,
                                              CU_TENSOR_MAP_SWIZZLE_128B);
            const CUtensorMap td = tensor_map(d, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, N, M, 64, c.bm,
                                              CU_TENSOR_MAP_SWIZZLE_128B);
            const CUtensorMap tsfa = tensor_map(sfa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, M, ks, c.bm, kBlockK / kGran,
                                                CU_TENSOR_MAP_SWIZZLE_NONE);
            CHECK_CUDA(cudaFuncSetAttribute(c.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
            int* grouped = nullptr;
            uint32_t m = M, n = N, k = K;
            void* args[] = {&sfb, &grouped, &m, &n, &k, const_cast<CUtensorMap*>(&ta), const_cast<CUtensorMap*>(&tb),
                            const_cast<CUtensorMap*>(&td), const_cast<CUtensorMap*>(&tsfa)};
            cudaLaunchAttribute cluster{};
            cluster.id = cudaLaunchAttributeClusterDimension;
            cluster.val.clusterDim = {c.multicast, 1, 1};
            cudaLaunchConfig_t launch{};
            launch.gridDim = dim3(kSms);
            launch.blockDim = dim3(kTmaThreads + c.bm / 64 * 128);
            launch.dynamicSmemBytes = smem;
            launch.attrs = &cluster;
            launch.numAttrs = 1;
            auto peer = [&] { CHECK_CUDA(cudaLaunchKernelExC(&launch, c.fn, args)); };
            CHECK_CUDA(cudaMemset(d, 0, sizeof(__nv_bfloat16) * size_t(M) * N));
            peer();
            CHECK_CUDA(cudaDeviceSynchronize());
            std::vector<__nv_bfloat16> got(static_cast<size_t>(N));
            double worst = 0, largest = 0;
            for (uint32_t i = 0; i < samples; ++i) {
                CHECK_CUDA(cudaMemcpy(got.data(), d + size_t(i) * stride * N, sizeof(__nv_bfloat16) * N,
                                      cudaMemcpyDeviceToHost));
                for (uint32_t j = 0; j < N; ++j) {
                    worst = std::max(worst, std::fabs(double(__bfloat162float(got[j])) - r[size_t(i) * N + j]));
                    largest = std::max(largest, std::fabs(double(r[size_t(i) * N + j])));
                }
            }
            const double ms = median_ms(peer, reps, flush, flush_bytes);
            std::printf("  %-20s tile %3u x %3u, %u stages, multicast %u%s: %8.3f ms, max|d| / max|ref| %.2e%s\n",
                        sh.name, c.bm, c.bn, c.stages, c.multicast, c.multicast > 1 ? (c.on_a ? " (A)" : " (B)") : "",
                        ms, worst / largest, worst / largest > 1e-2 ? "  WRONG" : "");
            if (worst / largest <= 1e-2 && (!best || ms < peer_ms)) best = &c, peer_ms = ms, err = worst / largest;
        }
        const double flop = 2.0 * M * N * K;
        const double blas_ms = median_ms(blas_gemm, reps, flush, flush_bytes);
        char line[512];
        if (!best) {
            std::snprintf(line, sizeof(line), "%-22s no tile configuration of the peer gave right results\n", sh.name);
            table += line;
            failed = true;
        } else {
            std::snprintf(line, sizeof(line), "%-22s %9.3f %9.1f %9.3f %9.1f %10.2fx %11.2e  %ux%u/%u/x%u\n",
                          sh.name, peer_ms, flop / peer_ms / 1e9, blas_ms, flop / blas_ms / 1e9, blas_ms / peer_ms, err,
                          best->bm, best->bn, best->stages, best->multicast);
            table += line;
        }
        std::snprintf(line, sizeof(line),
                      "%s{\"linear\": \"%s\", \"m\": %u, \"n\": %u, \"k\": %u, \"tile\": \"%ux%u, %u stages\", "
                      "\"peer_ms\": %.4f, "
                      "\"peer_tflops\": %.1f, \"cublas_bf16_ms\": %.4f, \"cublas_bf16_tflops\": %.1f, "
                      "\"peer_max_err_of_max\": %.3e}",
                      rows.empty() ? "" : ",\n  ", sh.name, M, N, K, best ? best->bm : 0, best ? best->bn : 0,
                      best ? best->stages : 0, peer_ms, best ? flop / peer_ms / 1e9 : 0.0, blas_ms,
                      flop / blas_ms / 1e9, err);
        rows += line;
        for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(sfa),
                        static_cast<void*>(sfb), static_cast<void*>(d), static_cast<void*>(a16),
                        static_cast<void*>(b16), static_cast<void*>(c16), static_cast<void*>(ref)})
            CHECK_CUDA(cudaFree(p));
    }
    std::printf("\n%-22s %9s %9s %9s %9s %11s %11s  %s\n%s", "linear", "peer ms", "TFLOP/s", "cuBLAS ms",
                "TFLOP/s", "cuBLAS/peer", "peer err", "tile/stages/multicast", table.c_str());
    const char* peer = "sgl-deep-gemm 0.2.5 sm90_fp8_gemm_1d2d SF_GRAN 32";
    if (!json.empty() && !write_json(json, prop.name, peer, rows)) return 1;
    cublasDestroy(blas);
    return failed ? 1 : 0;
}
