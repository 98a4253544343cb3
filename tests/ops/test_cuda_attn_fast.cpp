// The fast attention-path and routing kernels (Numerics::Fast) against the exact ones on random data at
// V4.1-Flash sizes (indexer 32 heads x 128, index top-k 512, 384 experts top-6), with the device time of
// both: indexer scoring for decode (8 rows x 131072 keys) and prefill (4096 rows x 65536 keys, tensor
// cores), top-k and candidate blocks over 131072 / 65536 scores, MoE routing. Skipped without a GPU.
// Lines starting with "PARITY" are collected by tools/gpu/check.sh.
#include "cuda_test_util.h"
#include "ops/backend.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/kernels.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <tuple>

using namespace peregrine;
using cuda::CudaBackend;
using cuda::DevArray;

namespace {

constexpr int kHeads = 32, kDim = 128, kTopK = 512;

// Rows of fp4-quantised values as the indexer's q and k are (bf16 draws, fp4 e2m1 with ue8m0 scales per 32).
std::vector<float> fp4_rows(int64_t rows, int width, uint64_t seed) {
    std::vector<float> v(static_cast<size_t>(rows * width));
    std::mt19937_64 g(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (auto& x : v) x = round_bf16(n(g));
    for (int64_t r = 0; r < rows; ++r) qdq_fp4_ue8m0(v.data() + r * width, width, 32);
    return v;
}

std::vector<float> weights(int64_t T, uint64_t seed) {
    std::vector<float> w(static_cast<size_t>(T * kHeads));
    std::mt19937_64 g(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    const float s = static_cast<float>(std::pow(kDim, -0.5) * std::pow(kHeads, -0.5));
    for (auto& x : w) x = round_bf16(round_bf16(n(g)) * s);
    return w;
}

template <typename T>
std::vector<T> host(const T* p, size_t n) {
    std::vector<T> v(n);
    if (n) cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
}

// Scores agree within one bf16 step of the larger magnitude (the fp32 sum of a dot product can round to the
// neighbouring bf16 value where the exact sum is not representable); reports the exactly equal share.
void compare_scores(const std::vector<float>& fast, const std::vector<float>& exact, const std::string& what) {
    ASSERT_EQ(fast.size(), exact.size());
    int64_t equal = 0, bad = 0;
    float worst = 0.0f;
    for (size_t i = 0; i < fast.size(); ++i) {
        const float a = fast[i], b = exact[i];
        if (a == b) {
            ++equal;
            continue;
        }
        const float d = std::fabs(a - b);
        worst = std::max(worst, d);
        if (!(d <= std::ldexp(std::max(std::fabs(a), std::fabs(b)), -7) + 1e-6f)) ++bad;
    }
    const double share = static_cast<double>(equal) / static_cast<double>(fast.size());
    EXPECT_EQ(bad, 0) << what << ": " << bad << " scores beyond a bf16 step, worst " << worst;
    EXPECT_GE(share, 0.999) << what;
    std::printf("PARITY attn %s equal %.6f max|d| %.3g (tol: 1 bf16 step)\n", what.c_str(), share, worst);
}

TEST(CudaAttnFast, IndexScoresDecodeStream) {
    REQUIRE_GPU();
    const int T = 8;
    const int64_t N = 131072;
    auto kh = fp4_rows(N, kDim, 11);
    auto qh = fp4_rows(T * kHeads, kDim, 12);
    const EntryFormat kf = fp4_entry_format(kDim, 32, false);  // the indexer keys' state entries
    auto kd = cuda::upload(peregrine::test::pack_entries(kh, N, kf));
    std::vector<const uint8_t*> table(static_cast<size_t>(N));
    for (int64_t j = 0; j < N; ++j) table[static_cast<size_t>(j)] = kd.ptr + (j ^ 1) * kf.bytes;
    auto td = cuda::upload(table);
    auto q = cuda::upload(qh);
    auto w = cuda::upload(weights(T, 13));
    // Each row its own sequence over the same keys, with fewer visible entries on some rows.
    std::vector<int64_t> width(T, N), visible(T), keybase(T, 0);
    for (int t = 0; t < T; ++t) visible[static_cast<size_t>(t)] = N - t * 1001;
    auto wd = cuda::upload(width), vd = cuda::upload(visible), bd = cuda::upload(keybase);
    Tensor fast = cuda::empty(DType::F32, {T, N}), exact = cuda::empty(DType::F32, {T, N});
    const float ms_fast = peregrine::test::device_ms([&] {
        cuda::index_scores_stream(q.ptr, w.ptr, nullptr, T, kHeads, kDim, wd.ptr, vd.ptr, bd.ptr, td.ptr, kf, N,
                                  fast.f32());
    });
    const float ms_exact = peregrine::test::device_ms([&] {
        cuda::index_scores(q.ptr, w.ptr, T, kHeads, kDim, wd.ptr, vd.ptr, bd.ptr, td.ptr, kf, N, exact.f32());
    });
    auto f = host(fast.f32(), static_cast<size_t>(T * N)), e = host(exact.f32(), static_cast<size_t>(T * N));
    for (int t = 1; t < T; ++t) EXPECT_EQ(f[static_cast<size_t>(t * N + N - 1)], -INFINITY) << "row " << t;
    compare_scores(f, e, "index_scores_stream 8x131072 (32 heads x 128)");
    const double gb = static_cast<double>(T) * N * kf.bytes / 1e9;
    std::printf("PARITY attn index_scores_stream 8x131072 fast %.3f ms (%.0f GB/s of keys) exact %.3f ms\n", ms_fast,
                gb / (ms_fast * 1e-3), ms_exact);
}

// Decode rows on the tensor cores (a CTA per row, its 32 heads as the mma's M) against the CUDA-core streaming
// kernel and the exact one, at 1, 8 and 128 rows over 131,072 keys (fewer visible on some rows), with timings.
TEST(CudaAttnFast, IndexScoresDecodeTensorCores) {
    REQUIRE_GPU();
    const int64_t N = 131072;
    auto kh = fp4_rows(N, kDim, 21);
    const EntryFormat kf = fp4_entry_format(kDim, 32, false);
    auto kd = cuda::upload(peregrine::test::pack_entries(kh, N, kf));
    std::vector<const uint8_t*> table(static_cast<size_t>(N));
    for (int64_t j = 0; j < N; ++j) table[static_cast<size_t>(j)] = kd.ptr + (j ^ 1) * kf.bytes;
    auto td = cuda::upload(table);
    for (int T : {1, 8, 128}) {
        auto q = cuda::upload(fp4_rows(static_cast<int64_t>(T) * kHeads, kDim, 22 + T));
        auto w = cuda::upload(weights(T, 23 + T));
        std::vector<int64_t> width(static_cast<size_t>(T), N), visible(static_cast<size_t>(T)),
            keybase(static_cast<size_t>(T), 0);
        for (int t = 0; t < T; ++t) visible[static_cast<size_t>(t)] = N - (t * 1001) % (N / 2) - (t % 3) * 37;
        auto wd = cuda::upload(width), vd = cuda::upload(visible), bd = cuda::upload(keybase);
        Tensor tc = cuda::empty(DType::F32, {T, N}), st = cuda::empty(DType::F32, {T, N});
        auto run = [&](bool mma, Tensor& out) {
            cuda::index_scores_decode_use_mma(mma);
            return peregrine::test::device_ms([&] {
                cuda::index_scores_stream(q.ptr, w.ptr, nullptr, T, kHeads, kDim, wd.ptr, vd.ptr, bd.ptr, td.ptr, kf, N,
                                          out.f32());
            });
        };
        const float ms_tc = run(true, tc), ms_st = run(false, st);
        cuda::index_scores_decode_use_mma(true);
        auto a = host(tc.f32(), static_cast<size_t>(T) * N), b = host(st.f32(), static_cast<size_t>(T) * N);
        for (int t = 0; t < T; ++t) {
            const int64_t v = visible[static_cast<size_t>(t)];
            EXPECT_EQ(a[static_cast<size_t>(t * N + N - 1)], v < N ? -INFINITY : b[static_cast<size_t>(t * N + N - 1)])
                << "row " << t;
            if (v < N) {
                EXPECT_EQ(a[static_cast<size_t>(t * N + v)], -INFINITY) << "row " << t;
            }
        }
        compare_scores(a, b, "index_scores decode tensor cores vs stream " + std::to_string(T) + "x131072");
        if (T <= 8) {  // the exact kernel's ~9 ms per 8 rows
            Tensor ex = cuda::empty(DType::F32, {T, N});
            cuda::index_scores(q.ptr, w.ptr, T, kHeads, kDim, wd.ptr, vd.ptr, bd.ptr, td.ptr, kf, N, ex.f32());
            compare_scores(a, host(ex.f32(), static_cast<size_t>(T) * N),
                           "index_scores decode tensor cores vs exact " + std::to_string(T) + "x131072");
        }
        const double gb = static_cast<double>(T) * N * kf.bytes / 1e9;
        std::printf(
            "PARITY attn index_scores decode %dx131072: tensor cores %.3f ms (%.0f GB/s of keys), stream %.3f ms (%.0f GB/s)\n",
            T, ms_tc, gb / (ms_tc * 1e-3), ms_st, gb / (ms_st * 1e-3));
    }
}

// One sequence's prefill indexer inputs: N fp4 keys (table entry j is packed entry j ^ perm), T rows of kHeads
// fp4 queries with their weights, row t seeing the first N - T + t + 1 keys (causal, the new rows last), and the
// bf16 copies of queries and keys that the tensor-core scorers read.
struct PrefillIndex {
    const int T;
    const int64_t N;
    const EntryFormat kf = fp4_entry_format(kDim, 32, false);  // the indexer keys' state entries
    DevArray<uint8_t> kd;
    DevArray<const uint8_t*> td;
    DevArray<float> q, w;
    DevArray<int64_t> vd;
    std::shared_ptr<void> qb, kb;
    PrefillIndex(int rows, int64_t keys, uint64_t seed, int64_t perm) : T(rows), N(keys) {
        kd = cuda::upload(peregrine::test::pack_entries(fp4_rows(N, kDim, seed), N, kf));
        std::vector<const uint8_t*> table(static_cast<size_t>(N));
        for (int64_t j = 0; j < N; ++j) table[static_cast<size_t>(j)] = kd.ptr + (j ^ perm) * kf.bytes;
        td = cuda::upload(table);
        q = cuda::upload(fp4_rows(static_cast<int64_t>(T) * kHeads, kDim, seed + 1));
        w = cuda::upload(weights(T, seed + 2));
        std::vector<int64_t> visible(static_cast<size_t>(T));
        for (int t = 0; t < T; ++t) visible[static_cast<size_t>(t)] = N - T + t + 1;
        vd = cuda::upload(visible);
        qb = cuda::device_alloc(sizeof(uint16_t) * T * kHeads * kDim);
        kb = cuda::device_alloc(sizeof(uint16_t) * N * kDim);
        to_bf16();
    }
    void to_bf16() const {  // the copies, as the backend makes them per step
        cuda::to_bf16(q.ptr, static_cast<int64_t>(T) * kHeads * kDim, static_cast<uint16_t*>(qb.get()));
        cuda::gather_keys_bf16(td.ptr, N, kf, static_cast<uint16_t*>(kb.get()));
    }
    // index_scores_mma over `tiles` (first row, rows, first key, keys) into scores [T, N].
    void score(const DevArray<int64_t>& tiles, int n_tiles, float* scores) const {
        cuda::index_scores_mma(static_cast<const uint16_t*>(qb.get()), w.ptr, kHeads, tiles.ptr, n_tiles,
                               static_cast<const uint16_t*>(kb.get()), vd.ptr, N, scores);
    }
};

TEST(CudaAttnFast, IndexScoresPrefillTensorCores) {
    REQUIRE_GPU();
    const int T = 4096;
    const int64_t N = 65536;
    const PrefillIndex in(T, N, 21, 1);
    const EntryFormat& kf = in.kf;
    const auto& td = in.td;
    const auto& vd = in.vd;
    const auto &q = in.q, &w = in.w;
    // One sequence: 4096 new tokens at the end of 65536 entries.
    std::vector<int64_t> width(T, N), keybase(T, 0);
    auto wd = cuda::upload(width), bd = cuda::upload(keybase);
    std::vector<int64_t> tiles;
    for (int r = 0; r < T; r += 64) tiles.insert(tiles.end(), {r, std::min(64, T - r), 0, N});
    auto tiles_d = cuda::upload(tiles);
    const int n_tiles = static_cast<int>(tiles.size() / 4);
    Tensor mma = cuda::empty(DType::F32, {T, N}), stream = cuda::empty(DType::F32, {T, N}),
           wg = cuda::empty(DType::F32, {T, N});
    float ms_kernel[2];
    for (int v = 0; v < 2; ++v) {  // mma.sync, then wgmma
        cuda::index_scores_use_wgmma(v == 1);
        ms_kernel[v] = peregrine::test::device_ms([&] { in.score(tiles_d, n_tiles, (v ? wg : mma).f32()); });
    }
    const float ms_mma = peregrine::test::device_ms([&] {
        in.to_bf16();
        in.score(tiles_d, n_tiles, wg.f32());
    });
    const float ms_stream = peregrine::test::device_ms([&] {
        cuda::index_scores_stream(q.ptr, w.ptr, nullptr, T, kHeads, kDim, wd.ptr, vd.ptr, bd.ptr, td.ptr, kf, N,
                                  stream.f32());
    });
    auto m = host(mma.f32(), static_cast<size_t>(T) * N), s = host(stream.f32(), static_cast<size_t>(T) * N);
    compare_scores(m, s, "index_scores_mma vs stream 4096x65536");
    auto mw = host(wg.f32(), static_cast<size_t>(T) * N);
    compare_scores(mw, s, "index_scores_wgmma vs stream 4096x65536");
    size_t differ = 0;
    for (size_t i = 0; i < mw.size(); ++i) differ += mw[i] != m[i] && !(std::isnan(mw[i]) && std::isnan(m[i]));
    std::printf("PARITY attn index_scores_wgmma vs mma.sync 4096x65536: %zu of %zu scores differ\n", differ, mw.size());
    EXPECT_EQ(differ, 0u);  // the same per-head roundings and head order: the same bits
    m = mw;
    // The exact kernel on the first and last 64 rows (all of it would take seconds).
    const int sub = 64;
    Tensor ex = cuda::empty(DType::F32, {2 * sub, N});
    float ms_exact = 0.0f;
    for (int part = 0; part < 2; ++part) {
        const int r0 = part == 0 ? 0 : T - sub;
        ms_exact += peregrine::test::device_ms([&] {
            cuda::index_scores(q.ptr + static_cast<int64_t>(r0) * kHeads * kDim, w.ptr + r0 * kHeads, sub, kHeads, kDim,
                               wd.ptr + r0, vd.ptr + r0, bd.ptr + r0, td.ptr, kf, N, ex.f32() + part * sub * N);
        });
    }
    auto e = host(ex.f32(), static_cast<size_t>(2 * sub) * N);
    std::vector<float> msub(m.begin(), m.begin() + sub * N);
    msub.insert(msub.end(), m.end() - sub * N, m.end());
    compare_scores(msub, e, "index_scores_wgmma vs exact 2x64 rows of 4096x65536");
    const double tflop = 2.0 * T * N * kHeads * kDim / 1e12;
    std::printf("PARITY attn index_scores 4096x65536 mma.sync %.3f ms (%.0f TFLOP/s) wgmma %.3f ms (%.0f TFLOP/s); "
                "wgmma with bf16 staging %.3f ms; stream %.3f ms; exact %.3f ms for 128 rows (~%.0f ms for all)\n",
                ms_kernel[0], tflop / (ms_kernel[0] * 1e-3), ms_kernel[1], tflop / (ms_kernel[1] * 1e-3), ms_mma,
                ms_stream, ms_exact, ms_exact * T / (2 * sub));
}

// Tiles with fewer than 64 rows (down to 3, fewer than the 8 rows a thread's query copies step by) and a key
// count that is not a multiple of the key tile: the wgmma kernel against the mma.sync one, bit for bit.
TEST(CudaAttnFast, IndexScoresPrefillRaggedTiles) {
    REQUIRE_GPU();
    const int T = 131;
    const int64_t N = 2000;
    const PrefillIndex in(T, N, 31, 0);
    auto tiles_d = cuda::upload(std::vector<int64_t>{0, 64, 0, N, 64, 64, 0, N, 128, 3, 0, N});
    std::vector<float> out[2];
    for (int v = 0; v < 2; ++v) {  // mma.sync, then wgmma
        Tensor s = cuda::empty(DType::F32, {T, N});
        cuda::index_scores_use_wgmma(v == 1);
        in.score(tiles_d, 3, s.f32());
        out[v] = host(s.f32(), static_cast<size_t>(T) * N);
    }
    cuda::index_scores_use_wgmma(true);
    size_t differ = 0, finite = 0;
    for (size_t i = 0; i < out[0].size(); ++i) {
        differ += std::memcmp(&out[0][i], &out[1][i], sizeof(float)) != 0;
        finite += std::isfinite(out[1][i]);
    }
    EXPECT_EQ(differ, 0u);
    EXPECT_EQ(finite, static_cast<size_t>(T) * (N - T) + static_cast<size_t>(T) * (T + 1) / 2);
    std::printf("PARITY attn index_scores_wgmma vs mma.sync ragged tiles 64+64+3 x 2000 keys: %zu of %zu differ\n",
                differ, out[0].size());
}

// Scores as the scorer writes them: bf16 values with many ties, -inf beyond `visible`.
std::vector<float> tied_scores(int64_t T, int64_t N, const std::vector<int64_t>& visible, uint64_t seed) {
    std::vector<float> v(static_cast<size_t>(T * N));
    std::mt19937_64 g(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < N; ++j)
            v[static_cast<size_t>(t * N + j)] =
                j < visible[static_cast<size_t>(t)] ? round_bf16(std::round(n(g) * 64.0f) / 64.0f) : -INFINITY;
    return v;
}

void check_topk(int64_t T, int64_t N, int k, bool ascending, const std::string& shape) {
    std::vector<int64_t> width(static_cast<size_t>(T), N), visible(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) visible[static_cast<size_t>(t)] = std::max<int64_t>(1, N - (t * 37) % (N / 2));
    auto s = cuda::upload(tied_scores(T, N, visible, 5 + T));
    auto wd = cuda::upload(width), vd = cuda::upload(visible);
    auto tmp = cuda::device_alloc(sizeof(int32_t) * T * k);
    auto of = cuda::device_alloc(sizeof(int32_t) * T * k), oe = cuda::device_alloc(sizeof(int32_t) * T * k);
    auto cf = cuda::device_alloc(sizeof(int32_t) * T), ce = cuda::device_alloc(sizeof(int32_t) * T);
    const float ms_fast = peregrine::test::device_ms([&] {
        cuda::topk_rows_fast(s.ptr, T, N, wd.ptr, vd.ptr, k, ascending, static_cast<int32_t*>(tmp.get()),
                             static_cast<int32_t*>(of.get()), static_cast<int32_t*>(cf.get()));
    });
    const float ms_exact = peregrine::test::device_ms([&] {
        cuda::topk_rows(s.ptr, T, N, wd.ptr, vd.ptr, k, ascending, static_cast<int32_t*>(tmp.get()),
                        static_cast<int32_t*>(oe.get()), static_cast<int32_t*>(ce.get()));
    });
    auto counts = host(static_cast<int32_t*>(cf.get()), T);
    EXPECT_EQ(counts, host(static_cast<int32_t*>(ce.get()), T)) << shape;
    auto a = host(static_cast<int32_t*>(of.get()), static_cast<size_t>(T * k));
    auto b = host(static_cast<int32_t*>(oe.get()), static_cast<size_t>(T * k));
    // Only the first count[t] entries of a row are written (and read: build_keys stops at the count).
    int64_t diff = 0;
    for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(counts[static_cast<size_t>(t)], std::min<int64_t>(k, N)) << shape << " row " << t;
        for (int32_t i = 0; i < counts[static_cast<size_t>(t)]; ++i)
            diff += a[static_cast<size_t>(t * k + i)] != b[static_cast<size_t>(t * k + i)];
    }
    EXPECT_EQ(diff, 0) << shape;
    std::printf("PARITY attn topk_rows %s k=%d %s identical %s fast %.3f ms exact %.3f ms\n", shape.c_str(), k,
                ascending ? "by index" : "by value", diff == 0 ? "yes" : "NO", ms_fast, ms_exact);
}

TEST(CudaAttnFast, TopKSameSelection) {
    REQUIRE_GPU();
    check_topk(8, 131072, kTopK, true, "8x131072");
    check_topk(32, 131072, kTopK, false, "32x131072");
    check_topk(4096, 65536, kTopK, true, "4096x65536");
    check_topk(5, 300, kTopK, true, "5x300 (k > width)");
}

// The tie cases of test_cuda_backend's radix test (-0/+0, -inf, widths around k) against the CPU order.
TEST(CudaAttnFast, TopKMatchesStableSortOnTies) {
    REQUIRE_GPU();
    const int T = 5, k = 37;
    const int64_t widths[T] = {1, 36, 37, 1000, 70000};
    const int64_t stride = 70000;
    std::vector<float> scores(static_cast<size_t>(T * stride), -INFINITY);
    std::mt19937 g(7);
    for (int t = 0; t < T; ++t)
        for (int64_t j = 0; j < widths[t]; ++j) {
            const int v = static_cast<int>(g() % 9);
            scores[static_cast<size_t>(t * stride + j)] = v == 0   ? -0.0f
                                                          : v == 1 ? -INFINITY
                                                                   : static_cast<float>(v % 4);
        }
    std::vector<int64_t> w(widths, widths + T), vis(w);
    vis[3] = 500;
    for (bool asc : {false, true}) {
        auto s = cuda::upload(scores);
        auto wd = cuda::upload(w), vd = cuda::upload(vis);
        auto tmp = cuda::upload(std::vector<int32_t>(static_cast<size_t>(T * k), -7));
        auto out = cuda::upload(std::vector<int32_t>(static_cast<size_t>(T * k), -7));
        auto cnt = cuda::upload(std::vector<int32_t>(static_cast<size_t>(T), -7));
        cuda::topk_rows_fast(s.ptr, T, stride, wd.ptr, vd.ptr, k, asc, tmp.ptr, out.ptr, cnt.ptr);
        auto o = host(out.ptr, static_cast<size_t>(T * k));
        auto c = host(cnt.ptr, static_cast<size_t>(T));
        for (int t = 0; t < T; ++t) {
            auto ref = cpu::topk_desc(scores.data() + t * stride, static_cast<int>(w[static_cast<size_t>(t)]), k);
            if (asc) std::sort(ref.begin(), ref.end());
            ASSERT_EQ(c[static_cast<size_t>(t)], static_cast<int32_t>(ref.size())) << "row " << t;
            for (size_t i = 0; i < ref.size(); ++i)
                EXPECT_EQ(o[static_cast<size_t>(t * k) + i], ref[i] < vis[static_cast<size_t>(t)] ? ref[i] : -1)
                    << "row " << t << " slot " << i << (asc ? " ascending" : " descending");
        }
    }
    std::printf("PARITY attn topk_rows_fast == stable sort (ties, -0, -inf, 70000 wide): checked\n");
}

TEST(CudaAttnFast, CandidateBlocksSameMask) {
    REQUIRE_GPU();
    const int bs = 8, topb = 2048;
    for (auto [T, N] : {std::pair<int64_t, int64_t>{8, 131072}, {1024, 65536}}) {
        std::vector<int64_t> width(static_cast<size_t>(T), N), visible(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) visible[static_cast<size_t>(t)] = N - (t * 13) % 4096;
        auto s = cuda::upload(tied_scores(T, N, visible, 77));
        auto wd = cuda::upload(width), vd = cuda::upload(visible);
        const int64_t nb = (N + bs - 1) / bs;
        auto bscore = cuda::device_alloc(sizeof(float) * T * nb), bsel = cuda::device_alloc(sizeof(int32_t) * T * nb);
        const int64_t ms = cuda::candidate_mask_stride(N, bs);  // a bit per block
        auto mf = cuda::device_alloc(static_cast<size_t>(T * ms)), me = cuda::device_alloc(static_cast<size_t>(T * ms));
        const float ms_fast = peregrine::test::device_ms([&] {
            cuda::candidate_blocks_fast(s.ptr, T, N, wd.ptr, vd.ptr, bs, topb, static_cast<float*>(bscore.get()),
                                        static_cast<int32_t*>(bsel.get()), nb, static_cast<uint8_t*>(mf.get()), ms);
        });
        const float ms_exact = peregrine::test::device_ms([&] {
            cuda::candidate_blocks(s.ptr, T, N, wd.ptr, vd.ptr, bs, topb, static_cast<float*>(bscore.get()),
                                   static_cast<int32_t*>(bsel.get()), nb, static_cast<uint8_t*>(me.get()), ms);
        });
        auto a = host(static_cast<uint8_t*>(mf.get()), static_cast<size_t>(T * ms));
        auto b = host(static_cast<uint8_t*>(me.get()), static_cast<size_t>(T * ms));
        EXPECT_TRUE(a == b) << T << "x" << N;
        // Against the reference's rule on the host: the top 2048 blocks by max score (the last visible block
        // forced in, ties to the lower block), picks of -inf dropped; rows 0 and T-1.
        for (int64_t t : {int64_t{0}, T - 1}) {
            auto sc = host(s.ptr + t * N, static_cast<size_t>(N));
            const int64_t vis = visible[static_cast<size_t>(t)], last = (vis - 1) / bs;
            std::vector<float> bmax(static_cast<size_t>(nb), -INFINITY);
            for (int64_t j = 0; j < N; ++j)
                bmax[static_cast<size_t>(j / bs)] =
                    std::max(bmax[static_cast<size_t>(j / bs)], sc[static_cast<size_t>(j)]);
            bmax[static_cast<size_t>(last)] = INFINITY;
            std::vector<int64_t> order(static_cast<size_t>(nb));
            for (int64_t i = 0; i < nb; ++i) order[static_cast<size_t>(i)] = i;
            std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
                return bmax[static_cast<size_t>(x)] > bmax[static_cast<size_t>(y)];
            });
            std::vector<uint8_t> want(static_cast<size_t>(ms), 0);
            for (int i = 0; i < std::min<int64_t>(topb, nb); ++i)
                if (bmax[static_cast<size_t>(order[static_cast<size_t>(i)])] > -INFINITY)
                    want[static_cast<size_t>(order[static_cast<size_t>(i)] / 8)] |=
                        static_cast<uint8_t>(1u << (order[static_cast<size_t>(i)] % 8));
            EXPECT_TRUE(std::equal(want.begin(), want.end(), a.begin() + t * ms))
                << "row " << t << " of " << T << "x" << N;
        }
        std::printf(
            "PARITY attn candidate_blocks %ldx%ld (8-entry blocks, top 2048) identical %s fast %.3f ms exact %.3f ms\n",
            static_cast<long>(T), static_cast<long>(N), a == b ? "yes" : "NO", ms_fast, ms_exact);
    }
}

// Routing: score functions softmax / sigmoid / sqrt-softplus with a selection bias, and hash routing.
TEST(CudaAttnFast, RouteSameSelectionAndWeights) {
    REQUIRE_GPU();
    const int64_t T = 4096;
    const int E = 384, K = 6;
    std::vector<float> logits(static_cast<size_t>(T * E)), bias(static_cast<size_t>(E));
    std::mt19937_64 g(3);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (auto& x : logits) x = round_bf16(n(g)) * 0.25f;
    for (auto& x : bias) x = n(g) * 0.01f;
    std::vector<int64_t> tid2eid(static_cast<size_t>(1000 * K));
    for (size_t i = 0; i < tid2eid.size(); ++i) tid2eid[i] = static_cast<int64_t>((i * 7919) % E);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) ids[static_cast<size_t>(t)] = static_cast<int32_t>((t * 31) % 1000);
    auto ld = cuda::upload(logits), bd = cuda::upload(bias);
    auto hd = cuda::upload(tid2eid);
    auto idd = cuda::upload(ids);
    auto sf = cuda::device_alloc(sizeof(int32_t) * T * K), se = cuda::device_alloc(sizeof(int32_t) * T * K);
    auto wf = cuda::device_alloc(sizeof(float) * T * K), we = cuda::device_alloc(sizeof(float) * T * K);
    struct Case {
        const char* name;
        int score_func;
        bool bias, hash;
        RouteNorm norm;
    };
    for (Case c : {Case{"sqrtsoftplus+bias (v4.1)", 2, true, false, RouteNorm::kSumIfSeveral},
                   Case{"sigmoid+bias (v4)", 1, true, false, RouteNorm::kSum},
                   Case{"softmax", 0, false, false, RouteNorm::kNone},
                   Case{"hash (tid2eid)", 2, false, true, RouteNorm::kSumIfSeveral}}) {
        auto call = [&](bool fast, void* s, void* w) {
            (fast ? cuda::route_fast : cuda::route)(ld.ptr, T, E, K, c.score_func, c.bias ? bd.ptr : nullptr,
                                                   c.hash ? hd.ptr : nullptr, idd.ptr, static_cast<int>(c.norm), 2.5f, false,
                                                   static_cast<int32_t*>(s), static_cast<float*>(w));
        };
        const float ms_fast = peregrine::test::device_ms([&] { call(true, sf.get(), wf.get()); });
        const float ms_exact = peregrine::test::device_ms([&] { call(false, se.get(), we.get()); });
        auto a = host(static_cast<int32_t*>(sf.get()), static_cast<size_t>(T * K));
        auto b = host(static_cast<int32_t*>(se.get()), static_cast<size_t>(T * K));
        auto x = host(static_cast<float*>(wf.get()), static_cast<size_t>(T * K));
        auto y = host(static_cast<float*>(we.get()), static_cast<size_t>(T * K));
        EXPECT_EQ(a, b) << c.name;
        EXPECT_EQ(x, y) << c.name;
        std::printf("PARITY attn route %s 4096x384 top-6 identical %s fast %.3f ms exact %.3f ms\n", c.name,
                    a == b && x == y ? "yes" : "NO", ms_fast, ms_exact);
    }
}

// The batched compressor (all sequences in one launch, parallel over channels) and the parallel one (tokens in
// parallel too, from the host's jobs) against the per-sequence kernel: 8 decode sequences and one 4096-token
// prefill, the V4.1 shapes (ratio 4 with overlap, ratio 128), 512-wide latents, random old carries; pooled
// latents, new carries and page snapshots must be identical.
TEST(CudaAttnFast, CompressorBatchSameAsSequential) {
    REQUIRE_GPU();
    const int d = 512, page_tokens = 64;
    for (auto [ratio, overlap] : {std::pair<int, bool>{4, true}, {128, false}}) {
        const int coff = overlap ? 2 : 1, width = coff * d, slots = coff * ratio;
        const int64_t carry = 2LL * slots * width;
        struct Seq {
            int64_t start;
            int n, row0;
        };
        std::vector<Seq> seqs;
        int T = 0;
        for (int s = 0; s < 8; ++s, ++T) seqs.push_back({1000LL * s + 3 * s + 123, 1, T});
        seqs.push_back({8192 + 5, 4096, T});
        T += 4096;
        std::mt19937_64 g(ratio);
        std::normal_distribution<float> n(0.0f, 1.0f);
        auto rnd = [&](size_t k) {
            std::vector<float> v(k);
            for (auto& x : v) x = round_bf16(n(g));
            return v;
        };
        auto kv = cuda::upload(rnd(static_cast<size_t>(T) * width));
        auto score = cuda::upload(rnd(static_cast<size_t>(T) * width));
        auto ape = cuda::upload(rnd(static_cast<size_t>(ratio) * width));
        auto carries = rnd(seqs.size() * carry);
        // Emissions and snapshot slots in sequence order.
        std::vector<int64_t> meta;
        std::vector<int> emit_base;
        int emits = 0, snaps = 0;
        std::vector<int> snap_first;
        for (size_t s = 0; s < seqs.size(); ++s) {
            emit_base.push_back(emits);
            snap_first.push_back(snaps);
            for (int i = 0; i < seqs[s].n; ++i) {
                emits += (seqs[s].start + i + 1) % ratio == 0;
                ++snaps;
            }
            meta.insert(meta.end(), {seqs[s].start, seqs[s].n, seqs[s].row0, emit_base.back(),
                                     static_cast<int64_t>(s) * carry, snap_first.back()});
        }
        auto snap_area = [&](Tensor& area) {  // per token: a snapshot buffer at page ends, else null
            int64_t count = 0;
            for (auto& q : seqs)
                for (int i = 0; i < q.n; ++i) count += (q.start + i + 1) % page_tokens == 0;
            area = cuda::empty(DType::F32, {std::max<int64_t>(count, 1), carry});
            std::vector<float*> ptrs;
            int64_t k = 0;
            for (auto& q : seqs)
                for (int i = 0; i < q.n; ++i)
                    ptrs.push_back((q.start + i + 1) % page_tokens == 0 ? area.f32() + carry * k++ : nullptr);
            return ptrs;
        };
        Tensor area_e, area_f, area_p;
        auto snap_e = cuda::upload(snap_area(area_e)), snap_f = cuda::upload(snap_area(area_f));
        const std::vector<float*> snap_p = snap_area(area_p);
        Tensor pooled_e = cuda::empty(DType::F32, {std::max(emits, 1), d});
        Tensor pooled_f = cuda::empty(DType::F32, {std::max(emits, 1), d});
        Tensor pooled_p = cuda::empty(DType::F32, {std::max(emits, 1), d});
        auto state_e = cuda::upload(carries), state_f = cuda::upload(carries);
        auto state_p = cuda::upload(carries);
        auto meta_d = cuda::upload(meta);
        cuda::CompressorArgs base;
        base.kv = kv.ptr;
        base.score = score.ptr;
        base.ape = ape.ptr;
        base.ratio = ratio;
        base.d = d;
        base.overlap = overlap;
        // One call each (the state advances, so no warm-up): the exact kernel sequence by sequence.
        auto run_exact = [&] {
            for (size_t s = 0; s < seqs.size(); ++s) {
                cuda::CompressorArgs a = base;
                a.state = state_e.ptr + static_cast<int64_t>(s) * carry;
                a.pooled = pooled_e.f32();
                a.emit_base = emit_base[s];
                a.start_pos = seqs[s].start;
                a.n_tokens = seqs[s].n;
                a.row0 = seqs[s].row0;
                a.snapshot = snap_e.ptr + snap_first[s];
                cuda::compressor_seq(a);
            }
        };
        auto run_fast = [&] {
            cuda::CompressorArgs a = base;
            a.state = state_f.ptr;
            a.pooled = pooled_f.f32();
            a.snapshot = snap_f.ptr;
            cuda::compressor_batch(a, static_cast<int>(seqs.size()), meta_d.ptr);
        };
        // The parallel form (prefill), from the host's jobs.
        const cuda::CompressorJobs jobs =
            cuda::compressor_jobs(meta.data(), static_cast<int>(seqs.size()), ratio, snap_p.data());
        auto emit_d = cuda::upload(jobs.emit), carry_d = cuda::upload(jobs.carry);
        auto dest_d = cuda::upload(jobs.dest);
        auto run_parallel = [&] {
            cuda::CompressorArgs a = base;
            a.state = state_p.ptr;
            a.pooled = pooled_p.f32();
            cuda::compressor_parallel(a, static_cast<int>(seqs.size()), meta_d.ptr, emit_d.ptr,
                                      static_cast<int64_t>(jobs.emit.size() / 2), carry_d.ptr, dest_d.ptr,
                                      static_cast<int64_t>(jobs.dest.size()));
        };
        const float ms_exact = static_cast<float>(test::device_ms(run_exact, 1, 0));
        const float ms_fast = static_cast<float>(test::device_ms(run_fast, 1, 0));
        const float ms_par = static_cast<float>(test::device_ms(run_parallel, 1, 0));
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        const auto pooled_x = host(pooled_e.f32(), static_cast<size_t>(emits) * d);
        const auto state_x = host(state_e.ptr, carries.size());
        const auto snap_x = host(area_e.f32(), static_cast<size_t>(area_e.numel()));
        for (auto [name, pooled, state, area, ms] : {std::tuple{"batch", &pooled_f, state_f.ptr, &area_f, ms_fast},
                                                     std::tuple{"parallel", &pooled_p, state_p.ptr, &area_p, ms_par}}) {
            const bool pooled_same = host(pooled->f32(), static_cast<size_t>(emits) * d) == pooled_x;
            const bool state_same = host(state, carries.size()) == state_x;
            const bool snap_same = host(area->f32(), static_cast<size_t>(area->numel())) == snap_x;
            EXPECT_TRUE(pooled_same && state_same && snap_same) << "ratio " << ratio << " " << name;
            std::printf(
                "PARITY attn compressor %s ratio %d%s d=512, 8 decode + 1x4096 prefill: pooled %s carry %s snapshots %s"
                " %.3f ms (exact %.3f ms)\n",
                name, ratio, overlap ? " overlap" : "", pooled_same ? "same" : "DIFFER", state_same ? "same" : "DIFFER",
                snap_same ? "same" : "DIFFER", ms, ms_exact);
        }
    }
}

// hc mixes at V4.1-Flash's hc 4 x dim 5120 (24 mixes, 20 Sinkhorn iterations): the FP64 tensor-core kernel against
// the block-per-token one. Both sum in double, in different orders, so the float results agree to an ulp or so.
TEST(CudaAttnFast, HcMixesSplitMatchesExact) {
    REQUIRE_GPU();
    const int hc = 4, D = 5120, W = hc * D, n_mix = 24, iters = 20;
    std::mt19937_64 g(17);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> fn(static_cast<size_t>(n_mix) * W), base(n_mix), scale = {0.5f, 0.7f, 0.9f};
    for (auto& x : fn) x = n(g) * 0.01f;
    for (auto& x : base) x = n(g) * 0.1f;
    auto fd = cuda::upload(fn), bd = cuda::upload(base), sd = cuda::upload(scale);
    for (int64_t T : {8, 1023, 1025, 4096}) {  // partial 32-token tiles, and column splits from 264 down to 3
        std::vector<float> h(static_cast<size_t>(T) * W);
        for (auto& x : h) x = round_bf16(n(g));
        auto hd = cuda::upload(h);
        Tensor out[2][3];
        float ms[2];
        for (int k = 0; k < 2; ++k) {
            out[k][0] = cuda::empty(DType::F32, {T, hc});
            out[k][1] = cuda::empty(DType::F32, {T, hc});
            out[k][2] = cuda::empty(DType::F32, {T, hc * hc});
            ms[k] = peregrine::test::device_ms([&] {
                (k == 0 ? cuda::hc_mixes_fast : cuda::hc_mixes)(hd.ptr, T, hc, D, fd.ptr, n_mix, bd.ptr, sd.ptr, 1e-6f,
                                                                1e-6f, iters, 0, out[k][0].f32(), out[k][1].f32(),
                                                                out[k][2].f32());
            });
        }
        float worst = 0.0f;
        int64_t equal = 0, total = 0;
        for (int i = 0; i < 3; ++i) {
            auto a = cuda::to_host(out[0][i]), b = cuda::to_host(out[1][i]);
            for (int64_t e = 0; e < a.numel(); ++e) {
                const float x = a.f32()[e], y = b.f32()[e];
                equal += x == y;
                ++total;
                worst = std::max(worst, std::fabs(x - y) / std::max(std::fabs(y), 1e-6f));
            }
        }
        EXPECT_LE(worst, 1e-5f) << "T=" << T;
        std::printf("PARITY attn hc_mixes %ldx(4x5120) 24 mixes fast %.3f ms exact %.3f ms, max rel |d| %.3g equal %.4f"
                    " (tol 1e-5 rel)\n",
                    static_cast<long>(T), ms[0], ms[1], worst, static_cast<double>(equal) / total);
    }
}

// hc_expand with four channels of every copy a thread: bit for bit the plain kernel's output.
TEST(CudaAttnFast, HcExpandVectorisedSameOutput) {
    REQUIRE_GPU();
    const int hc = 4, D = 5120;
    for (int64_t T : {8, 4096}) {
        std::mt19937_64 g(31 + T);
        std::normal_distribution<float> n(0.0f, 1.0f);
        std::vector<float> y(static_cast<size_t>(T) * D), res(static_cast<size_t>(T) * hc * D),
            post(static_cast<size_t>(T) * hc), comb(static_cast<size_t>(T) * hc * hc);
        for (auto& x : y) x = round_bf16(n(g));
        for (auto& x : res) x = round_bf16(n(g));
        for (auto& x : post) x = 2.0f / (1.0f + std::exp(-n(g)));
        for (auto& x : comb) x = std::fabs(n(g)) * 0.25f;
        auto yd = cuda::upload(y), rd = cuda::upload(res), pd = cuda::upload(post),
             cd = cuda::upload(comb);
        Tensor of = cuda::empty(DType::F32, {T, hc, D}), oe = cuda::empty(DType::F32, {T, hc, D});
        const float ms_fast = peregrine::test::device_ms(
            [&] { cuda::hc_expand_fast(yd.ptr, rd.ptr, pd.ptr, cd.ptr, T, hc, D, of.f32()); });
        const float ms_exact =
            peregrine::test::device_ms([&] { cuda::hc_expand(yd.ptr, rd.ptr, pd.ptr, cd.ptr, T, hc, D, oe.f32()); });
        auto a = host(of.f32(), static_cast<size_t>(T) * hc * D), b = host(oe.f32(), static_cast<size_t>(T) * hc * D);
        int64_t diff = 0;
        for (size_t i = 0; i < a.size(); ++i) diff += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
        EXPECT_EQ(diff, 0) << "T=" << T;
        const double gb = static_cast<double>(T) * D * (1 + 2 * hc) * 4 / 1e9;
        std::printf("PARITY attn hc_expand %ldx(4x5120) identical %s fast %.3f ms (%.0f GB/s) exact %.3f ms\n",
                    static_cast<long>(T), diff == 0 ? "yes" : "NO", ms_fast, gb / (ms_fast * 1e-3), ms_exact);
    }
}

// Sparse attention at 64 heads x 512 over 128 window + 512 selected keys: the warp softmax gives the exact
// kernel's output bit for bit.
TEST(CudaAttnFast, SparseAttentionWarpSoftmaxSameOutput) {
    REQUIRE_GPU();
    const int H = 64, Dh = 512, maxk = 640;
    for (int64_t T : {8, 256}) {
        std::mt19937_64 g(29 + T);
        std::normal_distribution<float> n(0.0f, 1.0f);
        const int64_t nk = 4096;
        std::vector<float> q(static_cast<size_t>(T * H * Dh)), kv(static_cast<size_t>(nk * Dh)),
            lat(static_cast<size_t>(nk * Dh)), sink(H);
        for (auto& x : q) x = round_bf16(n(g));
        for (auto& x : kv) x = round_bf16(n(g));
        for (auto& x : lat) x = round_bf16(n(g));
        for (auto& x : sink) x = n(g);
        // V4.1's entries: window K=V fp8 (ue8m0 per 32), compressed latents fp4 (e4m3 per 16).
        const EntryFormat wf = fp8_entry_format(Dh, Dh, 32), cf = fp4_entry_format(Dh, 16, true);
        for (int64_t r = 0; r < nk; ++r) {
            qdq_fp8(kv.data() + r * Dh, Dh, 32);
            qdq_fp4_e4m3(lat.data() + r * Dh, Dh, 16);
        }
        auto qd = cuda::upload(q), sd = cuda::upload(sink);
        auto wd = cuda::upload(peregrine::test::pack_entries(kv, nk, wf));
        auto cd = cuda::upload(peregrine::test::pack_entries(lat, nk, cf));
        std::vector<const uint8_t*> keys(static_cast<size_t>(T * maxk), nullptr);
        std::vector<int32_t> cnt(static_cast<size_t>(T)), nwin(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) {
            cnt[static_cast<size_t>(t)] = static_cast<int32_t>(maxk - (t * 7) % 100);
            nwin[static_cast<size_t>(t)] = static_cast<int32_t>(128 - t % 3);
            for (int j = 0; j < cnt[static_cast<size_t>(t)]; ++j) {
                const int64_t e = (t * 131 + j * 17) % nk;
                keys[static_cast<size_t>(t * maxk + j)] = (j % 50 == 7)                      ? nullptr
                                                          : j < nwin[static_cast<size_t>(t)] ? wd.ptr + e * wf.bytes
                                                                                             : cd.ptr + e * cf.bytes;
            }
        }
        auto keys_d = cuda::upload(keys);
        auto cnt_d = cuda::upload(cnt), nwin_d = cuda::upload(nwin);
        cuda::KeyRefs kr;
        kr.keys = keys_d.ptr;
        kr.nkeys = cnt_d.ptr;
        kr.nwin = nwin_d.ptr;
        kr.maxk = maxk;
        kr.win = wf;
        kr.comp = cf;
        Tensor of = cuda::empty(DType::F32, {T, H, Dh}), oe = cuda::empty(DType::F32, {T, H, Dh});
        const float scale = 1.0f / std::sqrt(static_cast<float>(Dh));
        const float ms_fast = peregrine::test::device_ms([&] {
            cuda::sparse_attention(qd.ptr, T, H, Dh, scale, sd.ptr, kr, of.f32(), true);
        });
        const float ms_exact = peregrine::test::device_ms([&] {
            cuda::sparse_attention(qd.ptr, T, H, Dh, scale, sd.ptr, kr, oe.f32(), false);
        });
        auto a = host(of.f32(), static_cast<size_t>(T * H * Dh)), b = host(oe.f32(), static_cast<size_t>(T * H * Dh));
        EXPECT_TRUE(a == b) << "T=" << T;
        std::printf("PARITY attn sparse_attention %ldx64x512 over 640 keys identical %s fast %.3f ms exact %.3f ms\n",
                    static_cast<long>(T), a == b ? "yes" : "NO", ms_fast, ms_exact);
    }
}

// RoPE and the quantise-dequantise of a row in one kernel (rope_qdq) against rope then qdq_rows, bit for bit, in
// every place the attention uses it: V4.1's window K=V (fp8, blocks of 32) and compressed latents (fp4 under e4m3
// scales, blocks of 16), indexer keys and queries (fp4, 32 heads x 128), V4's window (fp8 over the 448 non-RoPE
// dims, blocks of 64), and a shape the single kernel does not take (odd RoPE offset: the two kernels run).
TEST(CudaAttnFast, RopeQdqSameAsTwoKernels) {
    REQUIRE_GPU();
    struct Case {
        const char* what;
        int rows, heads, hs, rd, n, block, kind;
    };
    const Case cases[] = {{"v41 window kv fp8/32", 37, 1, 512, 64, 512, 32, 0},
                          {"v41 latent fp4 e4m3/16", 9, 1, 512, 64, 512, 16, 2},
                          {"indexer k fp4/32", 9, 1, 128, 64, 128, 32, 1},
                          {"indexer q 32 heads fp4/32", 40, 32, 128, 64, 128, 32, 1},
                          {"v4 window kv fp8/64 on 448", 37, 1, 512, 64, 448, 64, 0},
                          {"odd offset (two kernels)", 5, 1, 96, 62, 64, 32, 0}};
    std::mt19937_64 g(5);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> freqs(256);
    for (size_t k = 0; k < freqs.size(); ++k) freqs[k] = std::pow(10000.0f, -static_cast<float>(k) / 128.0f);
    auto fd = cuda::upload(freqs);
    for (const Case& c : cases) {
        const int64_t width = static_cast<int64_t>(c.heads) * c.hs;
        std::vector<float> x(static_cast<size_t>(c.rows * width));
        for (auto& v : x) v = round_bf16(n01(g) * std::ldexp(1.0f, static_cast<int>(g() % 12) - 6));
        std::vector<int64_t> pos(static_cast<size_t>(c.rows));
        for (auto& p : pos) p = static_cast<int64_t>(g() % 131072);
        auto pd = cuda::upload(pos);
        auto a = cuda::upload(x), b = cuda::upload(x);
        cuda::rope(a.ptr, c.rows, c.heads, width, c.hs, c.hs - c.rd, pd.ptr, fd.ptr, c.rd, false);
        cuda::qdq_rows(a.ptr, static_cast<int64_t>(c.rows) * c.heads, c.hs, c.n, c.block, c.kind);
        cuda::rope_qdq(b.ptr, c.rows, c.heads, width, c.hs, c.hs - c.rd, pd.ptr, fd.ptr, c.rd, false, c.n, c.block,
                       c.kind);
        std::vector<float> ha(x.size()), hb(x.size());
        ASSERT_EQ(cudaMemcpy(ha.data(), a.ptr, ha.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(hb.data(), b.ptr, hb.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        const bool same = std::memcmp(ha.data(), hb.data(), ha.size() * 4) == 0;
        EXPECT_TRUE(same) << c.what;
        std::printf("PARITY rope_qdq %-28s %s\n", c.what, same ? "bit-identical to rope + qdq_rows" : "DIFFERS");
    }
}

// rms_norm then rope_qdq of one-head rows in one kernel (rms_norm_rope_qdq) against the two kernels, bit for bit:
// V4.1's window K=V (fp8, blocks of 32) and compressed latents (fp4 under e4m3 scales, blocks of 16), indexer keys
// (fp4/32, 128 wide), V4's window (fp8/64 over 448 dims), and a shape the single kernel does not take (odd RoPE
// offset: the two kernels run).
TEST(CudaAttnFast, NormRopeQdqSameAsTwoKernels) {
    REQUIRE_GPU();
    struct Case {
        const char* what;
        int rows, D, rd, n, block, kind;
    };
    const Case cases[] = {{"v41 window kv fp8/32", 37, 512, 64, 512, 32, 0},
                          {"v41 latent fp4 e4m3/16", 9, 512, 64, 512, 16, 2},
                          {"indexer k fp4/32", 9, 128, 64, 128, 32, 1},
                          {"v4 window kv fp8/64 on 448", 37, 512, 64, 448, 64, 0},
                          {"odd offset (two kernels)", 5, 96, 62, 64, 32, 0}};
    std::mt19937_64 g(7);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> freqs(256);
    for (size_t k = 0; k < freqs.size(); ++k) freqs[k] = std::pow(10000.0f, -static_cast<float>(k) / 128.0f);
    auto fd = cuda::upload(freqs);
    for (const Case& c : cases) {
        std::vector<float> x(static_cast<size_t>(c.rows) * c.D), w(static_cast<size_t>(c.D));
        for (auto& v : x) v = round_bf16(n01(g) * std::ldexp(1.0f, static_cast<int>(g() % 12) - 6));
        for (auto& v : w) v = round_bf16(1.0f + 0.25f * n01(g));
        std::vector<int64_t> pos(static_cast<size_t>(c.rows));
        for (auto& p : pos) p = static_cast<int64_t>(g() % 131072);
        auto pd = cuda::upload(pos);
        auto xd = cuda::upload(x), wd = cuda::upload(w), a = cuda::upload(x), b = cuda::upload(x);
        const float eps = 1e-6f;
        cuda::rms_norm(xd.ptr, c.rows, c.D, wd.ptr, eps, a.ptr);
        cuda::rope_qdq(a.ptr, c.rows, 1, c.D, c.D, c.D - c.rd, pd.ptr, fd.ptr, c.rd, false, c.n, c.block, c.kind);
        cuda::rms_norm_rope_qdq(xd.ptr, c.rows, c.D, wd.ptr, eps, b.ptr, pd.ptr, fd.ptr, c.D - c.rd, c.rd, c.n,
                                c.block, c.kind);
        const std::vector<float> ha = host(a.ptr, x.size()), hb = host(b.ptr, x.size());
        const bool same = std::memcmp(ha.data(), hb.data(), ha.size() * 4) == 0;
        EXPECT_TRUE(same) << c.what;
        std::printf("PARITY norm_rope_qdq %-28s %s\n", c.what,
                    same ? "bit-identical to rms_norm + rope_qdq" : "DIFFERS");
    }
}

}  // namespace
