// The decode-sized mixes (hc_mixes_small, Numerics::Fast) against the FP64 tensor-core path (hc_mixes_fast) and
// the exact kernel (hc_mixes) at V4.1-Flash's shape (4 copies x 5120, 24 mixes; the V4 head's 4 mixes): all
// three form exact products of the fp32 inputs and sum them in double, each in its own order, so the outputs
// agree to a few ulps (almost always bit for bit). Repeated calls must give identical bits. Prints one PARITY line per check and the device time per call of each path.
// Also the fused collapse + norm of a sublayer's input against the two kernels, bit for bit.
#include "cuda_test_util.h"
#include "ops/cuda/kernels.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

using namespace peregrine;
using namespace peregrine::cuda;
using namespace peregrine::test;

namespace {

#define CK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

float bf16_round(float f) {  // round to nearest even, as the device's activations hold
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&f, &u, 4);
    return f;
}

struct Dev {
    void* p = nullptr;
    explicit Dev(size_t bytes) { cudaMalloc(&p, std::max<size_t>(bytes, 16)); }
    ~Dev() { cudaFree(p); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    float* f() const { return static_cast<float*>(p); }
};

std::vector<float> to_host(const float* d, size_t n) {
    std::vector<float> v(n);
    cudaMemcpy(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
}

// |a - b| <= rel |b| + abs for every element; prints the share of bit-equal ones.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, float rel, float abs, const char* what) {
    ASSERT_EQ(a.size(), b.size());
    size_t bad = 0, same = 0;
    float worst = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) {
        const float d = std::fabs(a[i] - b[i]);
        same += a[i] == b[i];
        if (!(d <= rel * std::fabs(b[i]) + abs)) ++bad;
        if (d > worst || std::isnan(d)) worst = d;
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << a.size() << " differ, worst " << worst;
    std::printf("PARITY hc %-40s max|d| %.3g exact %.4f\n", what, worst, a.empty() ? 1.0 : double(same) / a.size());
}

struct Case {
    int T, mode;
};

void run_case(const Case& c) {
    constexpr int hc = 4, D = 5120, W = hc * D;
    const int n_mix = c.mode == 0 ? (2 + hc) * hc : hc, iters = c.mode == 0 ? 20 : 0;
    const int T = c.T;
    std::mt19937_64 g(1000 + T * 7 + c.mode);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> h(static_cast<size_t>(T) * W), fn(static_cast<size_t>(n_mix) * W), base(n_mix), scale(3);
    for (auto& v : h) v = bf16_round(n01(g));
    for (auto& v : fn) v = n01(g) * 0.01f;  // fp32 weights: full 24-bit mantissas
    for (auto& v : base) v = n01(g) * 0.5f;
    for (auto& v : scale) v = 0.5f + 0.1f * n01(g);
    Dev dh(h.size() * 4), dfn(fn.size() * 4), dbase(base.size() * 4), dscale(scale.size() * 4);
    CK(cudaMemcpy(dh.p, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dfn.p, fn.data(), fn.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dbase.p, base.data(), base.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dscale.p, scale.data(), scale.size() * 4, cudaMemcpyHostToDevice));
    const size_t np = static_cast<size_t>(T) * hc, nc = static_cast<size_t>(T) * hc * hc;
    struct Out {
        Dev pre, post, comb;
        Out(size_t np, size_t nc) : pre(np * 4), post(np * 4), comb(nc * 4) {}
    };
    Out exact(np, nc), dmma(np, nc), small(np, nc), again(np, nc);
    ASSERT_TRUE(hc_mixes_small_supported(T, n_mix));
    Dev ws(hc_mixes_small_workspace(T, hc, D, n_mix));
    const float eps = 1e-6f, hc_eps = 1e-6f;
    auto outs = [&](Out& o, bool m0) {
        return m0 ? std::make_pair(o.post.f(), o.comb.f()) : std::make_pair((float*)nullptr, (float*)nullptr);
    };
    const bool m0 = c.mode == 0;
    auto run_exact = [&] {
        hc_mixes(dh.f(), T, hc, D, dfn.f(), n_mix, dbase.f(), dscale.f(), eps, hc_eps, iters, c.mode, exact.pre.f(),
                 outs(exact, m0).first, outs(exact, m0).second);
    };
    auto run_dmma = [&] {
        hc_mixes_fast(dh.f(), T, hc, D, dfn.f(), n_mix, dbase.f(), dscale.f(), eps, hc_eps, iters, c.mode, dmma.pre.f(),
                      outs(dmma, m0).first, outs(dmma, m0).second);
    };
    auto run_small = [&](Out& o) {
        hc_mixes_small(dh.f(), T, hc, D, dfn.f(), n_mix, dbase.f(), dscale.f(), eps, hc_eps, iters, c.mode, o.pre.f(),
                       outs(o, m0).first, outs(o, m0).second, ws.p);
    };
    run_exact();
    run_dmma();
    run_small(small);
    run_small(again);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    char what[96];
    auto cmp = [&](const char* name, Dev Out::*field, size_t n) {
        auto s = to_host((small.*field).f(), n), e = to_host((exact.*field).f(), n), gm = to_host((dmma.*field).f(), n),
             a = to_host((again.*field).f(), n);
        std::snprintf(what, sizeof what, "small vs exact T=%d mode=%d %s", T, c.mode, name);
        expect_close(s, e, 1e-5f, 1e-6f, what);
        std::snprintf(what, sizeof what, "small vs dmma T=%d mode=%d %s", T, c.mode, name);
        expect_close(s, gm, 1e-5f, 1e-6f, what);
        EXPECT_EQ(std::memcmp(s.data(), a.data(), n * 4), 0) << "repeated call differs: T=" << T << " " << name;
    };
    cmp("pre", &Out::pre, np);
    if (m0) {
        cmp("post", &Out::post, np);
        cmp("comb", &Out::comb, nc);
    }
    const double t_small = device_ms([&] { run_small(small); }, 20, 2);
    const double t_dmma = device_ms(run_dmma, 20, 2);
    const double t_exact = device_ms(run_exact, 5, 1);
    std::printf("hc_mixes T=%-3d mode=%d n_mix=%-2d: small %.1f us, fp64 tensor cores %.1f us, exact %.1f us\n",
                T, c.mode, n_mix, t_small * 1e3, t_dmma * 1e3, t_exact * 1e3);
}

TEST(CudaHcMixes, SmallMatchesTensorCoresAndExact) {
    REQUIRE_GPU();
    for (Case c : {Case{1, 0}, Case{2, 0}, Case{8, 0}, Case{32, 0}, Case{64, 0}, Case{1, 1}, Case{8, 1}, Case{64, 1}})
        run_case(c);
}

// The sublayer input in one kernel (collapse_norm) against hc_collapse then rms_norm: the same arithmetic, so
// the same bits, at V4.1-Flash's 4 copies x 5120 (rows longer than the registers' share too: 16384).
TEST(CudaHcCollapse, CollapseNormMatchesTwoKernels) {
    REQUIRE_GPU();
    std::mt19937_64 g(77);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (int D : {5120, 16384})
        for (int T : {1, 7, 64, 300}) {
            const int hc = 4;
            std::vector<float> h(static_cast<size_t>(T) * hc * D), pre(static_cast<size_t>(T) * hc),
                w(static_cast<size_t>(D));
            for (auto& v : h) v = bf16_round(n01(g));
            for (auto& v : pre) v = 0.5f + 0.25f * n01(g);
            for (auto& v : w) v = bf16_round(1.0f + 0.1f * n01(g));
            Dev dh(h.size() * 4), dp(pre.size() * 4), dw(w.size() * 4), x(static_cast<size_t>(T) * D * 4),
                two(static_cast<size_t>(T) * D * 4), one(static_cast<size_t>(T) * D * 4);
            CK(cudaMemcpy(dh.p, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dp.p, pre.data(), pre.size() * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dw.p, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
            hc_collapse(dh.f(), dp.f(), T, hc, D, x.f());
            rms_norm(x.f(), T, D, dw.f(), 1e-6f, two.f());
            collapse_norm(dh.f(), dp.f(), T, hc, D, dw.f(), 1e-6f, one.f());
            CK(cudaDeviceSynchronize());
            const auto a = to_host(two.f(), static_cast<size_t>(T) * D),
                       b = to_host(one.f(), static_cast<size_t>(T) * D);
            EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "T=" << T << " D=" << D;
            std::printf("PARITY hc collapse_norm vs hc_collapse + rms_norm T=%-4d D=%-5d %s\n", T, D,
                        std::memcmp(a.data(), b.data(), a.size() * 4) ? "DIFFER" : "bit-identical");
        }
}

}  // namespace
