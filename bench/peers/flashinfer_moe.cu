// FlashInfer's Hopper MXFP4 MoE GEMMs (flashinfer-python 0.7.2, from PyPI; nothing of it is in this repository) beside
// our routed FP4 experts, at V4.1-Flash's routed-expert shapes, the L2 flushed before each run. On sm90 FlashInfer's
// MXFP4 MoE (SGLang's FP4-expert path on Hopper) runs TensorRT-LLM's mixed-input grouped GEMM: CUTLASS, TMA
// warp-specialized, a tile schedule precomputed on the device each call, the weights as the MMA's M and the tokens as
// its N. Both of its precisions, each GEMM called through FlashInfer's own launcher with the operands prepared as its
// Python layer prepares them:
// - W4A16 (SGLang's default): bf16 activations x MXFP4 weights, which is V4.1's own expert format (e2m1 codes, a
//   ue8m0 scale per 32 of K); the codes through FlashInfer's interleave kernel, the scales in its folded layout
//   (bytes [E, N / 64, K / 128, 16, 16]), applied after each k-block's MMAs; bf16 out.
// - W4A8 (`--flashinfer-mxfp4-moe-precision fp8`): e4m3 activations with a scale per row x the same weights in the
//   pre-MMA form: each 32-block's scale as its exponent offset from the expert's smallest (the scales here span 8
//   binades, inside the 12 the form keeps, so no code is rewritten), the codes interleaved with their signs moved
//   for e4m3, and the row's scale times the expert's residual 2^(min - 127) / 2 times 2^6 applied after the MMAs.
//   Activations per row in e4m3 are coarser than V4.1's per-32 blocks: its nearest format.
// Shapes as deepinfer_grouped.cu: w1 5120 -> 2304 and w2 2304 -> 5120; prefill 384 experts, 64 and 256 rows an
// expert (top-6 of 4,096 and 16,384 tokens); decode 96 experts (one GPU's EP4 slice), 8 to 128 rows. Each of the
// compiled configurations (flashinfer_moe_launchers.h) is checked against an fp32 reference of the same quantised
// operands on sampled rows and timed through its launcher (host set-up, the tile-schedule kernel, the GEMM) and as a
// CUDA graph of that call (what SGLang's decode graphs replay: the GEMM and the schedule kernel); the graph's time is
// the peer's figure, the fastest right configuration is reported, beside ours (ours_routed.h).
//
//   flashinfer_moe [--reps 10] [--json FILE]
#include "flashinfer_moe.h"

#include "ours_routed.h"

#include "cutlass/util/packed_stride.hpp"
#include "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/moe_gemm_tma_ws_mixed_input_prebuild.h"
#include "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.h"

#include <cstring>
#include <exception>
#include <string>

namespace {

using namespace peers;
using fi::Hopper;
using fi::Out;
namespace ck = fi::ck;

constexpr int kPrefillExperts = 384, kDecodeExperts = 96, kGroup = 32;

// One shape: E experts' weights N x K, `per` rows an expert (expert e owns rows [e * per, (e + 1) * per)).
struct Shape {
    const char* name;
    int N, K, E, per;
    int64_t rows() const { return int64_t(E) * per; }
};

// e2m1 code -> value.
__device__ float e2m1(uint32_t c) {
    constexpr float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return c & 8 ? -mag[c & 7] : mag[c & 7];
}

// ref[i, n] = row_scale[row] * sum_k a[row, k] w[e, n, k] 2^(s[e, n, k / 32] - 127) for the sampled rows (rows[i],
// their expert experts[i]); the codes two a byte, element 2j in the low nibble, or in the high one (high_first).
template <typename T>
__global__ void reference(const T* a, const float* row_scale, const uint8_t* w, const uint8_t* s, const int32_t* rows,
                          const int32_t* experts, int N, int K, bool high_first, float* ref) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (n >= N) return;
    const size_t row = size_t(rows[i]), wr = size_t(experts[i]) * N + n;
    const uint8_t *wn = w + wr * (K / 2), *sn = s + wr * (K / kGroup);
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
        const uint32_t byte = wn[k / 2], code = ((k & 1) != high_first) ? byte >> 4 : byte & 15;
        acc += static_cast<float>(a[row * K + k]) * e2m1(code) * exp2f(float(sn[k / kGroup]) - 127.0f);
    }
    ref[size_t(i) * N + n] = acc * (row_scale ? row_scale[row] : 1.0f);
}

__global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x)
        p[i] = __float2bfloat16((static_cast<float>(mix(static_cast<uint32_t>(i) * 2654435761u ^ seed) & 0xffff) /
                                 32768.0f - 1.0f) * 2.0f);
}
// Activations: bf16 uniform in [-2, 2), or e4m3 over most of its range (peer_common.h).
void fill_acts(__nv_bfloat16* p, size_t n) { fill_bf16<<<4096, 256>>>(p, n, 13); }
void fill_acts(__nv_fp8_e4m3* p, size_t n) { fill_fp8<<<4096, 256>>>(p, n, 13); }

// The weights and their scales, shared by every configuration of a shape: logical (the reference's) and as
// FlashInfer's kernels read them, per precision.
struct Weights {
    uint8_t *codes = nullptr, *scales = nullptr;          // [E, N, K / 2], [E, N, K / 32]
    uint8_t *codes16 = nullptr, *scales16 = nullptr;      // W4A16: interleaved, folded
    uint8_t *codes8 = nullptr, *offsets8 = nullptr;       // W4A8: interleaved with e4m3 signs, folded offsets
    std::vector<float> residual;                          // W4A8: 2^(min - 127) / 2 an expert
};

// scale(n, g) of an expert's [N, K / 32] at FlashInfer's folded index [N / 64, K / 128, 16, 16]: row n % 16 of
// each 64-row block's four 16-row slices side by side, four groups of a K128 block each.
size_t folded(int n, int g, int K) {
    return ((size_t(n / 64) * (K / 128) + g / 4) * 16 + n % 16) * 16 + (n % 64) / 16 * 4 + g % 4;
}

// The codes with -0 (8) as +0, as FlashInfer's W4A8 preparation rewrites them before its interleave (the pre-MMA
// conversion adds the exponent offset to a code's exponent bits; +0 is the code it keeps zero).
__global__ void without_negative_zeros(const uint8_t* in, size_t n, uint8_t* out) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const uint32_t lo = in[i] & 15, hi = in[i] >> 4;
        out[i] = uint8_t((lo == 8 ? 0 : lo) | (hi == 8 ? 0 : hi) << 4);
    }
}

Weights make_weights(const Shape& s) {
    Weights w;
    const size_t cb = size_t(s.N) * s.K / 2, sb = size_t(s.N) * (s.K / kGroup);
    w.codes = device<uint8_t>(cb * s.E);
    fill_bytes<<<4096, 256>>>(w.codes, cb * s.E, 11, 0, 256);
    std::vector<uint8_t> sc(sb * s.E), fold16(sc.size()), fold8(sc.size());
    for (size_t i = 0; i < sc.size(); ++i) sc[i] = uint8_t(120 + mix(uint32_t(i) * 2246822519u ^ 12) % 8);
    for (int e = 0; e < s.E; ++e) {
        const uint8_t* se = sc.data() + sb * e;
        const uint8_t lo = *std::min_element(se, se + sb);
        w.residual.push_back(std::exp2(float(lo) - 127.0f) * 0.5f);
        for (int n = 0; n < s.N; ++n)
            for (int g = 0; g < s.K / kGroup; ++g) {
                const uint8_t v = se[size_t(n) * (s.K / kGroup) + g];
                fold16[sb * e + folded(n, g, s.K)] = v;
                fold8[sb * e + folded(n, g, s.K)] = uint8_t((v - lo + 1) & 15);
            }
    }
    w.scales = upload(sc), w.scales16 = upload(fold16), w.offsets8 = upload(fold8);
    w.codes16 = device<uint8_t>(cb * s.E), w.codes8 = device<uint8_t>(cb * s.E);
    uint8_t* plus_zeros = device<uint8_t>(cb);
    for (int e = 0; e < s.E; ++e) {
        ck::interleave_fp4_weights_for_sm90_mixed_gemm(w.codes + cb * e, w.codes16 + cb * e, s.N, s.K);
        without_negative_zeros<<<1024, 256>>>(w.codes + cb * e, cb, plus_zeros);
        ck::interleave_fp4_fp8_weights_for_sm90_mixed_gemm(plus_zeros, w.codes8 + cb * e, s.N, s.K);
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaFree(plus_zeros));
    return w;
}

void free_weights(Weights& w) {
    for (uint8_t* p : {w.codes, w.scales, w.codes16, w.scales16, w.codes8, w.offsets8}) CHECK_CUDA(cudaFree(p));
}

// W4A8's scales on the device: each row's (any fp32 value: the dynamic per-row quantisation's), and the epilogue's
// alpha, the row's times its expert's residual times 2^6 (FlashInfer's compensation of the pre-MMA form).
void row_scales(const Shape& s, const Weights& w, float*& row_scale, float*& alpha) {
    std::vector<float> rs(size_t(s.rows())), al(rs.size());
    for (size_t r = 0; r < rs.size(); ++r) {
        rs[r] = std::exp2(float(mix(uint32_t(r) ^ 14) % 8) - 10.0f) * 1.375f;
        al[r] = rs[r] * w.residual[r / size_t(s.per)] * 64.0f;
    }
    row_scale = upload(rs), alpha = upload(al);
}

struct Result {
    std::string precision, what, config;
    Shape shape;
    double ms = 0, eager_ms = 0, err = 0;  // ms: as a graph where the capture worked, else eager_ms
    Ours ours;
};

// Device arrays of one value each expert.
template <typename V>
V* per_expert(int E, const V& v) {
    return upload(std::vector<V>(size_t(E), v));
}

// Every configuration of precision T at shape s: checked, timed; the fastest right one.
template <typename T>
Result run_peer(const char* precision, const Shape& s, const Weights& w, int reps, void* flush, size_t flush_bytes) {
    constexpr bool fp8 = std::is_same_v<T, __nv_fp8_e4m3>;
    const int64_t rows = s.rows();
    const size_t a_elems = size_t(rows) * s.K;
    T* a = device<T>(a_elems);
    float *row_scale = nullptr, *alpha = nullptr;
    if (fp8) row_scales(s, w, row_scale, alpha);
    fill_acts(a, a_elems);
    Out* d = device<Out>(size_t(rows) * s.N);

    // The grouped GEMM's tables, one entry an expert (what TensorRT-LLM's setup kernel writes), strides packed by
    // CUTLASS's own helper.
    const size_t cb = size_t(s.N) * s.K / 2, sb = size_t(s.N) * (s.K / kGroup);
    std::vector<const void*> pa, pw, ps;
    std::vector<void*> pd;
    std::vector<const float*> palpha;
    for (int e = 0; e < s.E; ++e) {
        pa.push_back(a + size_t(e) * s.per * s.K);
        pw.push_back((fp8 ? w.codes8 : w.codes16) + cb * e);
        ps.push_back((fp8 ? w.offsets8 : w.scales16) + sb * e);
        pd.push_back(d + size_t(e) * s.per * s.N);
        palpha.push_back(alpha ? alpha + size_t(e) * s.per : nullptr);
    }
    using Groupwise = Hopper::INT4GroupwiseParams;
    Hopper h{};
    h.swap_ab = true;
    h.ptr_act = upload(pa), h.ptr_weight = upload(pw), h.ptr_d = upload(pd);
    using cutlass::make_cute_packed_stride, cute::make_shape;
    h.stride_act = per_expert(s.E, make_cute_packed_stride(Hopper::StrideB{}, make_shape(s.per, s.K, 1)));
    h.stride_weight = per_expert(s.E, make_cute_packed_stride(Hopper::StrideA{}, make_shape(s.N, s.K, 1)));
    h.stride_d = per_expert(s.E, make_cute_packed_stride(Hopper::StrideD_T{}, make_shape(s.N, s.per, 1)));
    h.int4_groupwise_params.enabled = true;
    h.int4_groupwise_params.use_wfp4a16 = true;  // its name for MXFP4 weight scales, W4A8's too
    h.int4_groupwise_params.ptr_s_a = reinterpret_cast<const Groupwise::SFA**>(upload(ps));
    h.int4_groupwise_params.stride_s_a = per_expert(
        s.E, make_cute_packed_stride(Groupwise::StrideSFA{}, make_shape(s.N, s.K / kGroup, 1)));
    h.int4_groupwise_params.shape.num_groups = s.E;
    h.int4_groupwise_params.shape.problem_shapes =
        per_expert(s.E, Groupwise::ProblemShapeInt::UnderlyingProblemShape(s.N, s.per, s.K));
    h.precomputed_scheduler_total_routed_tokens = rows;
    h.precomputed_scheduler_workspace_size =
        tensorrt_llm::kernels::cutlass_kernels_oss::detail::precomputed_scheduler_workspace_size(s.E, rows, s.N);
    h.precomputed_scheduler_workspace = device<uint8_t>(h.precomputed_scheduler_workspace_size);
    const float** alpha_d = fp8 ? upload(palpha) : nullptr;
    fi::Inputs<T> in{.alpha_scales = alpha_d, .num_rows = rows, .n = s.N, .k = s.K, .num_experts = s.E,
                     .groupwise_quant_group_size = kGroup, .stream = nullptr, .gemm_config = {}};

    // The sampled rows: the first and last of every 12th expert; references with either nibble order.
    std::vector<int32_t> srows, sexp;
    for (int e = 0; e < s.E; e += 12)
        for (int r : {0, s.per - 1}) srows.push_back(e * s.per + r), sexp.push_back(e);
    const int S = static_cast<int>(srows.size());
    int32_t *srows_d = upload(srows), *sexp_d = upload(sexp);
    float* ref = device<float>(size_t(2) * S * s.N);
    for (int hi = 0; hi < 2; ++hi)
        reference<<<dim3((s.N + 127) / 128, S), 128>>>(a, row_scale, w.codes, w.scales, srows_d, sexp_d, s.N, s.K,
                                                       hi == 1, ref + size_t(hi) * S * s.N);
    CHECK_CUDA(cudaGetLastError());
    const std::vector<float> want = download(ref, size_t(2) * S * s.N);

    // Worst |d| / max|ref| over the sampled rows under the likelier nibble order (which one: order), and the
    // least-squares ratio got / ref (a wrong constant scale shows there).
    struct Check {
        double err;
        int order;
        double ratio;
    };
    auto check = [&]() -> Check {
        double worst[2] = {0, 0}, largest[2] = {0, 0}, dot = 0, norm = 0;
        std::vector<Out> got(size_t(s.N));
        for (int i = 0; i < S; ++i) {
            CHECK_CUDA(cudaMemcpy(got.data(), d + size_t(srows[i]) * s.N, sizeof(Out) * s.N, cudaMemcpyDeviceToHost));
            for (int n = 0; n < s.N; ++n)
                for (int hi = 0; hi < 2; ++hi) {
                    const double g = __bfloat162float(got[n]), r = want[(size_t(hi) * S + i) * s.N + n];
                    worst[hi] = std::max(worst[hi], std::fabs(g - r));
                    largest[hi] = std::max(largest[hi], std::fabs(r));
                    if (hi == 0) dot += g * r, norm += r * r;
                }
        }
        const int order = worst[1] / largest[1] < worst[0] / largest[0] ? 1 : 0;
        return {worst[order] / largest[order], order, norm > 0 ? dot / norm : 0.0};
    };

    cudaStream_t stream;  // blocking: ordered with median_ms's flush and events on the legacy stream
    CHECK_CUDA(cudaStreamCreate(&stream));
    in.stream = stream;
    Result best{precision, s.name, "", s, 0, 0, 0, {}};
    for (const fi::Config<T>& c : fi::configs<T>()) {
        size_t ws = 0;
        c.run(in, h, int(kSms), &ws);
        h.gemm_workspace_size = ws;
        h.gemm_workspace = ws ? device<uint8_t>(ws) : nullptr;
        auto eager = [&] { c.run(in, h, int(kSms), nullptr); };
        try {
            CHECK_CUDA(cudaMemset(d, 0, sizeof(Out) * size_t(rows) * s.N));
            eager();
            CHECK_CUDA(cudaDeviceSynchronize());
            const Check ce = check();
            const double eager_ms = median_ms(eager, reps, flush, flush_bytes);
            // As a CUDA graph too (SGLang replays its decode steps as graphs, where the launcher's host work is not
            // paid), checked again after a replay; its time is the peer's figure where the capture works.
            cudaGraphExec_t exec = nullptr;
            cudaGraph_t graph = nullptr;
            if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
                bool ok = true;
                try {
                    eager();
                } catch (const std::exception&) {
                    ok = false;
                }
                ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && ok && graph;
                if (ok && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) exec = nullptr;
                if (graph) CHECK_CUDA(cudaGraphDestroy(graph));
            }
            (void)cudaGetLastError();  // a capture that failed leaves its error here
            double ms = eager_ms, graph_ms = 0;
            Check cg = ce;
            if (exec) {
                auto replay = [&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); };
                CHECK_CUDA(cudaMemset(d, 0, sizeof(Out) * size_t(rows) * s.N));
                replay();
                CHECK_CUDA(cudaDeviceSynchronize());
                cg = check();
                ms = graph_ms = median_ms(replay, reps, flush, flush_bytes);
                CHECK_CUDA(cudaGraphExecDestroy(exec));
            }
            const double err = std::max(ce.err, cg.err);
            std::printf("  %s %-14s %3d rows/expert, %-24s eager %8.3f ms, graph %8.3f ms, max|d| / max|ref| %.2e "
                        "(%s nibble first, got/ref %.4f)%s\n",
                        precision, s.name, s.per, c.name, eager_ms, graph_ms, err, ce.order ? "high" : "low", ce.ratio,
                        err > 1e-2 ? "  WRONG" : "");
            if (err <= 1e-2 && (best.ms == 0 || ms < best.ms))
                best.ms = ms, best.eager_ms = eager_ms, best.err = err, best.config = c.name;
        } catch (const std::exception& ex) {
            std::printf("  %s %-14s %3d rows/expert, %-24s failed: %s\n", precision, s.name, s.per, c.name, ex.what());
            CHECK_CUDA(cudaDeviceSynchronize());
        }
        if (h.gemm_workspace) CHECK_CUDA(cudaFree(h.gemm_workspace));
    }
    CHECK_CUDA(cudaStreamDestroy(stream));
    for (void* p : {static_cast<void*>(a), static_cast<void*>(row_scale), static_cast<void*>(alpha),
                    static_cast<void*>(d), static_cast<void*>(h.ptr_act), static_cast<void*>(h.ptr_weight),
                    static_cast<void*>(h.ptr_d), h.stride_act, h.stride_weight, h.stride_d,
                    static_cast<void*>(h.int4_groupwise_params.ptr_s_a),
                    static_cast<void*>(h.int4_groupwise_params.stride_s_a),
                    static_cast<void*>(h.int4_groupwise_params.shape.problem_shapes),
                    static_cast<void*>(h.precomputed_scheduler_workspace), static_cast<void*>(alpha_d),
                    static_cast<void*>(srows_d), static_cast<void*>(sexp_d), static_cast<void*>(ref)})
        CHECK_CUDA(cudaFree(p));
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
    const size_t flush_bytes = size_t(512) << 20;
    void* flush = nullptr;
    CHECK_CUDA(cudaMalloc(&flush, flush_bytes));
    std::printf("%s, median of %d (L2 flushed before each)\n", prop.name, reps);

    std::vector<Shape> shapes;
    for (int per : {64, 256})
        shapes.push_back({"w1 5120->2304", 2304, 5120, kPrefillExperts, per}),
            shapes.push_back({"w2 2304->5120", 5120, 2304, kPrefillExperts, per});
    for (int per : {8, 32, 128})
        shapes.push_back({"w1 5120->2304", 2304, 5120, kDecodeExperts, per}),
            shapes.push_back({"w2 2304->5120", 5120, 2304, kDecodeExperts, per});
    std::vector<Result> results;
    for (const Shape& s : shapes) {
        Weights w = make_weights(s);
        const Ours ours = ours_routed(s.name, s.E, s.N, s.K, s.per, reps, flush, flush_bytes);
        results.push_back(run_peer<__nv_bfloat16>("W4A16", s, w, reps, flush, flush_bytes));
        results.back().ours = ours;
        results.push_back(run_peer<__nv_fp8_e4m3>("W4A8", s, w, reps, flush, flush_bytes));
        results.back().ours = ours;
        free_weights(w);
    }

    std::printf("\n%-9s %-14s %7s %7s %9s %9s %8s %9s %10s  %-24s %9s %9s %10s\n", "precision", "gemm", "experts",
                "rows/e", "peer ms", "TFLOP/s", "of peak", "GB/s", "peer err", "config", "ours ms", "ours GB/s",
                "peer/ours");
    std::string rows;
    bool failed = false;
    for (const Result& r : results) {
        const Shape& s = r.shape;
        const double weight_bytes = double(s.E) * s.N * (s.K / 2 + s.K / kGroup);  // the same for both sides
        const double ours_gbs = weight_bytes / (r.ours.ms * 1e6);
        failed |= !(r.ours.err <= 1e-2);
        if (r.ms == 0) {
            std::printf("%-9s %-14s %7d %7d no configuration of the peer gave right results\n", r.precision.c_str(),
                        r.what.c_str(), s.E, s.per);
            failed = true;
            continue;
        }
        const double tflops = 2.0 * s.rows() * s.N * s.K / (r.ms * 1e9);
        std::printf("%-9s %-14s %7d %7d %9.3f %9.1f %7.1f%% %9.0f %10.2e  %-24s %9.3f %9.0f %9.2fx%s\n",
                    r.precision.c_str(), r.what.c_str(), s.E, s.per, r.ms, tflops, 100.0 * tflops / 1979.0,
                    weight_bytes / (r.ms * 1e6), r.err, r.config.c_str(), r.ours.ms, ours_gbs, r.ms / r.ours.ms,
                    r.ours.err <= 1e-2 ? "" : "  ours WRONG");
        char line[768];
        std::snprintf(line, sizeof(line),
                      "%s{\"precision\": \"%s\", \"gemm\": \"%s\", \"experts\": %d, \"rows_per_expert\": %d, "
                      "\"n\": %d, \"k\": %d, \"config\": \"%s\", \"peer_ms\": %.4f, \"peer_eager_ms\": %.4f, "
                      "\"peer_tflops\": %.1f, \"peer_weight_gbs\": %.1f, \"peer_max_err_of_max\": %.3e, "
                      "\"ours_ms\": %.4f, \"ours_weight_gbs\": %.1f, \"ours_max_err_of_max\": %.3e, "
                      "\"peer_over_ours\": %.3f}",
                      rows.empty() ? "" : ",\n  ", r.precision.c_str(), r.what.c_str(), s.E, s.per, s.N, s.K,
                      r.config.c_str(), r.ms, r.eager_ms, tflops, weight_bytes / (r.ms * 1e6), r.err, r.ours.ms,
                      ours_gbs, r.ours.err, r.ms / r.ours.ms);
        rows += line;
    }
    const char* peer = "flashinfer-python 0.7.2 sm90 mixed-input MoE GEMM (MXFP4 weights; W4A16, W4A8)";
    if (!json.empty() && !write_json(json, prop.name, peer, rows)) return 1;
    return failed ? 1 : 0;
}
