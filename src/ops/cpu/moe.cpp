// Mixture of experts: router (fp32, bias for selection only, or hash routing by token id), clamped
// SwiGLU experts with the routing weight applied before w2, fp32 accumulation in expert order. moe() is
// the router, the experts over the (row, slot) pairs and the combine, which expert parallelism runs apart.
#include "ops/rounded_math.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/linear.h"
#include "util/error.h"
#include "util/thread_pool.h"

#include <algorithm>
#include <cmath>

namespace peregrine::cpu {

namespace {

float softplus(float x) { return x > 20.0f ? x : log1p_cr(exp_cr(x)); }

// SwiGLU expert on the rows `x` [n, dim]; `weights` (per row) multiplies the activation before w2.
Tensor run_expert(Backend& be, const ExpertWeight& e, const Tensor& x, const float* weights, float limit) {
    Tensor g = be.linear(x, e.w1), u = be.linear(x, e.w3);
    const int64_t n = x.dim(0), I = e.w1.out;
    for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < I; ++i) {
            float gv = g.f32()[r * I + i], uv = u.f32()[r * I + i];
            if (limit > 0.0f) {
                uv = std::clamp(uv, -limit, limit);
                gv = std::min(gv, limit);
            }
            float a = gv / (1.0f + exp_cr(-gv)) * uv;
            if (weights) a = weights[r] * a;
            g.f32()[r * I + i] = round_bf16(a);
        }
    return be.linear(g, e.w2);
}

}  // namespace

MoeRoute CpuBackend::moe_route(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids) {
    const int64_t T = x.dim(0);
    const int E = static_cast<int>(w.experts.size()), K = w.top_k;
    Tensor logits = linear(x, w.gate);
    MoeRoute r{Tensor::zeros(DType::I32, {T * K}), Tensor::zeros(DType::F32, {T * K})};
    int32_t* sel = r.experts.data<int32_t>();
    float* wsel = r.weights.f32();
    for (int64_t t = 0; t < T; ++t) {
        std::vector<float> score(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
        for (int e = 0; e < E; ++e) {
            float l = logits.f32()[t * E + e];
            if (cfg_.score_func == "softmax") score[e] = l;  // normalised below
            else if (cfg_.score_func == "sigmoid") score[e] = 1.0f / (1.0f + exp_cr(-l));
            else score[e] = std::sqrt(softplus(l));
        }
        if (cfg_.score_func == "softmax") {
            float mx = *std::max_element(score.begin(), score.end()), sum = 0.0f;
            for (auto& v : score) sum += (v = exp_cr(v - mx));
            for (auto& v : score) v /= sum;
        }
        std::vector<int32_t> top;
        if (!w.tid2eid.empty()) {  // hash routing: experts fixed per token id
            const int64_t* row = w.tid2eid.data<int64_t>() + static_cast<int64_t>(ids.at(static_cast<size_t>(t))) * K;
            for (int k = 0; k < K; ++k) top.push_back(static_cast<int32_t>(row[k]));
        } else {
            for (int e = 0; e < E; ++e) biased[e] = w.bias.empty() ? score[e] : score[e] + w.bias.data<float>()[e];
            top = topk_desc(biased.data(), E, K);
        }
        float sum = 0.0f;
        for (int k = 0; k < K; ++k) sum += score[top[k]];
        for (int k = 0; k < K; ++k) {
            float v = score[top[k]];
            if (format_.route_norm == RouteNorm::kSumIfSeveral) {
                if (K > 1) v = v / (sum + 1e-20f);
            } else if (format_.route_norm == RouteNorm::kSum) {
                v = v / sum;
            }
            sel[t * K + k] = top[k];
            wsel[t * K + k] = v * static_cast<float>(cfg_.route_scale);
        }
    }
    return r;
}

Tensor CpuBackend::moe_experts(const Tensor& xp, const MoEWeight& w, const Tensor& experts, const Tensor& weights) {
    const int64_t P = xp.dim(0), D = cfg_.dim;
    const int E = static_cast<int>(w.experts.size());
    const float limit = static_cast<float>(cfg_.swiglu_limit);
    const int32_t* sel = experts.data<int32_t>();
    Tensor y = Tensor::zeros(DType::F32, {P, D});
    // Each expert over its pairs, in pair order.
    std::vector<std::vector<int64_t>> rows(static_cast<size_t>(E));
    for (int64_t p = 0; p < P; ++p) {
        PEREGRINE_CHECK(sel[p] >= 0 && sel[p] < E, "pair {} routed to expert {} of {}", p, sel[p], E);
        rows[static_cast<size_t>(sel[p])].push_back(p);
    }
    for (int e = 0; e < E; ++e) {
        const auto& rs = rows[static_cast<size_t>(e)];
        if (rs.empty()) continue;
        const ExpertWeight& ew = w.experts[static_cast<size_t>(e)];
        PEREGRINE_CHECK(!ew.w1.empty(), "expert {} is not held by this rank", e);
        const int64_t n = static_cast<int64_t>(rs.size());
        Tensor xe = Tensor::zeros(DType::F32, {n, D});
        std::vector<float> we(static_cast<size_t>(n));
        for (int64_t r = 0; r < n; ++r) {
            std::copy(xp.f32() + rs[r] * D, xp.f32() + (rs[r] + 1) * D, xe.f32() + r * D);
            we[static_cast<size_t>(r)] = weights.f32()[rs[r]];
        }
        Tensor ye = run_expert(*this, ew, xe, we.data(), limit);
        for (int64_t r = 0; r < n; ++r) std::copy(ye.f32() + r * D, ye.f32() + (r + 1) * D, y.f32() + rs[r] * D);
    }
    return y;
}

Tensor CpuBackend::moe_combine(const Tensor& x, const MoEWeight& w, const Tensor& ye, const Tensor& experts) {
    const int64_t T = x.dim(0), D = cfg_.dim;
    const int K = w.top_k;
    const int32_t* sel = experts.data<int32_t>();
    Tensor shared = run_expert(*this, w.shared, x, nullptr, static_cast<float>(cfg_.swiglu_limit));
    Tensor out = Tensor::zeros(DType::F32, {T, D});
    std::vector<int> order(static_cast<size_t>(K));
    std::vector<float> y(static_cast<size_t>(D));
    for (int64_t t = 0; t < T; ++t) {
        // fp32 sum in ascending expert order (slot order among equal experts).
        for (int k = 0; k < K; ++k) order[static_cast<size_t>(k)] = k;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sel[t * K + a] < sel[t * K + b]; });
        std::fill(y.begin(), y.end(), 0.0f);
        for (int k : order) {
            const float* row = ye.f32() + (t * K + k) * D;
            for (int64_t c = 0; c < D; ++c) y[static_cast<size_t>(c)] += row[c];
        }
        for (int64_t c = 0; c < D; ++c)
            out.f32()[t * D + c] = round_bf16(y[static_cast<size_t>(c)] + shared.f32()[t * D + c]);
    }
    return out;
}

Tensor CpuBackend::moe(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids) {
    const int64_t T = x.dim(0);
    const int K = w.top_k;
    MoeRoute r = moe_route(x, w, ids);
    std::vector<int> pair_rows(static_cast<size_t>(T * K));
    for (int64_t p = 0; p < T * K; ++p) pair_rows[static_cast<size_t>(p)] = static_cast<int>(p / K);
    Tensor ye = moe_experts(gather_rows(x, pair_rows), w, r.experts, r.weights);
    return moe_combine(x, w, ye, r.experts);
}

Tensor CpuBackend::to_host_copy(const Tensor& t) { return t; }
Tensor CpuBackend::from_host_copy(const Tensor& host) { return host; }

}  // namespace peregrine::cpu
