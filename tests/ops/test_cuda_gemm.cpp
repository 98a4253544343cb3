// The prefill GEMM path (linear_cublas: bf16 tensor cores on exact bf16 images of the quantised operands, fp32 GEMMs
// for F32 linears) and the FP8 linears of 33..256 rows (linear_wgmma) against the exact tiled kernels, at
// V4.1-Flash's real shapes with random weights in the checkpoint formats. Rounded outputs (BF16/FP8/FP4) may differ
// by the bf16 rounding of a differently ordered fp32 sum: |d| <= 2^-7 |exact| (one bf16 step) + 1e-5 max|exact|; F32
// outputs by fp32 summation order only: |d| <= 1e-5 |exact| + 1e-5 max|exact|. At large M the exact kernel runs on
// an even sample of 256 rows. The routed FP4 experts also run through the grouped tensor-core kernels that read the
// packed weights (moe_gemm_fp4.cu, "mma"), plain and gated (w1 and w3 with the SwiGLU). Also prints the fast paths'
// TFLOP/s at M=16384 (and the experts at T=4096 and 16384 tokens). Skipped without a GPU; lines starting with
// "PARITY" are collected by tools/gpu/check.sh.
#include "cuda_test_util.h"
#include "model/model.h"
#include "model/model_weights.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/moe_gemm_fp4.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace peregrine;
using namespace peregrine::cuda;

namespace {

#define CK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

constexpr int kBlock = 32;       // V4.1: weight and activation blocks
constexpr int kExperts = 384, kTopK = 6;
constexpr int64_t kSample = 256;  // rows checked against the exact kernel

uint64_t splitmix(uint64_t& s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

std::shared_ptr<void> upload_bytes(const void* p, size_t n) {
    auto d = device_alloc(n);
    if (cudaMemcpy(d.get(), p, n, cudaMemcpyHostToDevice) != cudaSuccess) ADD_FAILURE() << "upload failed";
    return d;
}

// Random bytes; FP8 codes avoid NaN (0x7f/0xff). Scales: ue8m0 2^-7 .. 2^0.
void random_bytes(std::vector<uint8_t>& v, uint64_t seed, bool fp8) {
    for (size_t i = 0; i < v.size(); i += 8) {
        uint64_t r = splitmix(seed);
        for (size_t j = 0; j < 8 && i + j < v.size(); ++j, r >>= 8) {
            uint8_t b = static_cast<uint8_t>(r);
            if (fp8 && (b & 0x7f) == 0x7f) b ^= 1;
            v[i + j] = b;
        }
    }
}
// ue8m0 scales in lo .. lo + span - 1 (2^-7 .. 2^0 by default).
void random_scales(std::vector<uint8_t>& v, uint64_t seed, int lo = 120, int span = 8) {
    for (auto& b : v) b = static_cast<uint8_t>(lo + static_cast<int>(splitmix(seed) % static_cast<uint64_t>(span)));
}

// One weight matrix in a checkpoint format: kind 0 F32 (stored f32 or bf16), 1 BF16, 2 FP8, 3 FP4.
struct Weight {
    std::shared_ptr<void> w, s;
    LinearDev d;
};
Weight make_weight(int kind, bool w_bf16, int K, int N, uint64_t seed, int scale_lo = 120, int scale_span = 8) {
    Weight r;
    r.d.kind = kind;
    r.d.in = K;
    r.d.out = N;
    r.d.weight_block = kind == 2 ? kBlock : 0;
    r.d.act_block = kind >= 2 ? kBlock : 0;
    r.d.w_bf16 = kind == 0 && w_bf16;
    const size_t n = static_cast<size_t>(N) * K;
    if (kind == 0 && !w_bf16) {
        std::vector<float> v(n);
        for (auto& f : v) f = static_cast<float>(static_cast<int64_t>(splitmix(seed) >> 11) * 0x1p-53 * 2.0 - 1.0);
        r.w = upload_bytes(v.data(), n * 4);
    } else if (kind <= 1) {
        std::vector<uint16_t> v(n);
        for (auto& h : v)
            h = f32_to_bf16(static_cast<float>(static_cast<int64_t>(splitmix(seed) >> 11) * 0x1p-53 * 2.0 - 1.0));
        r.w = upload_bytes(v.data(), n * 2);
    } else {
        std::vector<uint8_t> v(kind == 2 ? n : n / 2);
        random_bytes(v, seed, kind == 2);
        r.w = upload_bytes(v.data(), v.size());
        std::vector<uint8_t> s(kind == 2 ? static_cast<size_t>((N + kBlock - 1) / kBlock) * ((K + kBlock - 1) / kBlock)
                                         : n / 32);
        random_scales(s, seed + 1, scale_lo, scale_span);
        r.s = upload_bytes(s.data(), s.size());
    }
    r.d.w = r.w.get();
    r.d.scale = static_cast<const uint8_t*>(r.s.get());
    return r;
}

// Random bf16 activations [M, K] on the device, quantised (act_quant) for FP8/FP4 weights.
struct Acts {
    std::shared_ptr<void> x, xs;
    const float* xp() const { return static_cast<const float*>(x.get()); }
    const float* xsp() const { return static_cast<const float*>(xs.get()); }
};
Acts make_acts(int64_t M, const LinearDev& d, uint64_t seed) {
    Acts a;
    const int K = d.in;
    auto raw = device_alloc(sizeof(float) * M * K);
    fill_random_bf16(static_cast<float*>(raw.get()), M * K, seed);
    if (d.kind < 2) {
        a.x = raw;
        return a;
    }
    a.x = device_alloc(sizeof(float) * M * K);
    a.xs = device_alloc(sizeof(float) * M * (K / d.act_block));
    act_quant(static_cast<const float*>(raw.get()), M, K, d.act_block, static_cast<float*>(a.x.get()),
              static_cast<float*>(a.xs.get()));
    return a;
}

// Every stride-th row (count rows) of a device matrix with `width` floats per row, to the device or host.
std::shared_ptr<void> sample_rows_device(const float* src, int64_t count, int64_t stride, int64_t width) {
    auto d = device_alloc(sizeof(float) * count * width);
    if (cudaMemcpy2D(d.get(), sizeof(float) * width, src, sizeof(float) * width * stride, sizeof(float) * width, count,
                     cudaMemcpyDeviceToDevice) != cudaSuccess)
        ADD_FAILURE() << "row sample failed";
    return d;
}
std::vector<float> sample_rows_host(const float* src, int64_t count, int64_t stride, int64_t width) {
    std::vector<float> h(static_cast<size_t>(count * width));
    if (cudaMemcpy2D(h.data(), sizeof(float) * width, src, sizeof(float) * width * stride, sizeof(float) * width, count,
                     cudaMemcpyDeviceToHost) != cudaSuccess)
        ADD_FAILURE() << "row copy failed";
    return h;
}

// |fast - exact| <= rel |exact| + abs_frac max|exact| everywhere.
void compare_tol(const std::vector<float>& fast, const std::vector<float>& exact, float rel, float abs_frac,
                 const std::string& what) {
    ASSERT_EQ(fast.size(), exact.size()) << what;
    float emax = 0.0f;
    for (float v : exact) emax = std::max(emax, std::fabs(v));
    const float abs = abs_frac * emax;
    int64_t bad = 0, same = 0;
    float worst = 0.0f;
    for (size_t i = 0; i < fast.size(); ++i) {
        const float d = std::fabs(fast[i] - exact[i]);
        same += fast[i] == exact[i];
        if (!(d <= rel * std::fabs(exact[i]) + abs)) ++bad;
        if (d > worst || std::isnan(d)) worst = d;
    }
    EXPECT_GT(emax, 0.0f) << what << ": the exact output is all zero";
    EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << fast.size() << " outputs outside the tolerance, worst "
                      << worst;
    std::printf("PARITY gemm %-44s max|d| %.3g (%.2g of max|y|) exact %.4f %s\n", what.c_str(), worst,
                emax > 0 ? worst / emax : 0.0, fast.empty() ? 1.0 : static_cast<double>(same) / fast.size(),
                bad ? "FAIL" : "ok");
}

void compare(const std::vector<float>& fast, const std::vector<float>& exact, bool rounded, const std::string& what) {
    compare_tol(fast, exact, rounded ? 0x1p-7f * 1.0001f : 1e-5f, 1e-5f, what);
}

struct DenseShape {
    const char* name;
    int kind;
    bool w_bf16;
    int K, N;
};
// V4.1-Flash: attention projections and the shared expert in FP8, the gate in F32 (stored f32 or bf16), the
// LM head as logits() runs it (F32 compute on bf16 weights) and as a BF16 linear.
const DenseShape kDense[] = {
    {"wq_a 5120->1280 fp8", 2, false, 5120, 1280},       {"wq_b 1280->32768 fp8", 2, false, 1280, 32768},
    {"wkv 5120->512 fp8", 2, false, 5120, 512},          {"wo_b 8192->5120 fp8", 2, false, 8192, 5120},
    {"shared.w1 5120->2304 fp8", 2, false, 5120, 2304},  {"shared.w2 2304->5120 fp8", 2, false, 2304, 5120},
    {"gate 5120->384 f32", 0, false, 5120, 384},         {"gate 5120->384 f32(bf16 w)", 0, true, 5120, 384},
    {"head 5120->129280 f32(bf16 w)", 0, true, 5120, 129280}, {"head 5120->129280 bf16", 1, false, 5120, 129280},
};

// Activation quantisation (act_quant, and act_quant_bf16's bf16 image of it) and the in-place quantise-dequantise of
// cached entries (qdq_rows) against the host's reference functions, bit for bit: the vectorised path (lanes sharing a block) and the general one
// (misaligned rows), at prefill size with blocks of special values (zeros, tiny, huge).
TEST(CudaQuant, ActivationQuantisationMatchesHost) {
    REQUIRE_GPU();
    uint64_t seed = 7;
    auto fill = [&](std::vector<float>& v, int block) {
        for (size_t i = 0; i < v.size(); ++i) {
            const double u = static_cast<double>(splitmix(seed) >> 11) * 0x1.0p-53;
            v[i] = bf16_to_f32(
                f32_to_bf16(static_cast<float>((u - 0.5) * std::ldexp(1.0, static_cast<int>(i / block % 24) - 12))));
        }
        const float special[] = {0.0f, 1e-30f, 3e38f, -3e38f, 1e-4f, -0.0f};
        for (size_t b = 0; b < 6 && (b + 1) * block <= v.size(); ++b)  // block b: one special value, or all of it
            for (int j = 0; j < block; ++j) v[b * block + j] = (b == 0 || j == 3) ? special[b] : v[b * block + j];
    };
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
        int64_t bad = 0;
        for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
        return bad;
    };
    struct Shape { int64_t M; int K, block; };
    for (const Shape sh : {Shape{4096, 5120, 32}, Shape{37, 2304, 128}, Shape{5, 96, 8}, Shape{3, 96, 96}}) {
        for (int offset : {0, 1}) {  // offset 1: rows not 16-byte aligned, the general kernel
            const int64_t n = sh.M * sh.K;
            std::vector<float> x(n), q(n), s(n / sh.block);
            fill(x, sh.block);
            for (int64_t m = 0; m < sh.M; ++m)
                act_quant_fp8(&x[m * sh.K], sh.K, sh.block, &q[m * sh.K], &s[m * (sh.K / sh.block)]);
            auto xd = device_alloc(sizeof(float) * (n + 1)), qd = device_alloc(sizeof(float) * (n + 1)),
                 sd = device_alloc(sizeof(float) * s.size());
            float* xp = static_cast<float*>(xd.get()) + offset;
            float* qp = static_cast<float*>(qd.get()) + offset;
            CK(cudaMemcpy(xp, x.data(), sizeof(float) * n, cudaMemcpyHostToDevice));
            const double ms =
                test::device_ms([&] { act_quant(xp, sh.M, sh.K, sh.block, qp, static_cast<float*>(sd.get())); }, 5);
            CK(cudaDeviceSynchronize());
            std::vector<float> qg(n), sg(s.size());
            CK(cudaMemcpy(qg.data(), qp, sizeof(float) * n, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(sg.data(), sd.get(), sizeof(float) * s.size(), cudaMemcpyDeviceToHost));
            EXPECT_EQ(same(q, qg), 0) << sh.M << "x" << sh.K << " block " << sh.block << " offset " << offset;
            EXPECT_EQ(same(s, sg), 0) << sh.M << "x" << sh.K << " block " << sh.block << " offset " << offset;
            std::printf(
                "PARITY quant act_quant %lldx%d block %d offset %d: bit-identical to the host, %.3f ms (%.0f GB/s)\n",
                static_cast<long long>(sh.M), sh.K, sh.block, offset, ms, 8.0 * n / ms / 1e6);
            if (act_quant_bf16_supported(xp, sh.K, sh.block)) {  // straight into the bf16 image: q x s, exact
                auto bd = device_alloc(sizeof(uint16_t) * n);
                const double ms16 = test::device_ms(
                    [&] { act_quant_bf16(xp, sh.M, sh.K, sh.block, static_cast<uint16_t*>(bd.get())); }, 5);
                std::vector<uint16_t> bg(n);
                CK(cudaMemcpy(bg.data(), bd.get(), sizeof(uint16_t) * n, cudaMemcpyDeviceToHost));
                int64_t bad = 0;
                for (int64_t i = 0; i < n; ++i) bad += bg[i] != f32_to_bf16(q[i] * s[i / sh.block]);
                EXPECT_EQ(bad, 0) << sh.M << "x" << sh.K << " block " << sh.block << ": act_quant_bf16";
                std::printf("PARITY quant act_quant_bf16 %lldx%d block %d: the host's q x s bit for bit, %.3f ms\n",
                            static_cast<long long>(sh.M), sh.K, sh.block, ms16);
            }
        }
    }
    // qdq_rows: rows of `n` values at stride `rs`, the three kinds, as the attention path calls it.
    struct Rows { int64_t rows; int rs, n, block, kind; };
    for (const Rows r : {Rows{4096, 512, 512, 32, 0}, Rows{4096, 512, 448, 64, 0}, Rows{65536, 128, 128, 32, 1},
                         Rows{4096, 512, 512, 16, 2}, Rows{33, 130, 128, 32, 1}}) {
        std::vector<float> x(r.rows * r.rs);
        fill(x, r.block);
        std::vector<float> want = x;
        for (int64_t i = 0; i < r.rows; ++i) {
            float* row = &want[i * r.rs];
            if (r.kind == 0) qdq_fp8(row, r.n, r.block);
            else if (r.kind == 1) qdq_fp4_ue8m0(row, r.n, r.block);
            else qdq_fp4_e4m3(row, r.n, r.block);
        }
        auto xd = device_alloc(sizeof(float) * x.size());
        CK(cudaMemcpy(xd.get(), x.data(), sizeof(float) * x.size(), cudaMemcpyHostToDevice));
        qdq_rows(static_cast<float*>(xd.get()), r.rows, r.rs, r.n, r.block, r.kind);
        CK(cudaDeviceSynchronize());
        std::vector<float> got(x.size());
        CK(cudaMemcpy(got.data(), xd.get(), sizeof(float) * x.size(), cudaMemcpyDeviceToHost));
        EXPECT_EQ(same(want, got), 0) << "qdq " << r.rows << "x" << r.n << " stride " << r.rs << " block " << r.block
                                      << " kind " << r.kind;
        std::printf("PARITY quant qdq_rows %lldx%d stride %d block %d kind %d: bit-identical to the host\n",
                    static_cast<long long>(r.rows), r.n, r.rs, r.block, r.kind);
    }
}

// The routed GEMMs' stable counting sort (expert_tiles) against the host's: row_map (pairs by expert, in pair
// order within one), the tiles of at most mt rows and their count, for decode- and prefill-sized pair counts with
// skewed routing (a tenth of the pairs on three experts).
TEST(CudaGemm, ExpertTilesAreAStableSort) {
    REQUIRE_GPU();
    uint64_t seed = 99;
    for (int64_t n : {int64_t{6}, int64_t{192}, int64_t{24576}, int64_t{393216}}) {
        for (int mt : {8, 32}) {
            std::vector<int32_t> sel(n);
            for (auto& e : sel) {
                const uint64_t r = splitmix(seed);
                e = r % 10 == 0 ? static_cast<int32_t>(r / 10 % 3) : static_cast<int32_t>(r / 10 % kExperts);
            }
            std::vector<int32_t> want_map;
            std::vector<int32_t> want_tiles;
            for (int e = 0; e < kExperts; ++e) {
                const int first = static_cast<int>(want_map.size());
                for (int64_t i = 0; i < n; ++i)
                    if (sel[i] == e) want_map.push_back(static_cast<int32_t>(i));
                const int c = static_cast<int>(want_map.size()) - first;
                for (int r = 0; r < c; r += mt)
                    want_tiles.insert(want_tiles.end(), {e, first + r, std::min(mt, c - r), 0});
            }
            auto sd = upload_bytes(sel.data(), sizeof(int32_t) * n);
            auto md = device_alloc(sizeof(int32_t) * n), td = device_alloc(sizeof(int32_t) * (want_tiles.size() + 4)),
                 nd = device_alloc(sizeof(int32_t));
            const double ms = test::device_ms([&] {
                expert_tiles(static_cast<const int32_t*>(sd.get()), n, kExperts, mt, static_cast<int32_t*>(md.get()),
                             static_cast<int32_t*>(td.get()), static_cast<int32_t*>(nd.get()));
            });
            std::vector<int32_t> map(n), tiles(want_tiles.size());
            int32_t nt = 0;
            CK(cudaMemcpy(map.data(), md.get(), sizeof(int32_t) * n, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(tiles.data(), td.get(), sizeof(int32_t) * tiles.size(), cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&nt, nd.get(), sizeof(int32_t), cudaMemcpyDeviceToHost));
            EXPECT_EQ(map, want_map) << "n " << n << " mt " << mt;
            EXPECT_EQ(nt, static_cast<int32_t>(want_tiles.size() / 4)) << "n " << n << " mt " << mt;
            EXPECT_EQ(tiles, want_tiles) << "n " << n << " mt " << mt;
            std::printf("PARITY gemm expert_tiles %lld pairs x %d experts, tiles of %d: %s, %.3f ms\n",
                        static_cast<long long>(n), kExperts, mt,
                        map == want_map && tiles == want_tiles ? "the host's stable sort" : "DIFFERS", ms);
        }
    }
}

TEST(CudaGemm, DenseFastMatchesExact) {
    REQUIRE_GPU();
    uint64_t seed = 11;
    for (const DenseShape& sh : kDense) {
        const Weight w = make_weight(sh.kind, sh.w_bf16, sh.K, sh.N, seed++);
        ASSERT_TRUE(linear_cublas_supported(w.d)) << sh.name;
        for (int64_t M : {64, 512, 4096}) {
            const Acts a = make_acts(M, w.d, seed++);
            auto y = device_alloc(sizeof(float) * M * sh.N);
            linear_cublas(a.xp(), a.xsp(), M, w.d, static_cast<float*>(y.get()), nullptr, nullptr);
            const int64_t S = std::min(M, kSample), stride = M / S;
            auto xs_s = a.xs ? sample_rows_device(a.xsp(), S, stride, sh.K / kBlock) : nullptr;
            auto x_s = sample_rows_device(a.xp(), S, stride, sh.K);
            auto y_ref = device_alloc(sizeof(float) * S * sh.N);
            linear_tiled(static_cast<const float*>(x_s.get()), static_cast<const float*>(xs_s.get()), S, w.d,
                         static_cast<float*>(y_ref.get()), nullptr, nullptr);
            CK(cudaDeviceSynchronize());
            compare(sample_rows_host(static_cast<const float*>(y.get()), S, stride, sh.N),
                    sample_rows_host(static_cast<const float*>(y_ref.get()), S, 1, sh.N), sh.kind != 0,
                    std::string(sh.name) + " M=" + std::to_string(M));
        }
    }
}

// Decode batches above the GEMV's 32 rows: the FP8 linears on the bf16 tensor cores (linear_wgmma, quantising the raw
// activations itself) against the exact kernel on act_quant's output, every row; token tails (1, 16, 33, 65, 200
// rows), one and two token tiles, and weight scales up to 2^10 (past the first multiply's 2^7) on one shape.
TEST(CudaGemm, DenseWgmmaMatchesExact) {
    REQUIRE_GPU();
    uint64_t seed = 31;
    for (const DenseShape& sh : kDense) {
        if (sh.kind != 2) continue;
        for (bool large : {false, true}) {
            if (large && sh.N != 512) continue;
            const Weight w = make_weight(2, false, sh.K, sh.N, seed++, large ? 130 : 120, 8);
            for (int64_t M : {1, 16, 33, 64, 65, 128, 200, 256}) {
                ASSERT_TRUE(linear_wgmma_supported(w.d, M)) << sh.name;
                auto raw = device_alloc(sizeof(float) * M * sh.K);
                fill_random_bf16(static_cast<float*>(raw.get()), M * sh.K, seed++);
                auto xq = device_alloc(sizeof(float) * M * sh.K);
                auto xs = device_alloc(sizeof(float) * M * (sh.K / kBlock));
                act_quant(static_cast<const float*>(raw.get()), M, sh.K, kBlock, static_cast<float*>(xq.get()),
                          static_cast<float*>(xs.get()));
                auto y = device_alloc(sizeof(float) * M * sh.N), y_ref = device_alloc(sizeof(float) * M * sh.N);
                linear_wgmma(static_cast<const float*>(raw.get()), M, w.d, static_cast<float*>(y.get()));
                linear_tiled(static_cast<const float*>(xq.get()), static_cast<const float*>(xs.get()), M, w.d,
                             static_cast<float*>(y_ref.get()), nullptr, nullptr);
                CK(cudaDeviceSynchronize());
                compare(sample_rows_host(static_cast<const float*>(y.get()), M, 1, sh.N),
                        sample_rows_host(static_cast<const float*>(y_ref.get()), M, 1, sh.N), true,
                        std::string("wgmma ") + sh.name + (large ? " scales to 2^10" : "") + " M=" +
                            std::to_string(M));
            }
        }
    }
}

// Two FP8 linears of one input in one linear_wgmma call (wq_a + wkv, the shared expert's w1 + w3: one quantisation,
// one launch, one reduction over both outputs' partial sums): each output against the exact kernel, every row, with
// NaN left wherever a write went missing or elsewhere.
TEST(CudaGemm, DenseWgmmaPairMatchesExact) {
    REQUIRE_GPU();
    struct PairShape {
        const char* name;
        int K, N0, N1;
    };
    const PairShape shapes[] = {{"wq_a + wkv 5120->1280+512", 5120, 1280, 512},
                                {"shared w1 + w3 5120->2304+2304", 5120, 2304, 2304}};
    uint64_t seed = 53;
    for (const PairShape& sh : shapes) {
        const Weight w0 = make_weight(2, false, sh.K, sh.N0, seed++), w1 = make_weight(2, false, sh.K, sh.N1, seed++);
        for (int64_t M : {1, 2, 16, 65, 200}) {
            auto raw = device_alloc(sizeof(float) * M * sh.K);
            fill_random_bf16(static_cast<float*>(raw.get()), M * sh.K, seed++);
            auto xq = device_alloc(sizeof(float) * M * sh.K), xs = device_alloc(sizeof(float) * M * (sh.K / kBlock));
            act_quant(static_cast<const float*>(raw.get()), M, sh.K, kBlock, static_cast<float*>(xq.get()),
                      static_cast<float*>(xs.get()));
            auto y0 = device_alloc(sizeof(float) * M * sh.N0), y1 = device_alloc(sizeof(float) * M * sh.N1);
            const float* xp = static_cast<const float*>(raw.get());
            float *y0p = static_cast<float*>(y0.get()), *y1p = static_cast<float*>(y1.get());
            CK(cudaMemset(y0p, 0xff, sizeof(float) * M * sh.N0));
            CK(cudaMemset(y1p, 0xff, sizeof(float) * M * sh.N1));
            linear_wgmma_pair(xp, M, w0.d, y0p, &w1.d, y1p);
            for (int which = 0; which < 2; ++which) {
                const Weight& w = which ? w1 : w0;
                const int N = which ? sh.N1 : sh.N0;
                auto y_ref = device_alloc(sizeof(float) * M * N);
                linear_tiled(static_cast<const float*>(xq.get()), static_cast<const float*>(xs.get()), M, w.d,
                             static_cast<float*>(y_ref.get()), nullptr, nullptr);
                CK(cudaDeviceSynchronize());
                compare(sample_rows_host(which ? y1p : y0p, M, 1, N),
                        sample_rows_host(static_cast<const float*>(y_ref.get()), M, 1, N), true,
                        std::string("wgmma pair ") + sh.name + (which ? " (second)" : " (first)") + " M=" +
                            std::to_string(M));
            }
            // What one call saves against two (L2 warm: the launches, quantisations and reductions).
            const double pair_ms = peregrine::test::device_ms(
                [&] { linear_wgmma_pair(xp, M, w0.d, y0p, &w1.d, y1p); }, 20, 3);
            const double two_ms = peregrine::test::device_ms([&] {
                linear_wgmma(xp, M, w0.d, y0p);
                linear_wgmma(xp, M, w1.d, y1p);
            }, 20, 3);
            std::printf("PERF wgmma pair %-32s M=%-4lld pair %6.1f us, two calls %6.1f us\n", sh.name,
                        static_cast<long long>(M), pair_ms * 1e3, two_ms * 1e3);
        }
    }
}

// What the decode-sized FP8 linears cost through each path (the GEMV up to 32 rows, linear_wgmma, cuBLAS on bf16
// images), with L2 flushed before every call: microseconds and the weights' bytes over that time. Printed, not
// asserted (speed is judged by the benchmarks; tools/gpu/check.sh collects the lines).
TEST(CudaGemm, DecodeSizedFp8Throughput) {
    REQUIRE_GPU();
    const size_t flush_bytes = size_t(256) << 20;  // over the H200's 60 MB of L2
    auto flush = device_alloc(flush_bytes);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto cold_us = [&](const std::function<void()>& f) {
        f();
        std::vector<float> t;
        for (int i = 0; i < 7; ++i) {
            cudaMemsetAsync(flush.get(), i, flush_bytes, cudaStreamPerThread);
            cudaEventRecord(e0, cudaStreamPerThread);
            f();
            cudaEventRecord(e1, cudaStreamPerThread);
            cudaEventSynchronize(e1);
            float ms = 0.0f;
            cudaEventElapsedTime(&ms, e0, e1);
            t.push_back(ms * 1e3f);
        }
        std::sort(t.begin(), t.end());
        return static_cast<double>(t[t.size() / 2]);
    };
    uint64_t seed = 77;
    for (const DenseShape& sh : kDense) {
        if (sh.kind != 2) continue;
        const Weight w = make_weight(2, false, sh.K, sh.N, seed++);
        const double bytes = static_cast<double>(sh.N) * sh.K;
        for (int64_t M : {16, 32, 64, 128, 256}) {
            auto x = device_alloc(sizeof(float) * M * sh.K), y = device_alloc(sizeof(float) * M * sh.N);
            fill_random_bf16(static_cast<float*>(x.get()), M * sh.K, seed++);
            const float* xp = static_cast<const float*>(x.get());
            float* yp = static_cast<float*>(y.get());
            auto line = [&](const char* path, double us) {
                std::printf("PERF gemm decode %-28s M=%-4lld %-6s %8.1f us %7.0f GB/s\n", sh.name,
                            static_cast<long long>(M), path, us, bytes / (us * 1e-6) / 1e9);
            };
            if (M <= 32) line("gemv", cold_us([&] { linear_gemv(xp, nullptr, M, w.d, yp, nullptr, nullptr); }));
            line("wgmma", cold_us([&] { linear_wgmma(xp, M, w.d, yp); }));
            line("cublas", cold_us([&] { linear_cublas(xp, nullptr, M, w.d, yp, nullptr, nullptr); }));
            ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

// Experts of one layer (or the 8 wo_a groups): one weight buffer per expert and the device pointer table.
struct Experts {
    std::vector<Weight> each;
    std::shared_ptr<void> table;
    ExpertTable t;
    LinearDev d;  // the shared shape
};
Experts make_experts(int kind, int E, int K, int N, uint64_t seed, int scale_lo = 120, int scale_span = 8) {
    Experts x;
    std::vector<const void*> ptrs(2 * static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
        x.each.push_back(make_weight(kind, false, K, N, seed + 7919 * e, scale_lo, scale_span));
        ptrs[e] = x.each.back().d.w;
        ptrs[E + e] = x.each.back().d.scale;
    }
    x.table = upload_bytes(ptrs.data(), ptrs.size() * sizeof(void*));
    auto p = static_cast<const void* const*>(x.table.get());
    x.t = {p, reinterpret_cast<const uint8_t* const*>(p + E)};
    x.d = x.each[0].d;
    x.d.w = nullptr;
    x.d.scale = nullptr;
    return x;
}

// The routed experts' w1 (5120->2304) and w2 (2304->5120) in FP4, made once (2.3 GB each).
const Experts& fp4_experts(bool w2) {
    static const Experts e1 = make_experts(3, kExperts, 5120, 2304, 101),
                         e2 = make_experts(3, kExperts, 2304, 5120, 202);
    return w2 ? e2 : e1;
}

// Rows grouped by expert (expert_tiles) with tiles of tile_rows.
struct Routing {
    std::shared_ptr<void> sel, map, tiles, n;
    LinearRouting r;
};
Routing make_routing(const std::vector<int32_t>& sel, int E, int tile_rows) {
    Routing g;
    const int64_t P = static_cast<int64_t>(sel.size());
    g.r.tile_rows = tile_rows;
    g.r.max_tiles = static_cast<unsigned>((P + tile_rows - 1) / tile_rows + E);
    g.sel = upload_bytes(sel.data(), sel.size() * sizeof(int32_t));
    g.map = device_alloc(sizeof(int32_t) * P);
    g.tiles = device_alloc(sizeof(int32_t) * 4 * g.r.max_tiles);
    g.n = device_alloc(sizeof(int32_t));
    expert_tiles(static_cast<const int32_t*>(g.sel.get()), P, E, tile_rows, static_cast<int32_t*>(g.map.get()),
                 static_cast<int32_t*>(g.tiles.get()), static_cast<int32_t*>(g.n.get()));
    g.r.row_map = static_cast<const int32_t*>(g.map.get());
    g.r.tiles = static_cast<const int32_t*>(g.tiles.get());
    g.r.n_tiles = static_cast<const int32_t*>(g.n.get());
    return g;
}

// Expert of pair (t, k): balanced ((t*K + k) % E, as --balanced-routing) or skewed (slot 0 always expert 0,
// slot 1 one of experts 1..3, the rest hashed: a few hot experts, many with few or no rows).
std::vector<int32_t> selection(int64_t T, int K, int E, bool skewed) {
    std::vector<int32_t> sel(static_cast<size_t>(T * K));
    for (int64_t t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) {
            int32_t e = static_cast<int32_t>((t * K + k) % E);
            if (skewed) {
                uint64_t h = static_cast<uint64_t>(t * 131 + k);
                e = k == 0 ? 0 : k == 1 ? static_cast<int32_t>(1 + t % 3) : static_cast<int32_t>(splitmix(h) % E);
            }
            sel[static_cast<size_t>(t * K + k)] = e;
        }
    return sel;
}

// Fast routed GEMM over all rows (cuBLAS, or the grouped FP4 kernel with `mma`) vs the exact tiled kernel on
// an even sample of them (same experts).
void check_routed(const Experts& ex, const std::vector<int32_t>& sel, int E, int tile_rows, uint64_t seed,
                  const std::string& what, bool mma = false) {
    const int64_t P = static_cast<int64_t>(sel.size());
    const int N = ex.d.out, K = ex.d.in;
    const Acts a = make_acts(P, ex.d, seed);
    const Routing g = make_routing(sel, E, tile_rows);
    auto y = device_alloc(sizeof(float) * P * N);
    std::string mode;
    if (mma) {
        fp4_grouped_linear(a.xp(), a.xsp(), P, 1, E, ex.d, ex.t, g.r, static_cast<float*>(y.get()));
        mode = fp4_grouped_wgmma() ? " wgmma" : " mma";
    } else {
        linear_cublas(a.xp(), a.xsp(), P, ex.d, static_cast<float*>(y.get()), &ex.t, &g.r);
        mode = linear_cublas_grouped() ? " grouped" : " loop";
    }

    const int64_t S = std::min(P, kSample), stride = P / S;
    std::vector<int32_t> sel_s(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i) sel_s[static_cast<size_t>(i)] = sel[static_cast<size_t>(i * stride)];
    const Routing gs = make_routing(sel_s, E, 8);
    auto x_s = sample_rows_device(a.xp(), S, stride, K);
    auto xs_s = a.xs ? sample_rows_device(a.xsp(), S, stride, K / ex.d.act_block) : nullptr;
    auto y_ref = device_alloc(sizeof(float) * S * N);
    linear_tiled(static_cast<const float*>(x_s.get()), static_cast<const float*>(xs_s.get()), S, ex.d,
                 static_cast<float*>(y_ref.get()), &ex.t, &gs.r);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    compare(sample_rows_host(static_cast<const float*>(y.get()), S, stride, N),
            sample_rows_host(static_cast<const float*>(y_ref.get()), S, 1, N), ex.d.kind != 0, what + mode);
}

TEST(CudaGemm, RoutedExpertsFastMatchExact) {
    REQUIRE_GPU();
    const Experts &w1 = fp4_experts(false), &w2 = fp4_experts(true);
    ASSERT_TRUE(fp4_grouped_supported(w1.d) && fp4_grouped_supported(w2.d));
    uint64_t seed = 300;
    // Grouped cuBLAS, one cuBLAS GEMM per expert, the grouped FP4 kernels on mma.sync and on wgmma (64- and
    // 128-token tiles: these sizes average at most 64 rows an expert, so 128 is forced).
    for (int variant : {0, 1, 2, 3, 4}) {
        linear_cublas_use_grouped(variant == 0);
        fp4_grouped_use_wgmma(variant >= 3);
        fp4_grouped_wgmma_tile(variant == 4 ? 128 : 0);
        for (int64_t T : {64, 512, 4096})
            for (bool skewed : {false, true}) {
                const auto sel = selection(T, kTopK, kExperts, skewed);
                const int tr = routing_tile_rows(static_cast<int64_t>(sel.size()), kExperts);
                const std::string tag = std::string(skewed ? " skewed" : " balanced") + " T=" + std::to_string(T);
                const std::string tile = variant == 4 ? " 128-token tiles" : "";
                check_routed(w1, sel, kExperts, tr, seed++, "experts.w1 5120->2304 fp4" + tag + tile, variant >= 2);
                check_routed(w2, sel, kExperts, tr, seed++, "experts.w2 2304->5120 fp4" + tag + tile, variant >= 2);
            }
        if (variant == 0)
            std::printf("PARITY gemm cublasGemmGroupedBatchedEx (bf16 in/out, COMPUTE_32F): %s\n",
                        linear_cublas_grouped() ? "used" : ("rejected: " + linear_cublas_grouped_error()).c_str());
    }
    linear_cublas_use_grouped(true);
    fp4_grouped_use_wgmma(true);
    fp4_grouped_wgmma_tile(0);
}

// FP4 scales above 2^1 (e > 128) take a second exact multiply in the wgmma kernel: experts with e in 120..140
// (both paths inside one warp's rows) and in 129..140, through both grouped kernels, against the exact kernel.
TEST(CudaGemm, RoutedExpertsLargeScalesMatchExact) {
    REQUIRE_GPU();
    const int E = 16;
    uint64_t seed = 1300;
    for (int lo : {120, 129}) {
        const Experts ex = make_experts(3, E, 512, 512, seed++, lo, 141 - lo);
        const auto sel = selection(1024, kTopK, E, false);
        for (int variant : {0, 1, 2}) {  // mma.sync, wgmma with 64- and 128-token tiles
            fp4_grouped_use_wgmma(variant > 0);
            fp4_grouped_wgmma_tile(variant == 2 ? 128 : 64);
            check_routed(ex, sel, E, routing_tile_rows(static_cast<int64_t>(sel.size()), E), seed++,
                         "experts fp4 512->512 scales 2^" + std::to_string(lo - 127) + "..2^13" +
                             (variant == 2 ? " 128-token tiles" : ""), true);
        }
    }
    fp4_grouped_use_wgmma(true);
    fp4_grouped_wgmma_tile(0);
}

// Expert e of `ex` read as expert (e + 1) % E: a second weight set over the same matrices, so that the gated
// kernel's two sets differ (swapping them would be caught).
ExpertTable rotated_table(const Experts& ex, int E, std::shared_ptr<void>& keep) {
    std::vector<const void*> ptrs(2 * static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
        ptrs[e] = ex.each[static_cast<size_t>((e + 1) % E)].d.w;
        ptrs[E + e] = ex.each[static_cast<size_t>((e + 1) % E)].d.scale;
    }
    keep = upload_bytes(ptrs.data(), ptrs.size() * sizeof(void*));
    auto p = static_cast<const void* const*>(keep.get());
    return {p, reinterpret_cast<const uint8_t* const*>(p + E)};
}

// Gate and up in one pass with the SwiGLU (fp4_grouped_swiglu) over token rows read by pair p as row p / K,
// vs the exact w1 and w3 GEMMs and swiglu() on a sample of pairs. The output passes two rounded GEMMs and a
// rounding of its own: |d| <= 3 bf16 steps of |exact| + 1e-4 max|exact| (a one-step change of a strongly
// negative gate moves silu(g) by more than a step relative to itself, but little in absolute terms).
void check_gated(const Experts& w1, const ExpertTable& w3, int64_t T, bool skewed, float limit, uint64_t seed,
                 const std::string& what) {
    const int E = kExperts, N = w1.d.out, K = w1.d.in;
    const auto sel = selection(T, kTopK, E, skewed);
    const int64_t P = static_cast<int64_t>(sel.size());
    const Acts a = make_acts(T, w1.d, seed);
    std::vector<float> rw(static_cast<size_t>(P));
    uint64_t s = seed * 31 + 7;
    for (auto& v : rw) v = static_cast<float>(0.05 + 0.95 * (static_cast<double>(splitmix(s) >> 11) * 0x1p-53));
    auto rw_d = upload_bytes(rw.data(), rw.size() * sizeof(float));
    const Routing g = make_routing(sel, E, routing_tile_rows(P, E));
    auto out = device_alloc(sizeof(float) * P * N);
    fp4_grouped_swiglu(a.xp(), a.xsp(), P, kTopK, E, w1.d, w1.t, w3, g.r, static_cast<const float*>(rw_d.get()), limit,
                       static_cast<float*>(out.get()));

    const int64_t S = std::min(P, kSample), stride = P / S;
    std::vector<int32_t> sel_s(static_cast<size_t>(S)), tok(static_cast<size_t>(S));
    std::vector<float> rw_s(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i) {
        sel_s[static_cast<size_t>(i)] = sel[static_cast<size_t>(i * stride)];
        tok[static_cast<size_t>(i)] = static_cast<int32_t>(i * stride / kTopK);
        rw_s[static_cast<size_t>(i)] = rw[static_cast<size_t>(i * stride)];
    }
    const Routing gs = make_routing(sel_s, E, 8);
    auto tok_d = upload_bytes(tok.data(), tok.size() * sizeof(int32_t));
    auto rws_d = upload_bytes(rw_s.data(), rw_s.size() * sizeof(float));
    auto x_s = device_alloc(sizeof(float) * S * K), xs_s = device_alloc(sizeof(float) * S * (K / w1.d.act_block));
    gather_rows(a.xp(), static_cast<const int32_t*>(tok_d.get()), S, K, static_cast<float*>(x_s.get()));
    gather_rows(a.xsp(), static_cast<const int32_t*>(tok_d.get()), S, K / w1.d.act_block,
                static_cast<float*>(xs_s.get()));
    auto g_ref = device_alloc(sizeof(float) * S * N), u_ref = device_alloc(sizeof(float) * S * N),
         a_ref = device_alloc(sizeof(float) * S * N);
    linear_tiled(static_cast<const float*>(x_s.get()), static_cast<const float*>(xs_s.get()), S, w1.d,
                 static_cast<float*>(g_ref.get()), &w1.t, &gs.r);
    linear_tiled(static_cast<const float*>(x_s.get()), static_cast<const float*>(xs_s.get()), S, w1.d,
                 static_cast<float*>(u_ref.get()), &w3, &gs.r);
    swiglu(static_cast<const float*>(g_ref.get()), static_cast<const float*>(u_ref.get()), S, N,
           static_cast<const float*>(rws_d.get()), limit, static_cast<float*>(a_ref.get()));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    compare_tol(sample_rows_host(static_cast<const float*>(out.get()), S, stride, N),
                sample_rows_host(static_cast<const float*>(a_ref.get()), S, 1, N), 3 * 0x1p-7f, 1e-4f, what);
}

TEST(CudaGemm, GatedExpertsFastMatchExact) {
    REQUIRE_GPU();
    const Experts& w1 = fp4_experts(false);
    std::shared_ptr<void> keep;
    const ExpertTable w3 = rotated_table(w1, kExperts, keep);
    uint64_t seed = 700;
    for (int variant : {0, 1, 2}) {  // mma.sync, wgmma with 64- and 128-token tiles
        fp4_grouped_use_wgmma(variant > 0);
        fp4_grouped_wgmma_tile(variant == 2 ? 128 : 64);
        for (int64_t T : {64, 512, 4096})
            for (bool skewed : {false, true})
                for (float limit : {0.0f, 64.0f})
                    check_gated(w1, w3, T, skewed, limit, seed++,
                                std::string("experts.w1+w3 swiglu ") +
                                    (variant == 0   ? "mma"
                                     : variant == 1 ? "wgmma"
                                                    : "wgmma128") +
                                    (skewed ? " skewed" : " balanced") + " T=" + std::to_string(T) +
                                    (limit > 0 ? " lim64" : ""));
    }
    fp4_grouped_use_wgmma(true);
    fp4_grouped_wgmma_tile(0);
}

// The grouped wo_a: rows (t, g) of 4096 through group g's bf16 [1024, 4096] block (8 groups), as
// CudaBackend::project_output runs it.
TEST(CudaGemm, GroupedWoAFastMatchesExact) {
    REQUIRE_GPU();
    const int G = 8, R = 1024, GD = 4096;
    Experts wo_a = make_experts(1, G, GD, R, 77);
    uint64_t seed = 900;
    for (int64_t T : {64, 512, 4096}) {
        std::vector<int32_t> sel(static_cast<size_t>(T * G));
        for (size_t i = 0; i < sel.size(); ++i) sel[i] = static_cast<int32_t>(i % G);
        check_routed(wo_a, sel, G, routing_tile_rows(T * G, G), seed++,
                     "wo_a routed 8x4096->1024 bf16 T=" + std::to_string(T));
    }
    // As the backend runs it: one [G*R, GD] block, rows (t, g) strided in x [T, G, GD] (grouped_linear_cublas).
    const size_t wn = static_cast<size_t>(G) * R * GD;
    std::vector<uint16_t> wh(wn);
    uint64_t s = 4711;
    for (auto& h : wh)
        h = f32_to_bf16(static_cast<float>(static_cast<int64_t>(splitmix(s) >> 11) * 0x1p-53 * 2.0 - 1.0));
    auto wd = upload_bytes(wh.data(), wn * sizeof(uint16_t));
    const uint16_t* w = static_cast<const uint16_t*>(wd.get());
    for (int64_t T : {64, 512, 4096}) {
        auto x = device_alloc(sizeof(float) * T * G * GD);
        fill_random_bf16(static_cast<float*>(x.get()), T * G * GD, seed++);
        auto y = device_alloc(sizeof(float) * T * G * R);
        grouped_linear_cublas(static_cast<const float*>(x.get()), T, G, R, GD, w, static_cast<float*>(y.get()));
        const int64_t S = std::min<int64_t>(T, 64), stride = T / S;  // sampled tokens, all their groups
        auto x_s = sample_rows_device(static_cast<const float*>(x.get()), S, stride, static_cast<int64_t>(G) * GD);
        auto y_ref = device_alloc(sizeof(float) * S * G * R);
        grouped_linear_bf16(static_cast<const float*>(x_s.get()), S, G, R, GD, w, static_cast<float*>(y_ref.get()));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        compare(sample_rows_host(static_cast<const float*>(y.get()), S, stride, static_cast<int64_t>(G) * R),
                sample_rows_host(static_cast<const float*>(y_ref.get()), S, 1, static_cast<int64_t>(G) * R), true,
                "wo_a strided 8x4096->1024 bf16 T=" + std::to_string(T));
    }
}

TEST(CudaGemm, FastPathThroughputAtPrefillSize) {
    REQUIRE_GPU();
    const int64_t M = 16384;
    uint64_t seed = 5000;
    for (const DenseShape& sh : kDense) {
        const Weight w = make_weight(sh.kind, sh.w_bf16, sh.K, sh.N, seed++);
        const Acts a = make_acts(M, w.d, seed++);
        auto y = device_alloc(sizeof(float) * M * sh.N);
        const double ms = peregrine::test::device_ms(
            [&] { linear_cublas(a.xp(), a.xsp(), M, w.d, static_cast<float*>(y.get()), nullptr, nullptr); }, 3);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        std::printf("PARITY gemm %-44s M=%lld %8.3f ms %7.1f TFLOP/s\n", sh.name, static_cast<long long>(M), ms,
                    2.0 * M * sh.N * sh.K / (ms * 1e-3) / 1e12);
    }
    // Routed experts (384, top-6, balanced) at T = 4096 (64 rows per expert) and 16384 tokens: cuBLAS grouped
    // and per-expert loop, the grouped FP4 kernel (mma) per projection, and gate+up with the SwiGLU fused.
    const Experts &w1 = fp4_experts(false), &w2 = fp4_experts(true);
    std::shared_ptr<void> keep;
    const ExpertTable w3 = rotated_table(w1, kExperts, keep);
    for (int64_t T : {int64_t(4096), M}) {
        const auto sel = selection(T, kTopK, kExperts, false);
        const int64_t P = static_cast<int64_t>(sel.size());
        const Routing g = make_routing(sel, kExperts, routing_tile_rows(P, kExperts));
        auto line = [&](const char* what, const char* mode, double ms, double flop) {
            std::printf("PARITY gemm experts %-22s fp4 384x top-6 balanced %-8s T=%lld %8.3f ms %7.1f TFLOP/s\n", what,
                        mode, static_cast<long long>(T), ms, flop / (ms * 1e-3) / 1e12);
        };
        for (const Experts* ex : {&w1, &w2}) {
            const char* name = ex == &w1 ? "w1 5120->2304" : "w2 2304->5120";
            const double flop = 2.0 * P * ex->d.out * ex->d.in;
            const Acts a = make_acts(P, ex->d, seed++);
            auto y = device_alloc(sizeof(float) * P * ex->d.out);
            for (bool grouped : {true, false}) {
                linear_cublas_use_grouped(grouped);
                const bool used = linear_cublas_grouped();
                const double ms = peregrine::test::device_ms(
                    [&] { linear_cublas(a.xp(), a.xsp(), P, ex->d, static_cast<float*>(y.get()), &ex->t, &g.r); }, 3);
                ASSERT_EQ(cudaGetLastError(), cudaSuccess);
                line(name, used ? "grouped" : "loop", ms, flop);
            }
            for (int variant : {0, 1, 2}) {  // mma.sync, wgmma with 64- and 128-token tiles
                fp4_grouped_use_wgmma(variant > 0);
                fp4_grouped_wgmma_tile(variant == 2 ? 128 : 64);
                const double ms = peregrine::test::device_ms(
                    [&] {
                        fp4_grouped_linear(a.xp(), a.xsp(), P, 1, kExperts, ex->d, ex->t, g.r,
                                           static_cast<float*>(y.get()));
                    },
                    5);
                ASSERT_EQ(cudaGetLastError(), cudaSuccess);
                line(name, variant == 0 ? "mma" : variant == 1 ? "wgmma" : "wgmma128", ms, flop);
            }
        }
        const Acts a = make_acts(T, w1.d, seed++);  // token rows, read by pair p as row p / top-k
        auto rw = device_alloc(sizeof(float) * P), out = device_alloc(sizeof(float) * P * w1.d.out);
        fill_random_bf16(static_cast<float*>(rw.get()), P, seed++);
        for (int variant : {0, 1, 2}) {
            fp4_grouped_use_wgmma(variant > 0);
            fp4_grouped_wgmma_tile(variant == 2 ? 128 : 64);
            const double ms = peregrine::test::device_ms(
                [&] {
                    fp4_grouped_swiglu(a.xp(), a.xsp(), P, kTopK, kExperts, w1.d, w1.t, w3, g.r,
                                       static_cast<const float*>(rw.get()), 10.0f, static_cast<float*>(out.get()));
                },
                5);
            ASSERT_EQ(cudaGetLastError(), cudaSuccess);
            line("w1+w3 swiglu 5120->2x2304", variant == 0 ? "mma" : variant == 1 ? "wgmma" : "wgmma128", ms,
                 2.0 * 2.0 * P * w1.d.out * w1.d.in);
        }
    }
    fp4_grouped_use_wgmma(true);
    fp4_grouped_wgmma_tile(0);
    linear_cublas_use_grouped(true);
}

// Through the backend: Fast (cuBLAS from 64 rows; routed experts with 32-row tiles) against Exact on the
// same synthetic V4.1-Flash layer (8 experts so that 128 tokens give many rows per expert).
TEST(CudaGemm, BackendFastDispatchMatchesExact) {
    REQUIRE_GPU();
    ModelConfig cfg = synthetic_v41_flash_config(2, 8);
    ModelWeights w = synthetic_model_weights(cfg, 3);
    StateLayout layout = make_state_layout(cfg, 16);
    const char* prev = std::getenv("PEREGRINE_CUDA_NUMERICS");
    const std::string saved = prev ? prev : "";
    setenv("PEREGRINE_CUDA_NUMERICS", "exact", 1);
    CudaBackend exact(cfg, model_format(cfg), layout);
    setenv("PEREGRINE_CUDA_NUMERICS", "fast", 1);
    CudaBackend fast(cfg, model_format(cfg), layout);
    if (prev) setenv("PEREGRINE_CUDA_NUMERICS", saved.c_str(), 1);
    else unsetenv("PEREGRINE_CUDA_NUMERICS");
    exact.set_balanced_routing(true);
    fast.set_balanced_routing(true);
    const int64_t T = 128;
    const BlockWeight& b = w.layers.at(1);
    uint64_t seed = 4242;
    auto host = [](const Tensor& t) { return cuda::to_host(t); };
    auto vec = [](const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); };
    for (auto [name, lw] : std::vector<std::pair<std::string, const LinearWeight*>>{
             {"wq_a", &b.attn.wq_a}, {"wq_b", &b.attn.wq_b}, {"wo_b", &b.attn.wo_b}, {"gate", &b.ffn.gate}}) {
        Tensor x = cuda::empty(DType::F32, {T, lw->in});
        fill_random_bf16(x.f32(), x.numel(), seed++);
        compare(vec(host(fast.linear(x, *lw))), vec(host(exact.linear(x, *lw))), lw->kind != LinearWeight::Kind::F32,
                "backend " + name + " T=128");
    }
    Tensor x = cuda::empty(DType::F32, {T, cfg.dim});
    fill_random_bf16(x.f32(), x.numel(), seed++);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) ids[static_cast<size_t>(t)] = static_cast<int32_t>((t * 37 + 11) % cfg.vocab_size);
    // The MoE output passes two rounded GEMMs and SwiGLU: a few bf16 steps of its magnitude.
    const std::vector<float> mf = vec(host(fast.moe(x, b.ffn, ids))), me = vec(host(exact.moe(x, b.ffn, ids)));
    float emax = 0.0f, worst = 0.0f;
    for (size_t i = 0; i < me.size(); ++i) {
        emax = std::max(emax, std::fabs(me[i]));
        worst = std::max(worst, std::fabs(mf[i] - me[i]));
    }
    EXPECT_GT(emax, 0.0f);
    EXPECT_LE(worst, 0x1p-5f * emax) << "moe fast vs exact";
    std::printf("PARITY gemm %-44s max|d| %.3g (%.2g of max|y|)\n", "backend moe T=128 (8 experts)", worst,
                emax > 0 ? worst / emax : 0.0);
}

}  // namespace
