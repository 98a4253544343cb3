// Prefill GEMMs on the tensor cores through cuBLAS. BF16/FP8/FP4 linears: the quantised operands (e4m3 x
// ue8m0 activations, e4m3 x ue8m0 or e2m1 x ue8m0 weights, bf16 weights) are exactly representable in bf16,
// so dequantising them to bf16 with the scale folded in and running a bf16 GEMM with fp32 accumulation forms
// the exact kernels' products, only summed in fp32 in another order; the output is rounded to bf16 as the
// reference does. F32 linears run an fp32 GEMM (COMPUTE_32F, no TF32). Weights are dequantised per call into
// a bounded scratch that grows and is reused; the model keeps only its stored formats.
#include "ops/cuda/device_scratch.h"
#include "util/switches.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/linear_cublas.h"
#include "util/error.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace peregrine::cuda {

namespace {

constexpr size_t kWeightScratch = size_t(1) << 30;  // dequantised weights of one chunk (N rows or experts)
constexpr size_t kRowScratch = size_t(1) << 30;     // routed: gathered activations + fp32 outputs of one chunk
constexpr size_t kOutScratch = size_t(64) << 20;    // dense: the bf16 outputs of one chunk of rows
constexpr size_t kWorkspace = size_t(32) << 20;     // cuBLAS workspace (Hopper recommendation)

void check(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLAS {} failed: {}", what, cublasGetStatusString(s));
}

// One handle (the calling thread's default stream, workspace set once) and the scratch buffers.
struct Context {
    cublasHandle_t handle = nullptr;
    void* workspace = nullptr;
    DeviceScratch weights, acts, outs, table;
    bool grouped = true;  // routed GEMMs through cublasGemmGroupedBatchedEx (else one GEMM per expert)
    std::string grouped_error;  // why the grouped call was turned off ("" while it works)

    cublasHandle_t get() {
        if (!handle) {
            check(cublasCreate(&handle), "create");
            check(cublasSetStream(handle, cudaStreamPerThread), "set stream");  // the calling thread's stream
            PG_CUDA(cudaMalloc(&workspace, kWorkspace));
            check(cublasSetWorkspace(handle, workspace, kWorkspace), "set workspace");
            check(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "set math mode");  // no TF32
            grouped = switch_is("PEREGRINE_CUBLAS_GROUPED", "1");
        }
        return handle;
    }
    ~Context() {  // the thread ends (before the runtime does, also for the main thread); the scratch goes after
        if (weights.p || acts.p || outs.p || table.p) cudaDeviceSynchronize();
        if (handle) cublasDestroy(handle);
        if (workspace) cudaFree(workspace);
    }
};

// One per device (a cuBLAS handle belongs to the device it was created on) and thread: threads run on streams of
// their own (ranks sharing a GPU), so they must not share the workspace or the scratch buffers.
Context& context() {
    int dev = 0;
    PG_CUDA(cudaGetDevice(&dev));
    thread_local std::map<int, Context> per_device;
    return per_device[dev];
}

cudaDataType_t elem_type(bool f32) { return f32 ? CUDA_R_32F : CUDA_R_16BF; }

// C (column-major N x rows, ld ldc: fp32, or with bf16_out the fp32 sums rounded to bf16) = W^T X, i.e. row-major
// y[rows, n_out] = x[rows, K] W[n_out, K]^T.
void gemm(cublasHandle_t h, bool f32, int64_t n_out, int64_t rows, int K, const void* W, const void* X, void* C,
          int64_t ldc, bool bf16_out = false) {
    const float one = 1.0f, zero = 0.0f;
    check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n_out), static_cast<int>(rows), K, &one, W,
                       elem_type(f32), K, X, elem_type(f32), K, &zero, C, bf16_out ? CUDA_R_16BF : CUDA_R_32F,
                       static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "gemm");
}

void dense(Context& c, const float* x, const float* xs, int64_t M, const LinearDev& w, float* y) {
    const int N = w.out, K = w.in;
    const bool f32 = w.kind == 0;
    const size_t elt = f32 ? 4 : 2;
    cublasHandle_t h = c.get();
    if (f32 && w.w_bf16 && w.bf16_acts) {  // fp32 arithmetic on the bf16 tensor cores: exact products
        char* ab = c.acts.reserve(static_cast<size_t>(M) * K * 2);
        cublas_prep::gather_activations(x, nullptr, 1, M, K, nullptr, 0, true, ab);
        gemm(h, false, N, M, K, w.w, ab, y, N);
        return;
    }
    const void* a = x;
    if (!f32) {
        char* ab = c.acts.reserve(static_cast<size_t>(M) * K * elt);
        if (w.kind >= 2 && !xs) act_quant_bf16(x, M, K, w.act_block, reinterpret_cast<uint16_t*>(ab));
        else cublas_prep::gather_activations(x, w.kind >= 2 ? xs : nullptr, w.act_block, M, K, nullptr, 0, true, ab);
        a = ab;
    }
    // Output columns [n0, n0 + nc) from weight rows W. F32 linears write fp32; the others round to bf16 as the
    // reference does, which cuBLAS does as it stores (into a bounded scratch, a chunk of rows at a time, widened
    // into y): a third of the output traffic of fp32 sums rounded in place.
    auto columns = [&](const void* W, int64_t n0, int64_t nc) {
        if (f32) return gemm(h, true, nc, M, K, W, a, y + n0, N);
        const int64_t rows = std::clamp<int64_t>(static_cast<int64_t>(kOutScratch / (static_cast<size_t>(nc) * 2)), 1,
                                                 M);
        auto* ob = reinterpret_cast<uint16_t*>(c.outs.reserve(static_cast<size_t>(rows) * nc * 2));
        for (int64_t r0 = 0; r0 < M; r0 += rows) {
            const int64_t rc = std::min(rows, M - r0);
            gemm(h, false, nc, rc, K, W, static_cast<const char*>(a) + r0 * K * elt, ob, nc, true);
            cublas_prep::widen_bf16(ob, rc, nc, nc, y + r0 * N + n0, N);
        }
    };
    const bool stored = w.kind == 1 || (w.kind == 0 && !w.w_bf16);  // usable as the GEMM operand directly
    if (stored) {
        columns(w.w, 0, N);
    } else {
        int64_t chunk = static_cast<int64_t>(kWeightScratch / (static_cast<size_t>(K) * elt));
        if (chunk >= 64) chunk -= chunk % 64;  // keeps y + n0 16-byte aligned for cuBLAS's fastest kernels
        chunk = std::clamp<int64_t>(chunk, 1, N);
        char* wb = c.weights.reserve(static_cast<size_t>(chunk) * K * elt);
        for (int64_t n0 = 0; n0 < N; n0 += chunk) {
            const int64_t nc = std::min<int64_t>(chunk, N - n0);
            cublas_prep::dequantise_weights(w, w.w, w.scale, nullptr, nullptr, nullptr, 1, n0, nc, !f32, wb);
            columns(wb, n0, nc);
        }
    }
}

// Rows of one expert in the sorted order, and the chunks (consecutive experts and their contiguous rows)
// whose weights and rows fit the scratch.
struct Segment {
    int expert;
    int64_t row0, rows;
};
struct Chunk {
    size_t s0, s1;
    int64_t r0, r1;
};

void routed(Context& c, const float* x, const float* xs, int64_t M, const LinearDev& w, float* y,
            const ExpertTable& ex, const LinearRouting& r) {
    const int N = w.out, K = w.in;
    const bool f32 = w.kind == 0;
    const size_t elt = f32 ? 4 : 2;
    cublasHandle_t h = c.get();

    // The tile table on the host (the one synchronisation of this path), merged into one segment per expert.
    int32_t nt = 0;
    std::vector<int32_t> tiles(4 * static_cast<size_t>(r.max_tiles));
    PG_CUDA(cudaMemcpyAsync(&nt, r.n_tiles, sizeof(nt), cudaMemcpyDeviceToHost, 0));
    if (!tiles.empty())
        PG_CUDA(cudaMemcpyAsync(tiles.data(), r.tiles, tiles.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, 0));
    PG_CUDA(cudaStreamSynchronize(0));
    PEREGRINE_CHECK(nt >= 0 && static_cast<unsigned>(nt) <= r.max_tiles, "linear_cublas: {} tiles of at most {}", nt,
                    r.max_tiles);
    std::vector<Segment> segs;
    for (int i = 0; i < nt; ++i) {
        const int e = tiles[4 * i], r0 = tiles[4 * i + 1], n = tiles[4 * i + 2];
        PEREGRINE_CHECK(e >= 0 && r0 >= 0 && n >= 0 && r0 + static_cast<int64_t>(n) <= M,
                        "linear_cublas: bad tile ({}, {}, {}) for {} rows", e, r0, n, M);
        if (n == 0) continue;
        if (!segs.empty() && segs.back().expert == e && segs.back().row0 + segs.back().rows == r0)
            segs.back().rows += n;
        else segs.push_back({e, r0, n});
    }
    if (segs.empty()) return;

    const size_t wbytes = static_cast<size_t>(N) * K * elt, rowbytes = static_cast<size_t>(K) * elt + sizeof(float) * N;
    std::vector<Chunk> chunks;
    for (size_t i = 0; i < segs.size(); ++i) {
        const Segment& s = segs[i];
        if (!chunks.empty()) {
            Chunk& ch = chunks.back();
            const size_t slots = i - ch.s0 + 1;
            if (ch.r1 == s.row0 && slots <= 65535 && slots * wbytes <= kWeightScratch &&
                static_cast<size_t>(ch.r1 + s.rows - ch.r0) * rowbytes <= kRowScratch) {
                ch.s1 = i + 1;
                ch.r1 += s.rows;
                continue;
            }
        }
        chunks.push_back({i, i + 1, s.row0, s.row0 + s.rows});
    }
    size_t max_slots = 0;
    int64_t max_rows = 0;
    for (const Chunk& ch : chunks) {
        max_slots = std::max(max_slots, ch.s1 - ch.s0);
        max_rows = std::max(max_rows, ch.r1 - ch.r0);
    }
    char* wb = c.weights.reserve(max_slots * wbytes);
    char* ab = c.acts.reserve(static_cast<size_t>(max_rows) * K * elt);
    float* ob = reinterpret_cast<float*>(c.outs.reserve(static_cast<size_t>(max_rows) * N * sizeof(float)));

    // Per segment: the operand addresses (A weights, B rows, C outputs) and the expert of its slot.
    const size_t S = segs.size();
    std::vector<const void*> A(S), B(S);
    std::vector<void*> C(S), C16(S);  // fp32 outputs (one GEMM per expert) or bf16 (grouped call)
    std::vector<int32_t> slot_expert(S);
    std::vector<int> m_arr(S, N), n_arr(S), k_arr(S, K), lda(S, K), ldb(S, K), ldc(S, N), group_size(S, 1);
    for (const Chunk& ch : chunks)
        for (size_t i = ch.s0; i < ch.s1; ++i) {
            const Segment& s = segs[i];
            PEREGRINE_CHECK(s.rows <= INT_MAX, "linear_cublas: {} rows for one expert", s.rows);
            A[i] = wb + (i - ch.s0) * wbytes;
            B[i] = ab + static_cast<size_t>(s.row0 - ch.r0) * K * elt;
            C[i] = ob + static_cast<size_t>(s.row0 - ch.r0) * N;
            C16[i] = reinterpret_cast<uint16_t*>(ob) + static_cast<size_t>(s.row0 - ch.r0) * N;
            slot_expert[i] = s.expert;
            n_arr[i] = static_cast<int>(s.rows);
        }
    std::vector<char> staging(3 * S * sizeof(void*) + S * sizeof(int32_t));
    std::memcpy(staging.data(), A.data(), S * sizeof(void*));
    std::memcpy(staging.data() + S * sizeof(void*), B.data(), S * sizeof(void*));
    std::memcpy(staging.data() + 2 * S * sizeof(void*), C16.data(), S * sizeof(void*));
    std::memcpy(staging.data() + 3 * S * sizeof(void*), slot_expert.data(), S * sizeof(int32_t));
    char* table = c.table.reserve(staging.size());
    PG_CUDA(cudaMemcpyAsync(table, staging.data(), staging.size(), cudaMemcpyHostToDevice, 0));
    const void* const* A_d = reinterpret_cast<const void* const*>(table);
    const void* const* B_d = A_d + S;
    void* const* C_d = reinterpret_cast<void* const*>(table + 2 * S * sizeof(void*));
    const int32_t* slot_d = reinterpret_cast<const int32_t*>(table + 3 * S * sizeof(void*));

    const std::vector<cublasOperation_t> ta(S, CUBLAS_OP_T), tb(S, CUBLAS_OP_N);
    const std::vector<float> alpha(S, 1.0f), beta(S, 0.0f);
    for (const Chunk& ch : chunks) {
        const size_t n = ch.s1 - ch.s0;
        cublas_prep::gather_activations(x, w.kind >= 2 ? xs : nullptr, w.act_block, ch.r1 - ch.r0, K, r.row_map, ch.r0,
                                        !f32, ab);
        cublas_prep::dequantise_weights(w, nullptr, nullptr, ex.w, ex.scale, slot_d + ch.s0, static_cast<int>(n), 0, N,
                                        !f32, wb);
        bool done = false;
        if (c.grouped && !f32) {
            // The grouped call takes C in A's type (bf16 in, bf16 out with COMPUTE_32F; an fp32 C is rejected),
            // so the fp32 sums are rounded to bf16 by cuBLAS: the same rounding the reference applies.
            const size_t o = ch.s0;
            const cublasStatus_t st = cublasGemmGroupedBatchedEx(
                h, ta.data() + o, tb.data() + o, m_arr.data() + o, n_arr.data() + o, k_arr.data() + o, alpha.data() + o,
                A_d + o, CUDA_R_16BF, lda.data() + o, B_d + o, CUDA_R_16BF, ldb.data() + o, beta.data() + o,
                C_d + o, CUDA_R_16BF, ldc.data() + o, static_cast<int>(n), group_size.data() + o, CUBLAS_COMPUTE_32F);
            if (st == CUBLAS_STATUS_SUCCESS) {
                done = true;
            } else if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
                c.grouped = false;  // one GEMM per expert from now on (which checks the arguments)
                c.grouped_error = cublasGetStatusString(st);
            } else {
                check(st, "grouped gemm");
            }
        }
        if (done) {
            cublas_prep::scatter_rows_bf16(reinterpret_cast<const uint16_t*>(ob), ch.r1 - ch.r0, N, r.row_map, ch.r0,
                                           y);
        } else {
            for (size_t i = ch.s0; i < ch.s1; ++i)
                gemm(h, f32, N, n_arr[i], K, A[i], B[i], static_cast<float*>(C[i]), N);
            cublas_prep::scatter_rows(ob, ch.r1 - ch.r0, N, r.row_map, ch.r0, !f32, y);
        }
    }
}

}  // namespace

bool linear_cublas_supported(const LinearDev& w) {
    if (w.in <= 0 || w.out <= 0 || w.in % 8 != 0) return false;
    switch (w.kind) {
        case 0:
        case 1: return true;
        case 2: return w.weight_block > 0 && w.weight_block % 8 == 0 && w.act_block > 0 && w.act_block % 8 == 0;
        case 3: return w.in % 32 == 0 && w.act_block > 0 && w.act_block % 8 == 0;
        default: return false;
    }
}

void linear_cublas(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y, const ExpertTable* experts,
                   const LinearRouting* routing) {
    if (M == 0 || w.out == 0) return;
    PEREGRINE_CHECK(linear_cublas_supported(w), "linear_cublas: unsupported weight layout (kind {}, in {})", w.kind,
                    w.in);
    PEREGRINE_CHECK(M <= INT_MAX, "linear_cublas: {} rows", M);
    PEREGRINE_CHECK(w.kind < 2 || xs || (!routing && act_quant_bf16_supported(x, w.in, w.act_block)),
                    "linear_cublas: quantised weights need activation scales");
    Context& c = context();
    if (routing) {
        PEREGRINE_CHECK(experts, "linear_cublas: a routed GEMM needs its expert table");
        routed(c, x, xs, M, w, y, *experts, *routing);
    } else {
        dense(c, x, xs, M, w, y);
    }
}

void linear_cublas_use_grouped(bool on) {
    Context& c = context();
    c.get();
    c.grouped = on;
    if (on) c.grouped_error.clear();
}

void grouped_linear_cublas(const float* x, int64_t T, int G, int R, int GD, const uint16_t* w, float* y) {
    if (T == 0 || G == 0 || R == 0) return;
    PEREGRINE_CHECK(GD % 8 == 0 && T <= INT_MAX, "grouped_linear_cublas: group width {} / {} rows", GD, T);
    Context& c = context();
    cublasHandle_t h = c.get();
    char* a = c.acts.reserve(static_cast<size_t>(T) * G * GD * sizeof(uint16_t));
    cublas_prep::gather_activations(x, nullptr, 0, T * G, GD, nullptr, 0, true, a);  // bf16 values: exact
    // Group g: y[t, g*R + j] = x[t, g, :] . w[g*R + j, :] for every t, i.e. column-major C_g (R x T, ld G*R) =
    // A_g^T (A_g: GD x R, ld GD) B_g (GD x T, ld G*GD); the groups are strided by R*GD, GD and R.
    const float one = 1.0f, zero = 0.0f;
    check(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, R, static_cast<int>(T), GD, &one, w, CUDA_R_16BF, GD,
                                     static_cast<long long>(R) * GD, a, CUDA_R_16BF, G * GD, GD, &zero, y, CUDA_R_32F,
                                     G * R, R, G, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "strided batched gemm");
    scale_round_bf16(y, T * G * R, 1.0f);
}

bool linear_cublas_grouped() {
    Context& c = context();
    c.get();
    return c.grouped;
}

std::string linear_cublas_grouped_error() {
    Context& c = context();
    return c.grouped_error;
}

void linear_cublas_release() {
    Context& c = context();
    if (c.weights.p || c.acts.p || c.outs.p || c.table.p) cudaDeviceSynchronize();
    c.weights.release();
    c.acts.release();
    c.outs.release();
    c.table.release();
}

}  // namespace peregrine::cuda
