// DeepInfer's DeepGEMM grouped FP8 GEMMs (deepinfer-gemm, from PyPI; nothing of it is in this repository) at
// V4.1-Flash's routed-expert shapes, the L2 flushed before each run:
// - prefill, the contiguous layout: 384 experts, top-6 of T tokens routed evenly (T / 64 rows an expert), each
//   expert's rows padded to the tile's BLOCK_M as the layout needs;
// - decode, the masked layout: 96 experts (one GPU's slice of EP4), 8 to 128 rows an expert;
// - and the dense linears in the Normal layout at M = 16384 (deepgemm_dense.cu's shapes), beside the fork's block-32.
// The kernel is sm90_fp8_gemm_1d2d_impl, the lineage of the block-32 kernel in deepgemm_dense.cu, with its native
// 128-wide scales: FP8 e4m3 operands, an fp32 scale per activation row and 128 columns of K, one per 128 x 128 weight
// block, bf16 out. V4.1's routed experts are FP4 (e2m1, a ue8m0 scale per 32): this is the nearest format the
// peer's Hopper kernels take, with twice the weight bytes. Tile configurations are tried per shape (the fastest
// right one is reported), each checked against an fp32 reference of the same quantised operands on sampled rows.
// Ours at the same prefill shapes: test_cuda_gemm's "PARITY gemm experts" lines in the same run (tools/gpu/peers.sh).
// Ours at the decode shapes, here (linked from the build): the routed FP4 kernel the engine runs for that many pairs
// an expert (the GEMV up to 8, the grouped wgmma kernel above), over V4.1's format, the L2 flushed the same way.
//
//   deepinfer_grouped [--reps 10] [--json FILE]
#include <deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh>

#include "ours_routed.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstring>
#include <string>

namespace {

using namespace peers;

constexpr uint32_t kBlockK = 128, kGran = 128, kTmaThreads = 128;
constexpr uint32_t kPrefillExperts = 384, kDecodeExperts = 96;

struct Config {
    uint32_t bm, bn, stages;
    void* fn;
};

constexpr uint32_t align_up(uint32_t x, uint32_t a) { return (x + a - 1) / a * a; }
// Shared memory the kernel lays out (its own arithmetic): the output tile, the stages of A, B and A's scales, B's
// scales for the whole K (two rows of them where BLOCK_N does not divide 128), the barriers.
uint32_t smem_bytes(uint32_t bm, uint32_t bn, uint32_t stages, uint32_t K) {
    const uint32_t d = align_up(bm * bn * 2, 1024);
    const uint32_t per_stage = bm * kBlockK + bn * kBlockK + align_up(bm * 4, 128);
    const uint32_t sfb = align_up((K + kGran - 1) / kGran * (kBlockK % bn == 0 ? 1 : 2) * 4, 8);
    return d + stages * per_stage + sfb + 2 * stages * 8;
}

template <deep_gemm::GemmType kType, uint32_t kGroups, uint32_t BM, uint32_t BN>
Config config(uint32_t K, uint32_t smem_limit) {
    uint32_t stages = 1;
    while (stages < 8 && smem_bytes(BM, BN, stages + 1, K) <= smem_limit) ++stages;
    auto pick = [&](auto s) {
        return reinterpret_cast<void*>(
            &deep_gemm::sm90_fp8_gemm_1d2d_impl<cute::UMMA::Major::K, 0, 0, 0, kGroups, BM, BN, kBlockK, 128, 128,
                                                128, decltype(s)::value, kTmaThreads, BM / 64 * 128, 1, false, kSms,
                                                kType, cutlass::bfloat16_t>);
    };
    void* fn = nullptr;
    switch (stages) {  // the kernel takes its stages as a template argument
        case 3: fn = pick(std::integral_constant<uint32_t, 3>{}); break;
        case 4: fn = pick(std::integral_constant<uint32_t, 4>{}); break;
        case 5: fn = pick(std::integral_constant<uint32_t, 5>{}); break;
        case 6: fn = pick(std::integral_constant<uint32_t, 6>{}); break;
        case 7: fn = pick(std::integral_constant<uint32_t, 7>{}); break;
        case 8: fn = pick(std::integral_constant<uint32_t, 8>{}); break;
        default: break;
    }
    return {BM, BN, stages, fn};
}

template <deep_gemm::GemmType kType, uint32_t kGroups>
std::vector<Config> configs(uint32_t K, uint32_t smem_limit) {
    // Wider tiles spill (128 x 256: 5 KB a thread).
    std::vector<Config> c = {config<kType, kGroups, 128, 128>(K, smem_limit),
                             config<kType, kGroups, 64, 128>(K, smem_limit)};
    std::erase_if(c, [](const Config& x) { return x.fn == nullptr; });
    return c;
}

// ref[i, n] = sum_k a[row, k] sfa[k / 128, row] b[e, n, k] sfb[e, n / 128, k / 128] for the sampled rows
// (rows[i], their expert experts[i]); sfa rows `sfa_rows` apart (the group's block for the masked layout).
__global__ void reference(const __nv_fp8_e4m3* a, const float* sfa, const __nv_fp8_e4m3* b, const float* sfb,
                          const int32_t* rows, const int32_t* experts, const int64_t* sfa_base, uint32_t sfa_rows,
                          uint32_t N, uint32_t K, float* ref) {
    const uint32_t n = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (n >= N) return;
    const size_t m = static_cast<size_t>(rows[i]), e = static_cast<size_t>(experts[i]);
    const uint32_t ks = K / kGran, ns = (N + kGran - 1) / kGran;
    float acc = 0.0f;
    for (uint32_t k = 0; k < K; ++k)
        acc += static_cast<float>(a[m * K + k]) * sfa[sfa_base[i] + size_t(k / kGran) * sfa_rows] *
               static_cast<float>(b[(e * N + n) * K + k]) * sfb[(e * ns + n / kGran) * ks + k / kGran];
    ref[size_t(i) * N + n] = acc;
}


struct Result {
    std::string what;
    uint32_t N, K, experts, rows_per_expert;
    double useful_flop, ms, err;
    Config best;
    double ours_ms = 0, ours_err = 0;  // ours at the same shape, where timed here (decode)
};

// Ours at a result's shape (ours_routed.h), into the result.
void timed_ours(Result& r, int reps, void* flush, size_t flush_bytes) {
    const Ours o = ours_routed(r.what.c_str() + 7, int(r.experts), int(r.N), int(r.K), int(r.rows_per_expert), reps,
                               flush, flush_bytes);
    r.ours_ms = o.ms, r.ours_err = o.err;
}

// One grouped GEMM: `E` experts' weights [E, N, K], the activations' rows laid out per `kType` (contiguous: expert e
// owns rows_per_expert rows padded to the tile's BLOCK_M; masked: [E, max_m, K] with rows_per_expert valid; Normal:
// E = 1, its layout unread).
template <deep_gemm::GemmType kType, uint32_t E>
Result grouped(const char* name, uint32_t N, uint32_t K, uint32_t rows_per_expert, int reps, void* flush,
               size_t flush_bytes, uint32_t smem_limit) {
    constexpr bool kMasked = kType == deep_gemm::GemmType::MGroupedMasked;
    const uint32_t ks = K / kGran, ns = (N + kGran - 1) / kGran;
    __nv_fp8_e4m3* b = device<__nv_fp8_e4m3>(size_t(E) * N * K);
    float* sfb = device<float>(size_t(E) * ns * ks);
    fill_fp8<<<4096, 256>>>(b, size_t(E) * N * K, 2);
    fill_scales<<<256, 256>>>(sfb, size_t(E) * ns * ks, 4);
    Result best{name, N, K, E, rows_per_expert, 2.0 * E * rows_per_expert * N * K, 0, 0, {}};
    for (const Config& c : configs<kType, E>(K, smem_limit)) {
        // Rows: contiguous, each expert's padded to BLOCK_M; masked, max_m = rows_per_expert rounded to BLOCK_M.
        const uint32_t per = align_up(rows_per_expert, c.bm), M = kMasked ? per : E * per;
        const size_t rows = kMasked ? size_t(E) * per : M;
        const uint32_t m_sf = align_up(M, 4);  // the scales' TMA rows
        __nv_fp8_e4m3* a = device<__nv_fp8_e4m3>(rows * K);
        float* sfa = device<float>(size_t(kMasked ? E : 1) * ks * m_sf);
        __nv_bfloat16* d = device<__nv_bfloat16>(rows * N);
        fill_fp8<<<4096, 256>>>(a, rows * K, 1);
        fill_scales<<<256, 256>>>(sfa, size_t(kMasked ? E : 1) * ks * m_sf, 3);
        std::vector<int32_t> layout;
        if (kMasked) {
            layout.assign(E, static_cast<int32_t>(rows_per_expert));
        } else {
            for (uint32_t e = 0; e < E; ++e)
                for (uint32_t r = 0; r < per; ++r) layout.push_back(r < rows_per_expert ? int32_t(e) : -1);
        }
        int32_t* layout_d = upload(layout);

        const CUtensorMap ta = tensor_map(a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, K, rows, kBlockK, c.bm,
                                          CU_TENSOR_MAP_SWIZZLE_128B);
        const CUtensorMap tb = tensor_map(b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, K, uint64_t(E) * N, kBlockK, c.bn,
                                          CU_TENSOR_MAP_SWIZZLE_128B);
        const CUtensorMap td = tensor_map(d, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, N, rows, 64, c.bm,
                                          CU_TENSOR_MAP_SWIZZLE_128B);
        const CUtensorMap tsfa = tensor_map(sfa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, m_sf,
                                            uint64_t(ks) * (kMasked ? E : 1), c.bm, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
        CHECK_CUDA(cudaFuncSetAttribute(c.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_limit)));
        uint32_t m = M, n = N, k = K;
        void* args[] = {&sfb, &layout_d, &m, &n, &k, const_cast<CUtensorMap*>(&ta), const_cast<CUtensorMap*>(&tb),
                        const_cast<CUtensorMap*>(&td), const_cast<CUtensorMap*>(&tsfa)};
        cudaLaunchConfig_t launch{};
        launch.gridDim = dim3(kSms);
        launch.blockDim = dim3(kTmaThreads + c.bm / 64 * 128);
        launch.dynamicSmemBytes = smem_limit;
        auto peer = [&] { CHECK_CUDA(cudaLaunchKernelExC(&launch, c.fn, args)); };
        CHECK_CUDA(cudaMemset(d, 0, sizeof(__nv_bfloat16) * rows * N));
        peer();
        CHECK_CUDA(cudaDeviceSynchronize());

        // Sampled rows: a valid row of every 12th expert (its first and last).
        std::vector<int32_t> srows, sexp;
        std::vector<int64_t> sbase;
        for (uint32_t e = 0; e < E; e += 12)
            for (uint32_t r : {0u, rows_per_expert - 1}) {
                const uint32_t row = e * per + r;  // masked: the group's block of max_m rows, the same offsets
                srows.push_back(int32_t(row));
                sexp.push_back(int32_t(e));
                sbase.push_back(kMasked ? int64_t(e) * ks * m_sf + r : int64_t(row));
            }
        int32_t *srows_d = upload(srows), *sexp_d = upload(sexp);
        int64_t* sbase_d = upload(sbase);
        const uint32_t S = static_cast<uint32_t>(srows.size());
        float* ref = device<float>(size_t(S) * N);
        reference<<<dim3((N + 127) / 128, S), 128>>>(a, sfa, b, sfb, srows_d, sexp_d, sbase_d, m_sf, N, K, ref);
        CHECK_CUDA(cudaGetLastError());
        std::vector<float> r(size_t(S) * N);
        CHECK_CUDA(cudaMemcpy(r.data(), ref, sizeof(float) * r.size(), cudaMemcpyDeviceToHost));
        std::vector<__nv_bfloat16> got(N);
        double worst = 0, largest = 0;
        for (uint32_t i = 0; i < S; ++i) {
            CHECK_CUDA(cudaMemcpy(got.data(), d + size_t(srows[i]) * N, sizeof(__nv_bfloat16) * N,
                                  cudaMemcpyDeviceToHost));
            for (uint32_t j = 0; j < N; ++j) {
                worst = std::max(worst, std::fabs(double(__bfloat162float(got[j])) - r[size_t(i) * N + j]));
                largest = std::max(largest, std::fabs(double(r[size_t(i) * N + j])));
            }
        }
        const double err = worst / largest, ms = median_ms(peer, reps, flush, flush_bytes);
        std::printf("  %-24s %3u rows/expert, tile %3u x %3u, %u stages: %8.3f ms, max|d| / max|ref| %.2e%s\n", name,
                    rows_per_expert, c.bm, c.bn, c.stages, ms, err, err > 1e-2 ? "  WRONG" : "");
        if (err <= 1e-2 && (best.ms == 0 || ms < best.ms)) best.ms = ms, best.err = err, best.best = c;
        for (void* p : {static_cast<void*>(a), static_cast<void*>(sfa), static_cast<void*>(d),
                        static_cast<void*>(layout_d), static_cast<void*>(srows_d), static_cast<void*>(sexp_d),
                        static_cast<void*>(sbase_d), static_cast<void*>(ref)})
            CHECK_CUDA(cudaFree(p));
    }
    CHECK_CUDA(cudaFree(b));
    CHECK_CUDA(cudaFree(sfb));
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 10;
    std::string json;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--json")) json = argv[i + 1];
    }
    cudaDeviceProp prop{};
    check_device(prop);
    const uint32_t smem_limit = static_cast<uint32_t>(prop.sharedMemPerBlockOptin);
    const size_t flush_bytes = size_t(512) << 20;
    void* flush = nullptr;
    CHECK_CUDA(cudaMalloc(&flush, flush_bytes));
    std::printf("%s, median of %d (L2 flushed before each)\n", prop.name, reps);

    using deep_gemm::GemmType;
    std::vector<Result> results;
    // Prefill: T = 4096 and 16384 tokens, top-6 of 384 experts evenly: 64 and 256 rows an expert.
    for (uint32_t per : {64u, 256u}) {
        results.push_back(grouped<GemmType::MGroupedContiguous, kPrefillExperts>("contiguous w1 5120->2304", 2304,
                                                                                5120, per, reps, flush, flush_bytes,
                                                                                smem_limit));
        results.push_back(grouped<GemmType::MGroupedContiguous, kPrefillExperts>("contiguous w2 2304->5120", 5120,
                                                                                2304, per, reps, flush, flush_bytes,
                                                                                smem_limit));
    }
    for (uint32_t per : {8u, 32u, 128u}) {
        results.push_back(grouped<GemmType::MGroupedMasked, kDecodeExperts>("masked w1 5120->2304", 2304, 5120, per,
                                                                           reps, flush, flush_bytes, smem_limit));
        timed_ours(results.back(), reps, flush, flush_bytes);
        results.push_back(grouped<GemmType::MGroupedMasked, kDecodeExperts>("masked w2 2304->5120", 5120, 2304, per,
                                                                           reps, flush, flush_bytes, smem_limit));
        timed_ours(results.back(), reps, flush, flush_bytes);
    }

    // Dense, the Normal layout at M = 16384 (one "expert"): V4.1-Flash's dense FP8 linears (deepgemm_dense.cu's).
    struct Dense {
        const char* name;
        uint32_t K, N;
    };
    for (const Dense& d : {Dense{"dense wq_a 5120->1280", 5120, 1280}, Dense{"dense wq_b 1280->32768", 1280, 32768},
                           Dense{"dense wkv 5120->512", 5120, 512}, Dense{"dense wo_b 8192->5120", 8192, 5120},
                           Dense{"dense shared.w1 5120->2304", 5120, 2304},
                           Dense{"dense shared.w2 2304->5120", 2304, 5120}})
        results.push_back(grouped<GemmType::Normal, 1>(d.name, d.N, d.K, 16384, reps, flush, flush_bytes, smem_limit));

    std::printf("\n%-26s %7s %9s %9s %9s %9s %10s  %-12s %9s %9s %10s %10s\n", "gemm", "rows/e", "peer ms", "TFLOP/s",
                "of peak", "weights", "peer err", "tile/stages", "ours ms", "ours GB/s", "ours err", "peer/ours");
    std::string rows;
    bool failed = false;
    for (const Result& r : results) {
        const double weight_gbs = double(r.experts) * r.N * r.K / (r.ms * 1e6);
        if (r.ms == 0) {
            std::printf("%-26s %7u no tile configuration of the peer gave right results\n", r.what.c_str(),
                        r.rows_per_expert);
            failed = true;
            continue;
        }
        const double tflops = r.useful_flop / (r.ms * 1e9);
        char tile[32], ours[96] = "", ours_json[160] = "";
        std::snprintf(tile, sizeof(tile), "%ux%u/%u", r.best.bm, r.best.bn, r.best.stages);
        if (r.ours_ms > 0) {  // FP4: half a byte a weight and a scale byte per 32
            failed |= !(r.ours_err <= 1e-2);
            const double ours_gbs = double(r.experts) * r.N * (r.K / 2 + r.K / 32) / (r.ours_ms * 1e6);
            std::snprintf(ours, sizeof(ours), " %9.3f %9.0f %10.2e %9.2fx%s", r.ours_ms, ours_gbs, r.ours_err,
                          r.ms / r.ours_ms, r.ours_err <= 1e-2 ? "" : "  WRONG");
            std::snprintf(ours_json, sizeof(ours_json),
                          ", \"ours_ms\": %.4f, \"ours_weight_gbs\": %.1f, \"ours_max_err_of_max\": %.3e, "
                          "\"peer_over_ours\": %.3f",
                          r.ours_ms, ours_gbs, r.ours_err, r.ms / r.ours_ms);
        }
        std::printf("%-26s %7u %9.3f %9.1f %8.1f%% %6.0f GB/s %10.2e  %-12s%s\n", r.what.c_str(), r.rows_per_expert,
                    r.ms, tflops, 100.0 * tflops / 1979.0, weight_gbs, r.err, tile, ours);
        char line[768];
        std::snprintf(line, sizeof(line),
                      "%s{\"gemm\": \"%s\", \"experts\": %u, \"rows_per_expert\": %u, \"n\": %u, \"k\": %u, "
                      "\"tile\": \"%ux%u, %u stages\", \"peer_ms\": %.4f, \"peer_tflops\": %.1f, "
                      "\"weight_gbs\": %.1f, \"peer_max_err_of_max\": %.3e%s}",
                      rows.empty() ? "" : ",\n  ", r.what.c_str(), r.experts, r.rows_per_expert, r.N, r.K, r.best.bm,
                      r.best.bn, r.best.stages, r.ms, tflops, weight_gbs, r.err, ours_json);
        rows += line;
    }
    const char* peer = "deepinfer-gemm 2.8.2 sm90_fp8_gemm_1d2d, 128-wide scales";
    if (!json.empty() && !write_json(json, prop.name, peer, rows)) return 1;
    return failed ? 1 : 0;
}
