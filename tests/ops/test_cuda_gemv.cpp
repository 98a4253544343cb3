// The memory-bound GEMV (linear_gemv, Numerics::Fast) against the exact tiled GEMM (linear_tiled) at
// V4.1-Flash's real shapes: every linear format, M in {1, 3, 8, 32}, dense and routed (balanced and skewed
// expert loads, the grouped wo_a). Outputs may differ only by the fp32 summation order before the same bf16
// rounding: |d| <= 1e-2 |ref| + 1e-5 max|ref|, and bf16 outputs mostly bit-equal. At M = 8 each case also
// prints the achieved weight bandwidth. Lines starting with "PARITY" are collected by tools/gpu/check.sh.
// VariantsAtDecodeShapes (at the end) checks and times every GEMV kernel (kernels.h GemvKernel) at rows 1..32.
#include "util/switches.h"
#include "cuda_test_util.h"
#include "ops/backend.h"
#include "ops/cuda/kernels.h"

#include <cuda_runtime.h>

#include <optional>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

using namespace peregrine;
using namespace peregrine::cuda;

namespace {

#define CK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// Device buffer freed on scope exit.
struct Buf {
    void* p = nullptr;
    explicit Buf(size_t bytes) {
        if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) p = nullptr;
    }
    ~Buf() { cudaFree(p); }
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
    template <typename T>
    T* as() const { return static_cast<T*>(p); }
};
using BufPtr = std::unique_ptr<Buf>;

BufPtr upload_bytes(const void* src, size_t bytes) {
    auto b = std::make_unique<Buf>(bytes);
    if (b->p) cudaMemcpy(b->p, src, bytes, cudaMemcpyHostToDevice);
    return b;
}
template <typename T>
BufPtr upload(const std::vector<T>& v) { return upload_bytes(v.data(), v.size() * sizeof(T)); }

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 1) {}
    uint64_t next() {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        return s * 0x2545f4914f6cdd1dull;
    }
    float uniform() { return static_cast<float>(next() >> 40) / 16777216.0f * 2.0f - 1.0f; }  // [-1, 1)
};

uint16_t bf16_bits(float f) {  // round to nearest even
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}
float bf16_value(float f) {
    uint32_t u = static_cast<uint32_t>(bf16_bits(f)) << 16;
    float r;
    std::memcpy(&r, &u, 4);
    return r;
}

// A linear's format and shape (LinearDev fields) and a name for the PARITY lines.
struct Shape {
    std::string name;
    int kind;
    bool w_bf16;
    int out, in, weight_block, act_block;
};

size_t weight_bytes(const Shape& s) {
    const size_t n = static_cast<size_t>(s.out) * s.in;
    if (s.kind == 0) return n * (s.w_bf16 ? 2 : 4);
    if (s.kind == 1) return n * 2;
    if (s.kind == 2) return n;
    return n / 2;
}
size_t scale_bytes(const Shape& s) {
    if (s.kind == 2) {
        const int b = s.weight_block;
        return static_cast<size_t>((s.out + b - 1) / b) * ((s.in + b - 1) / b);
    }
    if (s.kind == 3) return static_cast<size_t>(s.out) * (s.in / 32);
    return 0;
}

// Random weights in the stored format: small bf16/f32 values, any finite e4m3 byte, any e2m1 nibble, ue8m0
// scales 2^-3 .. 2^3.
struct DevWeight {
    BufPtr w, scale;
};
DevWeight make_weight(const Shape& s, uint64_t seed) {
    Rng r(seed);
    DevWeight d;
    const size_t wb = weight_bytes(s);
    std::vector<uint8_t> bytes(wb);
    if (s.kind == 0 && !s.w_bf16) {
        auto* f = reinterpret_cast<float*>(bytes.data());
        for (size_t i = 0; i < wb / 4; ++i) f[i] = bf16_value(0.05f * r.uniform());
    } else if (s.kind <= 1) {
        auto* h = reinterpret_cast<uint16_t*>(bytes.data());
        for (size_t i = 0; i < wb / 2; ++i) h[i] = bf16_bits(0.05f * r.uniform());
    } else {
        for (size_t i = 0; i < wb; i += 8) {
            uint64_t v = r.next();
            for (size_t j = 0; j < 8 && i + j < wb; ++j, v >>= 8) {
                uint8_t b = static_cast<uint8_t>(v);
                if (s.kind == 2 && (b & 0x7f) == 0x7f) b ^= 1;  // e4m3 NaN -> 448
                bytes[i + j] = b;
            }
        }
    }
    d.w = upload(bytes);
    const size_t sb = scale_bytes(s);
    if (sb) {
        std::vector<uint8_t> sc(sb);
        for (auto& b : sc) b = static_cast<uint8_t>(124 + r.next() % 7);
        d.scale = upload(sc);
    }
    return d;
}

LinearDev dev_linear(const Shape& s, const DevWeight& d) {
    LinearDev l;
    l.kind = s.kind;
    l.w_bf16 = s.w_bf16;
    l.out = s.out;
    l.in = s.in;
    l.weight_block = s.weight_block;
    l.act_block = s.act_block;
    l.w = d.w->p;
    l.scale = d.scale ? d.scale->as<uint8_t>() : nullptr;
    return l;
}

// Activations [M, K]: bf16 values, quantised on the device for FP8/FP4 (act_quant), as run_linear does.
struct Acts {
    BufPtr x, q, s;
    const float* xp = nullptr;
    const float* sp = nullptr;
};
Acts make_acts(const Shape& s, int64_t M, uint64_t seed) {
    Rng r(seed);
    std::vector<float> x(static_cast<size_t>(M) * s.in);
    for (auto& v : x) v = bf16_value(r.uniform() * 2.0f);
    Acts a;
    a.x = upload(x);
    a.xp = a.x->as<float>();
    if (s.kind >= 2) {
        a.q = std::make_unique<Buf>(x.size() * sizeof(float));
        a.s = std::make_unique<Buf>(static_cast<size_t>(M) * (s.in / s.act_block) * sizeof(float));
        act_quant(a.xp, M, s.in, s.act_block, a.q->as<float>(), a.s->as<float>());
        a.xp = a.q->as<float>();
        a.sp = a.s->as<float>();
    }
    return a;
}

std::vector<float> to_host(const Buf& b, size_t n) {
    std::vector<float> v(n);
    cudaMemcpy(v.data(), b.p, n * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
}

// Elementwise: |fast - exact| <= 1e-2 |exact| + 1e-5 max|exact|; bf16 outputs at least 90% bit-equal.
void compare(const std::vector<float>& fast, const std::vector<float>& exact, bool rounded, const std::string& what) {
    ASSERT_EQ(fast.size(), exact.size());
    float emax = 0.0f;
    for (float v : exact) emax = std::max(emax, std::fabs(v));
    const float abs_tol = 1e-5f * emax;
    size_t bad = 0, same = 0;
    float worst = 0.0f, worst_rel = 0.0f;
    for (size_t i = 0; i < fast.size(); ++i) {
        const float d = std::fabs(fast[i] - exact[i]);
        same += fast[i] == exact[i];
        if (!(d <= 1e-2f * std::fabs(exact[i]) + abs_tol)) ++bad;
        if (d > worst || std::isnan(d)) worst = d;
        if (exact[i] != 0.0f) worst_rel = std::max(worst_rel, d / std::fabs(exact[i]));
    }
    const double share = fast.empty() ? 1.0 : static_cast<double>(same) / fast.size();
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << fast.size() << " outside tolerance, worst " << worst;
    if (rounded) {
        EXPECT_GE(share, 0.9) << what;
    }
    EXPECT_GT(emax, 0.0f) << what << ": all-zero reference";
    std::printf("PARITY gemv %-44s max|d| %.3g max rel %.3g (max|ref| %.3g) exact %.4f\n", what.c_str(), worst,
                worst_rel, emax, share);
}

// fp32 outputs of exact products summed in fp32 in another order (F32 linears on bf16 values): within 1e-4 of
// max|ref| (a block of K missing would be ~1e-2).
void compare_f32(const std::vector<float>& got, const std::vector<float>& ref, const std::string& what) {
    ASSERT_EQ(got.size(), ref.size());
    float emax = 0.0f, worst = 0.0f;
    for (size_t i = 0; i < got.size(); ++i) {
        emax = std::max(emax, std::fabs(ref[i]));
        const float d = std::fabs(got[i] - ref[i]);
        if (!(d <= worst)) worst = d;
    }
    EXPECT_LE(worst, 1e-4f * emax) << what;
    std::printf("PARITY gemv %-44s max|d| %.3g (max|ref| %.3g)\n", what.c_str(), worst, emax);
}

// Routing of `pairs` rows over E experts: tiles of 8 rows (the decode tile) built on the device.
struct Routing {
    BufPtr sel, row_map, tiles, n_tiles;
    LinearRouting r;
    std::vector<int32_t> sel_host;
};
Routing make_routing(const std::vector<int32_t>& sel, int E, unsigned max_tiles = 0) {
    Routing rt;
    rt.sel_host = sel;
    const int64_t n = static_cast<int64_t>(sel.size());
    rt.r.tile_rows = 8;
    rt.r.max_tiles = max_tiles ? max_tiles : static_cast<unsigned>((n + 7) / 8 + E);
    rt.sel = upload(sel);
    rt.row_map = std::make_unique<Buf>(sizeof(int32_t) * n);
    rt.tiles = std::make_unique<Buf>(sizeof(int32_t) * 4 * rt.r.max_tiles);
    rt.n_tiles = std::make_unique<Buf>(sizeof(int32_t));
    expert_tiles(rt.sel->as<int32_t>(), n, E, 8, rt.row_map->as<int32_t>(), rt.tiles->as<int32_t>(),
                 rt.n_tiles->as<int32_t>());
    rt.r.row_map = rt.row_map->as<int32_t>();
    rt.r.tiles = rt.tiles->as<int32_t>();
    rt.r.n_tiles = rt.n_tiles->as<int32_t>();
    return rt;
}

// GEMV kernels checked and timed in one run: the defaults (null, no tag: each format's default kernel, the
// streaming kernels for bf16/FP8/FP4) and the CUDA-core kernel everywhere ("[cuda-cores]", where it differs).
const std::optional<GemvKernel> kVariants[] = {std::nullopt, GemvKernel::cuda_cores};
bool variant_applies(std::optional<GemvKernel> k, const LinearDev& l) { return !k || linear_gemv_mma_supported(l); }
std::string variant_tag(std::optional<GemvKernel> k) {
    return k ? std::string(" [") + gemv_kernel_name(*k) + "]" : "";
}
struct VariantScope {  // every format's kernel set to k (null: left at the defaults), restored afterwards
    GemvKernel before[4];
    explicit VariantScope(std::optional<GemvKernel> k) {
        for (int f = 0; f < 4; ++f) before[f] = linear_gemv_kernel(f);
        if (k) linear_gemv_set_kernel(*k);
    }
    ~VariantScope() {
        for (int f = 0; f < 4; ++f) linear_gemv_set_kernel(f, before[f]);
    }
};

void report_speed(const std::string& what, double ms, double bytes) {
    std::printf("PARITY gemv %-44s M=8 %8.1f us %7.0f GB/s\n", what.c_str(), ms * 1e3, bytes / (ms * 1e-3) / 1e9);
}

// V4.1-Flash dense linears (and one V4 FP8 layout with 128-wide blocks).
const Shape kDense[] = {
    {"wq_a fp8 5120->1280", 2, false, 1280, 5120, 32, 32},
    {"wq_b fp8 1280->32768", 2, false, 32768, 1280, 32, 32},
    {"wkv fp8 5120->512", 2, false, 512, 5120, 32, 32},
    {"wo_b fp8 8192->5120", 2, false, 5120, 8192, 32, 32},
    {"shared.w1 fp8 5120->2304", 2, false, 2304, 5120, 32, 32},
    {"shared.w2 fp8 2304->5120", 2, false, 5120, 2304, 32, 32},
    {"v4 fp8 block128 4096->2048", 2, false, 2048, 4096, 128, 128},
    {"expert fp4 dense 5120->2304", 3, false, 2304, 5120, 0, 32},
    {"gate f32 5120->384", 0, false, 384, 5120, 0, 0},
    {"gate f32(bf16) 5120->384", 0, true, 384, 5120, 0, 0},
    {"wo_a group bf16 4096->1024", 1, false, 1024, 4096, 0, 0},
    {"weights_proj bf16 5120->32", 1, false, 32, 5120, 0, 0},
    {"lm head f32(bf16) 5120->129280", 0, true, 129280, 5120, 0, 0},
};

}  // namespace

TEST(CudaGemv, SupportsEveryV41FlashFormat) {
    for (const Shape& s : kDense) {
        LinearDev l;
        l.kind = s.kind;
        l.w_bf16 = s.w_bf16;
        l.out = s.out;
        l.in = s.in;
        l.weight_block = s.weight_block;
        l.act_block = s.act_block;
        EXPECT_TRUE(linear_gemv_supported(l)) << s.name;
    }
    LinearDev odd;  // FP8 with an activation block other than the weight block: not the reference's pairing
    odd.kind = 2;
    odd.out = 64;
    odd.in = 256;
    odd.weight_block = 128;
    odd.act_block = 32;
    EXPECT_FALSE(linear_gemv_supported(odd));
    odd.kind = 1;
    odd.in = 100;  // rows not a whole number of 16-byte chunks
    EXPECT_FALSE(linear_gemv_supported(odd));
}

TEST(CudaGemv, DenseMatchesExactAtRealShapes) {
    REQUIRE_GPU();
    uint64_t seed = 11;
    for (const Shape& s : kDense) {
        DevWeight dw = make_weight(s, seed++);
        ASSERT_TRUE(dw.w->p) << s.name << ": out of device memory";
        const LinearDev l = dev_linear(s, dw);
        ASSERT_TRUE(linear_tiled_supported(l)) << s.name;
        for (int64_t M : {1, 3, 8, 32}) {
            Acts a = make_acts(s, M, seed++);
            const size_t n = static_cast<size_t>(M) * s.out;
            Buf yf(n * sizeof(float)), ye(n * sizeof(float));
            linear_tiled(a.xp, a.sp, M, l, ye.as<float>(), nullptr, nullptr);
            for (std::optional<GemvKernel> v : kVariants) {
                if (!variant_applies(v, l)) continue;
                VariantScope scope(v);
                CK(cudaMemset(yf.p, 0xff, n * sizeof(float)));  // NaN: an output left unwritten fails
                linear_gemv(a.xp, a.sp, M, l, yf.as<float>(), nullptr, nullptr);
                CK(cudaDeviceSynchronize());
                const std::vector<float> first = to_host(yf, n);
                compare(first, to_host(ye, n), s.kind != 0, s.name + variant_tag(v) + " M=" + std::to_string(M));
                if (M == 8) {
                    const double ms = peregrine::test::device_ms(
                        [&] { linear_gemv(a.xp, a.sp, M, l, yf.as<float>(), nullptr, nullptr); }, 20, 3);
                    CK(cudaDeviceSynchronize());
                    // Repeated calls (reused split scratch and tickets) give the same bits.
                    EXPECT_EQ(std::memcmp(first.data(), to_host(yf, n).data(), n * sizeof(float)), 0) << s.name;
                    report_speed(s.name + variant_tag(v), ms, static_cast<double>(weight_bytes(s) + scale_bytes(s)));
                }
            }
            if (s.kind == 0 && s.w_bf16) {
                // bf16 activations on bf16-stored F32 weights (the MoE gate, the compressor): the bf16 streaming
                // kernel with fp32 outputs.
                LinearDev lb = l;
                lb.bf16_acts = true;
                CK(cudaMemset(yf.p, 0xff, n * sizeof(float)));
                linear_gemv(a.xp, nullptr, M, lb, yf.as<float>(), nullptr, nullptr);
                CK(cudaDeviceSynchronize());
                compare_f32(to_host(yf, n), to_host(ye, n), s.name + " bf16 acts M=" + std::to_string(M));
                if (M == 8) {
                    const double ms = peregrine::test::device_ms(
                        [&] { linear_gemv(a.xp, nullptr, M, lb, yf.as<float>(), nullptr, nullptr); }, 20, 3);
                    report_speed(s.name + " bf16 acts", ms, static_cast<double>(weight_bytes(s)));
                }
            }
        }
    }
}

// Two linears of one input in one launch (linear_gemv_pair: wq_a + wkv, the shared expert's w1 + w3, the
// compressor's wkv + wgate): each output within the exact kernel's tolerance, nothing left unwritten (NaN fill),
// and the pair the same bits as two calls when it falls back (a first linear ending inside a CTA's rows).
TEST(CudaGemv, PairMatchesExact) {
    REQUIRE_GPU();
    struct Pair {
        Shape a, b;
        bool bf16_acts;
    };
    const Pair pairs[] = {
        {{"wq_a fp8", 2, false, 1280, 5120, 32, 32}, {"wkv fp8", 2, false, 512, 5120, 32, 32}, false},
        {{"shared.w1 fp8", 2, false, 2304, 5120, 32, 32}, {"shared.w3 fp8", 2, false, 2304, 5120, 32, 32}, false},
        {{"v4 w1 fp8 block128", 2, false, 2048, 4096, 128, 128},
         {"v4 w3 fp8 block128", 2, false, 2048, 4096, 128, 128},
         false},
        {{"odd fp8 (1056 rows)", 2, false, 1056, 5120, 32, 32}, {"wkv fp8", 2, false, 512, 5120, 32, 32}, false},
        {{"compressor.wkv f32(bf16)", 0, true, 1024, 5120, 0, 0},
         {"compressor.wgate f32(bf16)", 0, true, 1024, 5120, 0, 0},
         true},
    };
    uint64_t seed = 501;
    for (const Pair& pr : pairs) {
        DevWeight da = make_weight(pr.a, seed++), db = make_weight(pr.b, seed++);
        ASSERT_TRUE(da.w->p && db.w->p) << pr.a.name;
        LinearDev la = dev_linear(pr.a, da), lb = dev_linear(pr.b, db);
        la.bf16_acts = lb.bf16_acts = pr.bf16_acts;
        for (int64_t M : {1, 8, 32}) {
            // Raw bf16 activations for the pair (it quantises them itself), act_quant's output for the references.
            const Acts in = make_acts(pr.a, M, seed++);
            const Buf* x = in.x.get();
            const size_t na = static_cast<size_t>(M) * pr.a.out, nb = static_cast<size_t>(M) * pr.b.out;
            Buf ya(na * sizeof(float)), yb(nb * sizeof(float)), ea(na * sizeof(float)), eb(nb * sizeof(float));
            CK(cudaMemset(ya.p, 0xff, na * sizeof(float)));  // NaN: an output left unwritten fails
            CK(cudaMemset(yb.p, 0xff, nb * sizeof(float)));
            linear_gemv_pair(x->as<float>(), nullptr, M, la, ya.as<float>(), lb, yb.as<float>());
            // The references: the exact kernel on the quantised activations (FP8), or with fp32 sums (F32 kind).
            LinearDev ra = la, rb = lb;
            ra.bf16_acts = rb.bf16_acts = false;
            linear_tiled(in.xp, in.sp, M, ra, ea.as<float>(), nullptr, nullptr);
            linear_tiled(in.xp, in.sp, M, rb, eb.as<float>(), nullptr, nullptr);
            CK(cudaDeviceSynchronize());
            const std::string tag = " (pair) M=" + std::to_string(M);
            if (pr.a.kind >= 2) {
                compare(to_host(ya, na), to_host(ea, na), true, pr.a.name + tag);
                compare(to_host(yb, nb), to_host(eb, nb), true, pr.b.name + tag);
            } else {
                compare_f32(to_host(ya, na), to_host(ea, na), pr.a.name + tag);
                compare_f32(to_host(yb, nb), to_host(eb, nb), pr.b.name + tag);
            }
            if (pr.a.out % 128 != 0) {  // falls back to two calls: the same bits as two linear_gemv calls
                Buf sa(na * sizeof(float)), sb(nb * sizeof(float));
                linear_gemv(x->as<float>(), nullptr, M, la, sa.as<float>(), nullptr, nullptr);
                linear_gemv(x->as<float>(), nullptr, M, lb, sb.as<float>(), nullptr, nullptr);
                CK(cudaDeviceSynchronize());
                EXPECT_EQ(std::memcmp(to_host(sa, na).data(), to_host(ya, na).data(), na * sizeof(float)), 0)
                    << pr.a.name << tag;
                EXPECT_EQ(std::memcmp(to_host(sb, nb).data(), to_host(yb, nb).data(), nb * sizeof(float)), 0)
                    << pr.b.name << tag;
            }
            if (M == 8) {
                const double pair_ms = peregrine::test::device_ms(
                    [&] { linear_gemv_pair(x->as<float>(), nullptr, M, la, ya.as<float>(), lb, yb.as<float>()); }, 20,
                    3);
                const double two_ms = peregrine::test::device_ms([&] {
                    linear_gemv(x->as<float>(), nullptr, M, la, ya.as<float>(), nullptr, nullptr);
                    linear_gemv(x->as<float>(), nullptr, M, lb, yb.as<float>(), nullptr, nullptr);
                }, 20, 3);
                std::printf("PARITY gemv %-44s M=8 pair %.1f us, two calls %.1f us\n",
                            (pr.a.name + " + " + pr.b.name).c_str(), pair_ms * 1e3, two_ms * 1e3);
            }
        }
    }
}

namespace {

// Routed GEMM over E experts whose weights come from `distinct` separate buffers (expert e uses e % distinct),
// so that the experts a call touches are distinct memory.
void check_routed(const Shape& s, int E, int distinct, int top_k, uint64_t seed) {
    std::vector<DevWeight> bufs;
    for (int i = 0; i < distinct; ++i) {
        bufs.push_back(make_weight(s, seed * 1000 + i));
        ASSERT_TRUE(bufs.back().w->p) << s.name << ": out of device memory";
    }
    std::vector<const void*> ptrs(2 * static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
        ptrs[e] = bufs[e % distinct].w->p;
        ptrs[E + e] = bufs[e % distinct].scale ? bufs[e % distinct].scale->p : nullptr;
    }
    BufPtr table = upload(ptrs);
    ExpertTable ex{table->as<const void* const>(),
                   reinterpret_cast<const uint8_t* const*>(table->as<const void*>() + E)};
    const LinearDev l = dev_linear(s, bufs[0]);
    // 128 and 256 tokens: persistent CTAs taking more than one tile's units, over several tiles (batch 128's w2).
    for (int64_t T : {1, 3, 8, 32, 128, 256}) {
        if (routing_tile_rows(T * top_k, E) != 8) continue;  // larger tiles run the grouped GEMMs, not the GEMV
        for (bool skewed : {false, true}) {
            const int64_t pairs = T * top_k;
            std::vector<int32_t> sel(static_cast<size_t>(pairs));
            Rng r(seed + T);
            for (int64_t i = 0; i < pairs; ++i) {
                if (!skewed) sel[i] = static_cast<int32_t>(i % E);  // every expert once before any twice
                else sel[i] = r.next() % 10 < 6 ? 3 % E : static_cast<int32_t>(r.next() % E);  // 60% to one expert
            }
            Routing rt = make_routing(sel, E);
            Acts a = make_acts(s, pairs, seed + 7 * T + skewed);
            const size_t n = static_cast<size_t>(pairs) * s.out;
            Buf yf(n * sizeof(float)), ye(n * sizeof(float));
            linear_tiled(a.xp, a.sp, pairs, l, ye.as<float>(), &ex, &rt.r);
            for (std::optional<GemvKernel> v : kVariants) {
                if (!variant_applies(v, l)) continue;
                VariantScope scope(v);
                CK(cudaMemset(yf.p, 0xff, n * sizeof(float)));
                linear_gemv(a.xp, a.sp, pairs, l, yf.as<float>(), &ex, &rt.r);
                CK(cudaDeviceSynchronize());
                const std::string what = s.name + (skewed ? " skewed" : " balanced") + variant_tag(v);
                const std::vector<float> first = to_host(yf, n);
                compare(first, to_host(ye, n), s.kind != 0, what + " T=" + std::to_string(T));
                if (T == 8) {
                    std::vector<char> used(static_cast<size_t>(distinct), 0);
                    for (int32_t e : sel) used[static_cast<size_t>(e % distinct)] = 1;
                    const double touched = static_cast<double>(std::count(used.begin(), used.end(), 1));
                    const double ms = peregrine::test::device_ms(
                        [&] { linear_gemv(a.xp, a.sp, pairs, l, yf.as<float>(), &ex, &rt.r); }, 20, 3);
                    CK(cudaDeviceSynchronize());
                    EXPECT_EQ(std::memcmp(first.data(), to_host(yf, n).data(), n * sizeof(float)), 0) << what;
                    report_speed(what, ms, touched * static_cast<double>(weight_bytes(s) + scale_bytes(s)));
                }
            }
        }
    }
}

}  // namespace

TEST(CudaGemv, RoutedExpertsMatchExactAtRealShapes) {
    REQUIRE_GPU();
    // V4.1-Flash routed experts (FP4, 384 experts, top-6), a V4-style FP8 expert layout, and the grouped
    // wo_a (8 bf16 groups, every row of a token through each group).
    check_routed({"experts.w1 fp4 5120->2304", 3, false, 2304, 5120, 0, 32}, 384, 64, 6, 21);
    check_routed({"experts.w2 fp4 2304->5120", 3, false, 5120, 2304, 0, 32}, 384, 64, 6, 22);
    check_routed({"experts.w1 fp8 block128 4096->2048", 2, false, 2048, 4096, 128, 128}, 64, 64, 6, 23);
    check_routed({"wo_a grouped bf16 4096->1024", 1, false, 1024, 4096, 0, 0}, 8, 8, 8, 24);
}

// The routed experts' w1 and w3 in one launch (linear_gemv_pair with two expert tables, one routing), as the MoE
// runs them at decode: each output within the exact kernel's tolerance, nothing left unwritten (NaN fill), from
// raw activations (quantised in the CTAs) and from quantised ones.
TEST(CudaGemv, RoutedPairMatchesExact) {
    REQUIRE_GPU();
    const Shape s1{"experts.w1 fp4 5120->2304", 3, false, 2304, 5120, 0, 32},
        s3{"experts.w3 fp4 5120->2304", 3, false, 2304, 5120, 0, 32};
    const int E = 384, distinct = 32, top_k = 6;
    std::vector<DevWeight> b1, b3;
    for (int i = 0; i < distinct; ++i) {
        b1.push_back(make_weight(s1, 9100 + i));
        b3.push_back(make_weight(s3, 9200 + i));
        ASSERT_TRUE(b1.back().w->p && b3.back().w->p) << "out of device memory";
    }
    auto table_of = [&](const std::vector<DevWeight>& b) {
        std::vector<const void*> ptrs(2 * static_cast<size_t>(E));
        for (int e = 0; e < E; ++e) {
            ptrs[e] = b[e % distinct].w->p;
            ptrs[E + e] = b[e % distinct].scale->p;
        }
        return upload(ptrs);
    };
    BufPtr t1 = table_of(b1), t3 = table_of(b3);
    ExpertTable ex1{t1->as<const void* const>(), reinterpret_cast<const uint8_t* const*>(t1->as<const void*>() + E)};
    ExpertTable ex3{t3->as<const void* const>(), reinterpret_cast<const uint8_t* const*>(t3->as<const void*>() + E)};
    const LinearDev l1 = dev_linear(s1, b1[0]), l3 = dev_linear(s3, b3[0]);
    for (int64_t T : {1, 8, 32, 128}) {
        const int64_t pairs = T * top_k;
        std::vector<int32_t> sel(static_cast<size_t>(pairs));
        for (int64_t i = 0; i < pairs; ++i) sel[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % E);
        Routing rt = make_routing(sel, E);
        const Acts a = make_acts(s1, pairs, 9300 + T);
        const size_t n = static_cast<size_t>(pairs) * s1.out;
        Buf y1(n * 4), y3(n * 4), e1(n * 4), e3(n * 4);
        linear_tiled(a.xp, a.sp, pairs, l1, e1.as<float>(), &ex1, &rt.r);
        linear_tiled(a.xp, a.sp, pairs, l3, e3.as<float>(), &ex3, &rt.r);
        for (bool raw : {true, false}) {
            CK(cudaMemset(y1.p, 0xff, n * 4));
            CK(cudaMemset(y3.p, 0xff, n * 4));
            const float* x = raw ? a.x->as<float>() : a.xp;
            const float* xs = raw ? nullptr : a.sp;
            linear_gemv_pair(x, xs, pairs, l1, y1.as<float>(), l3, y3.as<float>(), &ex1, &ex3, &rt.r);
            CK(cudaDeviceSynchronize());
            const std::string tag =
                std::string(raw ? " (routed pair, raw acts)" : " (routed pair)") + " T=" + std::to_string(T);
            compare(to_host(y1, n), to_host(e1, n), true, s1.name + tag);
            compare(to_host(y3, n), to_host(e3, n), true, s3.name + tag);
        }
        if (T != 32) {
            const float* x = a.x->as<float>();
            const double pair_ms = peregrine::test::device_ms(
                [&] { linear_gemv_pair(x, nullptr, pairs, l1, y1.as<float>(), l3, y3.as<float>(), &ex1, &ex3, &rt.r); },
                20, 3);
            const double two_ms = peregrine::test::device_ms([&] {
                linear_gemv(x, nullptr, pairs, l1, y1.as<float>(), &ex1, &rt.r);
                linear_gemv(x, nullptr, pairs, l3, y3.as<float>(), &ex3, &rt.r);
            }, 20, 3);
            std::printf("PARITY gemv routed w1 + w3 fp4 T=%lld: pair %.1f us, two calls %.1f us\n",
                        static_cast<long long>(T), pair_ms * 1e3, two_ms * 1e3);
        }
    }
}

// ---- Every GEMV variant at decode shapes, one line each for comparing them:
//   GEMV <format> rows=<r> variant=<v> <us> us <GB/s> GB/s        (all shapes of the format together)
//   GEMV <format>:<shape> rows=<r> variant=<v> <us> us <GB/s> GB/s max|d| <d> (<ulps> bf16 ulp) [fused==unfused]
// Variants: 1 CUDA cores, 3 the older tensor-core kernel, "3+q" the same with act_quant's launch, 4/5/6 the
// streaming kernels (5 the default for FP8 and BF16) on quantised activations and "4f"/"5f"/"6f" the
// same quantising the activations themselves (must equal 4/5/6 bit for bit); routed calls also 7/8 (4/5 with
// persistent CTAs), 9 and 10 (FP4: persistent CTAs of 12 and 16 warps) and "7f" .. "10f". Dense calls of 3+
// rows also run with the CTAs staging their own activations, which must give the staged image's bits. Each is
// checked against the exact kernel: |d| <= one bf16 ulp of the output (+ 1e-5 max|ref| for outputs near cancellation). Bytes: the
// weights and scales a call reads (active experts only); timed over copies of the weights (or rotating expert
// sets) larger than L2, after a warm-up. PEREGRINE_GEMV_SWEEP_ROWS="1,8" picks the rows (up to 128; routed
// calls take that many tokens of top-6 pairs).
namespace {

struct SweepShape {
    std::string format, name;
    Shape s;
};

std::vector<int> sweep_rows() {
    std::vector<int> r = {1, 2, 4, 8, 16, 32};
    if (const std::string rows = switch_value("PEREGRINE_GEMV_SWEEP_ROWS"); !rows.empty()) {
        const char* e = rows.c_str();
        r.clear();
        for (const char* p = e; *p;) {
            char* end = nullptr;
            const long v = std::strtol(p, &end, 10);
            if (end == p) break;
            if (v > 0 && v <= 128) r.push_back(static_cast<int>(v));
            p = *end ? end + 1 : end;
        }
    }
    return r;
}

// One bf16 ulp at |v| (normal range).
float bf16_ulp(float v) {
    int e = 0;
    std::frexp(std::max(std::fabs(v), 1e-30f), &e);  // |v| in [2^(e-1), 2^e)
    return std::ldexp(1.0f, e - 1 - 7);
}

struct Diff {
    float max_abs = 0.0f, max_ulps = 0.0f;
    size_t bad = 0;
};
Diff ulp_diff(const std::vector<float>& fast, const std::vector<float>& exact) {
    Diff d;
    float emax = 0.0f;
    for (float v : exact) emax = std::max(emax, std::fabs(v));
    for (size_t i = 0; i < fast.size(); ++i) {
        const float a = std::fabs(fast[i] - exact[i]);
        const float ulp = bf16_ulp(std::max(std::fabs(fast[i]), std::fabs(exact[i])));
        if (!(a <= ulp + 1e-5f * emax)) ++d.bad;
        if (!(a <= d.max_abs)) d.max_abs = a;
        d.max_ulps = std::max(d.max_ulps, a / ulp);
    }
    return d;
}

struct Total {
    double us = 0.0, bytes = 0.0;
    // Parity over the format's shapes and rows (one PARITY line per format and variant).
    float max_abs = 0.0f, max_ulps = 0.0f;
    size_t bad = 0, checks = 0;
};

// Runs one (shape, rows) case for every GEMV kernel: `call(k, fused, yf)` runs kernel k once; `quant()` is act_quant
// (for "mma-sync+q"); `use(i)` selects weight copy / expert set i (0: the one `exact` was computed with); bytes per
// call.
using CallFn = std::function<void(GemvKernel k, bool fused, float* y)>;
void sweep_case(const SweepShape& sh, int rows, bool scaled, bool routed, const std::vector<float>& exact, size_t n,
                const CallFn& call, const std::function<void()>& quant, const std::function<void(int)>& use,
                double bytes, std::map<std::string, Total>& totals) {
    Buf yf(n * sizeof(float));
    using K = GemvKernel;
    std::vector<std::pair<std::string, std::pair<K, bool>>> variants = {{"cuda-cores", {K::cuda_cores, false}}};
    if (scaled) {
        variants.push_back({"mma-sync", {K::mma_sync, false}});
        variants.push_back({"mma-sync+q", {K::mma_sync, false}});
    }
    for (K k : {K::stream_128x6, K::stream_256x4, K::stream_128x4_2ctas, K::persistent_128x6, K::persistent_256x4,
                K::fp4_12warps, K::fp4_16warps}) {
        // Dense calls: the persistent kernels are their streaming forms (and the FP4 ones stream_256x4 elsewhere).
        if (k >= K::persistent_128x6 && !routed) continue;
        variants.push_back({gemv_kernel_name(k), {k, false}});
        if (scaled) variants.push_back({std::string(gemv_kernel_name(k)) + "+fused", {k, true}});
    }
    std::map<K, std::vector<float>> unfused;
    for (const auto& [tag, vf] : variants) {
        const auto [v, fused] = vf;
        ASSERT_EQ(cudaMemset(yf.p, 0xff, n * sizeof(float)), cudaSuccess);  // NaN: an unwritten output fails
        use(0);
        call(v, fused, yf.as<float>());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << sh.name << " variant " << tag;
        const std::vector<float> got = to_host(yf, n);
        const Diff d = ulp_diff(got, exact);
        EXPECT_EQ(d.bad, 0u) << sh.name << " rows=" << rows << " variant=" << tag << ": " << d.bad << " of " << n
                             << " outputs beyond one bf16 ulp, max|d| " << d.max_abs;
        std::string same;
        // Dense calls of 3+ rows copy their staged activations: the same bits.
        if (gemv_kernel_streams(v) && !routed && rows >= 3) {
            const int before = linear_gemv_set_image_rows(0);
            ASSERT_EQ(cudaMemset(yf.p, 0xff, n * sizeof(float)), cudaSuccess);
            call(v, fused, yf.as<float>());
            linear_gemv_set_image_rows(before);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const bool eq = std::memcmp(got.data(), to_host(yf, n).data(), n * sizeof(float)) == 0;
            EXPECT_TRUE(eq) << sh.name << " rows=" << rows << " variant=" << tag
                            << ": staged image differs from CTA staging";
            same = eq ? " image==staged" : " IMAGE!=STAGED";
        }
        if (gemv_kernel_streams(v) && !fused) unfused[v] = got;
        if (gemv_kernel_streams(v) && fused) {
            const bool eq = std::memcmp(got.data(), unfused[v].data(), n * sizeof(float)) == 0;
            EXPECT_TRUE(eq) << sh.name << " rows=" << rows << ": kernel " << gemv_kernel_name(v)
                            << " fused differs from quantise-then-GEMV";
            same += eq ? " fused==unfused" : " FUSED!=UNFUSED";
        }
        const bool with_quant = tag == "mma-sync+q";
        int i = 0;
        const double ms = peregrine::test::device_ms(
            [&] {
                use(++i);
                if (with_quant) quant();
                call(v, fused, yf.as<float>());
            },
            24, 3);
        // Repeated calls (reused split scratch and tickets) give the same bits.
        use(0);
        call(v, fused, yf.as<float>());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(std::memcmp(got.data(), to_host(yf, n).data(), n * sizeof(float)), 0)
            << sh.name << " rows=" << rows << " variant=" << tag << ": not repeatable";
        const double us = ms * 1e3, gbs = bytes / (ms * 1e-3) / 1e9;
        // The outputs' bits as a hash, so that two builds can be compared case by case.
        uint32_t bits_hash = 2166136261u;
        for (float f : got) bits_hash = (bits_hash ^ std::bit_cast<uint32_t>(f)) * 16777619u;
        std::printf("GEMV %s:%s rows=%d variant=%s %.1f us %.0f GB/s max|d| %.3g (%.2f bf16 ulp) bits %08x%s\n",
                    sh.format.c_str(), sh.name.c_str(), rows, tag.c_str(), us, gbs, d.max_abs, d.max_ulps, bits_hash,
                    same.c_str());
        Total& t = totals[sh.format + " rows=" + std::to_string(rows) + " variant=" + tag];
        t.us += us;
        t.bytes += bytes;
        Total& f = totals["~parity " + sh.format + " variant=" + tag];
        f.max_abs = std::max(f.max_abs, d.max_abs);
        f.max_ulps = std::max(f.max_ulps, d.max_ulps);
        f.bad += d.bad + (same.find("!=") != std::string::npos ? 1 : 0);
        f.checks += 1;
    }
}

void print_totals(const std::map<std::string, Total>& totals) {
    for (const auto& [key, t] : totals) {
        if (key.rfind("~parity ", 0) == 0)
            std::printf("PARITY gemv-sweep %-36s %zu cases, max|d| %.3g (%.2f bf16 ulp), %zu outputs beyond one ulp\n",
                        key.substr(8).c_str(), t.checks, t.max_abs, t.max_ulps, t.bad);
        else
            std::printf("GEMV %s %.1f us %.0f GB/s\n", key.c_str(), t.us, t.bytes / (t.us * 1e-6) / 1e9);
    }
    std::fflush(stdout);
}

// Dense: weights copied until the copies exceed L2 several times over; call i uses copy i % copies.
void sweep_dense(const SweepShape& sh, uint64_t seed, std::map<std::string, Total>& totals) {
    const Shape& s = sh.s;
    DevWeight first = make_weight(s, seed);
    ASSERT_TRUE(first.w->p) << sh.name;
    const size_t wb = weight_bytes(s), sb = scale_bytes(s);
    const int copies = static_cast<int>(std::clamp<size_t>((256u << 20) / (wb + sb) + 1, 1, 64));
    std::vector<DevWeight> ws;
    ws.push_back(std::move(first));
    for (int c = 1; c < copies; ++c) {
        DevWeight d;
        d.w = std::make_unique<Buf>(wb);
        ASSERT_TRUE(d.w->p);
        ASSERT_EQ(cudaMemcpy(d.w->p, ws[0].w->p, wb, cudaMemcpyDeviceToDevice), cudaSuccess);
        if (sb) {
            d.scale = std::make_unique<Buf>(sb);
            ASSERT_EQ(cudaMemcpy(d.scale->p, ws[0].scale->p, sb, cudaMemcpyDeviceToDevice), cudaSuccess);
        }
        ws.push_back(std::move(d));
    }
    const bool scaled = s.kind >= 2;
    for (int rows : sweep_rows()) {
        Acts a = make_acts(s, rows, seed + rows);
        const size_t n = static_cast<size_t>(rows) * s.out;
        Buf ye(n * sizeof(float));
        LinearDev l = dev_linear(s, ws[0]);
        l.bf16_acts = s.kind == 1;
        linear_tiled(a.xp, a.sp, rows, l, ye.as<float>(), nullptr, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> exact = to_host(ye, n);
        int cur = 0;
        Buf xq(static_cast<size_t>(rows) * s.in * sizeof(float)),
            xs(static_cast<size_t>(rows) * (s.in / 32 + 1) * sizeof(float));
        auto call = [&](GemvKernel v, bool fused, float* y) {
            LinearDev lc = l;
            lc.w = ws[cur].w->p;
            lc.scale = ws[cur].scale ? ws[cur].scale->as<uint8_t>() : nullptr;
            if (gemv_kernel_streams(v)) {
                linear_gemv_stream(v, fused ? a.x->as<float>() : a.xp, fused ? nullptr : a.sp, rows, lc, y, nullptr,
                                   nullptr);
            } else {
                VariantScope scope(v);
                linear_gemv(a.xp, a.sp, rows, lc, y, nullptr, nullptr);
            }
        };
        auto quant = [&] {
            if (scaled) act_quant(a.x->as<float>(), rows, s.in, s.act_block, xq.as<float>(), xs.as<float>());
        };
        auto use = [&](int i) { cur = i % copies; };
        sweep_case(sh, rows, scaled, false, exact, n, call, quant, use, static_cast<double>(wb + sb), totals);
    }
}

// Routed over E experts, each its own memory, with up to 8 expert selections per token count rotated per timed
// call. mode 0 balanced (pairs spread over consecutive experts from a shifted start: one row per expert while
// pairs <= E), 1 skewed (60% of the pairs to one expert), 2 grouped (pair i to group i % G of copy k: the
// grouped wo_a, G = top_k groups, E / G copies).
void sweep_routed(const SweepShape& sh, int E, int top_k, int mode, uint64_t seed,
                  std::map<std::string, Total>& totals) {
    const Shape& s = sh.s;
    const size_t wb = weight_bytes(s), sb = scale_bytes(s);
    std::vector<DevWeight> pool;  // a few random contents, copied to every expert's own memory
    for (int i = 0; i < 4; ++i) {
        pool.push_back(make_weight(s, seed * 100 + i));
        ASSERT_TRUE(pool.back().w->p) << sh.name << ": out of device memory";
    }
    std::vector<DevWeight> ex(static_cast<size_t>(E));
    std::vector<const void*> ptrs(2 * static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
        ex[e].w = std::make_unique<Buf>(wb);
        ASSERT_TRUE(ex[e].w->p) << sh.name << ": out of device memory";
        ASSERT_EQ(cudaMemcpy(ex[e].w->p, pool[e % 4].w->p, wb, cudaMemcpyDeviceToDevice), cudaSuccess);
        if (sb) {
            ex[e].scale = std::make_unique<Buf>(sb);
            ASSERT_TRUE(ex[e].scale->p) << sh.name << ": out of device memory";
            // Scales from another pool entry than the weights, so that more experts differ.
            ASSERT_EQ(cudaMemcpy(ex[e].scale->p, pool[(e / 4) % 4].scale->p, sb, cudaMemcpyDeviceToDevice),
                      cudaSuccess);
        }
        ptrs[e] = ex[e].w->p;
        ptrs[E + e] = sb ? ex[e].scale->p : nullptr;
    }
    BufPtr table = upload(ptrs);
    ExpertTable et{table->as<const void* const>(),
                   reinterpret_cast<const uint8_t* const*>(table->as<const void*>() + E)};
    const bool scaled = s.kind >= 2;
    LinearDev l = dev_linear(s, ex[0]);
    l.bf16_acts = s.kind == 1;
    for (int T : sweep_rows()) {
        const int64_t pairs = static_cast<int64_t>(T) * top_k;
        const int sets = mode == 2 ? std::min(8, E / top_k) : static_cast<int>(std::clamp<int64_t>(E / pairs, 1, 8));
        std::vector<Routing> rts;
        double mean_bytes = 0.0;
        Rng r(seed + T);
        for (int k = 0; k < sets; ++k) {
            std::vector<int32_t> sel(static_cast<size_t>(pairs));
            const int hot = static_cast<int>((3 + 17 * k) % E);
            for (int64_t i = 0; i < pairs; ++i) {
                if (mode == 0) sel[i] = static_cast<int32_t>((i + k * pairs) % E);
                else if (mode == 1) sel[i] = r.next() % 10 < 6 ? hot : static_cast<int32_t>(r.next() % E);
                else sel[i] = static_cast<int32_t>(i % top_k + top_k * k);
            }
            std::vector<char> used(static_cast<size_t>(E), 0);
            for (int32_t e : sel) used[e] = 1;
            mean_bytes +=
                static_cast<double>(std::count(used.begin(), used.end(), 1)) * static_cast<double>(wb + sb) / sets;
            // The grouped wo_a's tiles are known exactly (every group T rows), as the backend bounds them.
            rts.push_back(make_routing(sel, E, mode == 2 ? static_cast<unsigned>(top_k * ((T + 7) / 8)) : 0u));
        }
        Acts a = make_acts(s, pairs, seed + 7 * T + mode);
        const size_t n = static_cast<size_t>(pairs) * s.out;
        Buf ye(n * sizeof(float));
        linear_tiled(a.xp, a.sp, pairs, l, ye.as<float>(), &et, &rts[0].r);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> exact = to_host(ye, n);
        int cur = 0;
        Buf xq(static_cast<size_t>(pairs) * s.in * sizeof(float)),
            xs(static_cast<size_t>(pairs) * (s.in / 32 + 1) * sizeof(float));
        auto call = [&](GemvKernel v, bool fused, float* y) {
            if (gemv_kernel_streams(v)) {
                linear_gemv_stream(v, fused ? a.x->as<float>() : a.xp, fused ? nullptr : a.sp, pairs, l, y, &et,
                                   &rts[cur].r);
            } else {
                VariantScope scope(v);
                linear_gemv(a.xp, a.sp, pairs, l, y, &et, &rts[cur].r);
            }
        };
        auto quant = [&] {
            if (scaled) act_quant(a.x->as<float>(), pairs, s.in, s.act_block, xq.as<float>(), xs.as<float>());
        };
        auto use = [&](int i) { cur = i % sets; };
        sweep_case(sh, T, scaled, true, exact, n, call, quant, use, mean_bytes, totals);
    }
}

}  // namespace

// PEREGRINE_GEMV_SWEEP_FORMATS="fp4" (a substring of the sweep's format names) narrows the shapes, and
// PEREGRINE_GEMV_SWEEP_SHAPES="wkv" (a substring of their names) too, e.g. to profile one shape.
bool sweep_format(const char* f) {
    const std::string e = switch_value("PEREGRINE_GEMV_SWEEP_FORMATS");
    return e.empty() || std::string(f).find(e) != std::string::npos;
}
bool sweep_shape(const std::string& name) {
    const std::string e = switch_value("PEREGRINE_GEMV_SWEEP_SHAPES");
    return e.empty() || name.find(e) != std::string::npos;
}

TEST(CudaGemv, VariantsAtDecodeShapes) {
    REQUIRE_GPU();
    std::map<std::string, Total> totals;
    // V4.1-Flash dense FP8 projections (32x32 blocks) and the same shapes with V4's 128x128 blocks.
    const std::pair<const char*, std::pair<int, int>> dense[] = {
        {"wq_a", {1280, 5120}},       {"wq_b", {32768, 1280}}, {"wkv", {512, 5120}},        {"wo_b", {5120, 8192}},
        {"idx.wq_b", {4096, 1280}},   {"shared.w1", {2304, 5120}}, {"shared.w2", {5120, 2304}},
    };
    uint64_t seed = 101;
    for (int blk : {32, 128}) {
        for (const auto& [name, nk] : dense) {
            SweepShape sh{blk == 32 ? "fp8-32" : "fp8-128", name, {name, 2, false, nk.first, nk.second, blk, blk}};
            if (sweep_format(sh.format.c_str()) && sweep_shape(name)) sweep_dense(sh, seed, totals);
            ++seed;
        }
    }
    // The grouped bf16 wo_a (8 groups of 4096 -> 1024, every token's 8 rows one per group; 4 copies rotated).
    if (sweep_format("bf16-wo_a"))
        sweep_routed({"bf16-wo_a", "wo_a", {"wo_a", 1, false, 1024, 4096, 0, 0}}, 32, 8, 2, seed, totals);
    ++seed;
    // Routed FP4 experts (384, top-6), balanced and skewed routing.
    for (int mode : {0, 1}) {
        const char* f = mode == 0 ? "fp4-balanced" : "fp4-skewed";
        if (!sweep_format(f)) continue;
        sweep_routed({f, "experts.w1", {"experts.w1", 3, false, 2304, 5120, 0, 32}}, 384, 6, mode, seed++, totals);
        sweep_routed({f, "experts.w2", {"experts.w2", 3, false, 5120, 2304, 0, 32}}, 384, 6, mode, seed++, totals);
    }
    print_totals(totals);
}
