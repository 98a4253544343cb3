// Mixture of experts: router (fp32, bias for selection only, or hash routing by token id), clamped
// SwiGLU experts with the routing weight applied before w2, fp32 accumulation in expert order.
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/linear.h"
#include "util/error.h"
#include "util/thread_pool.h"

#include <algorithm>
#include <cmath>

namespace peregrine::cpu {

namespace {

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

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
            float a = gv / (1.0f + std::exp(-gv)) * uv;
            if (weights) a = weights[r] * a;
            g.f32()[r * I + i] = round_bf16(a);
        }
    return be.linear(g, e.w2);
}

}  // namespace

Tensor CpuBackend::moe(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids) {
    const int64_t T = x.dim(0), D = cfg_.dim;
    const int E = static_cast<int>(w.experts.size()), K = w.top_k;
    const float limit = static_cast<float>(cfg_.swiglu_limit);

    // Routing.
    Tensor logits = linear(x, w.gate);
    std::vector<int32_t> sel(static_cast<size_t>(T * K));
    std::vector<float> wsel(static_cast<size_t>(T * K));
    for (int64_t t = 0; t < T; ++t) {
        std::vector<float> score(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
        for (int e = 0; e < E; ++e) {
            float l = logits.f32()[t * E + e];
            if (cfg_.score_func == "softmax") score[e] = l;  // normalised below
            else if (cfg_.score_func == "sigmoid") score[e] = 1.0f / (1.0f + std::exp(-l));
            else score[e] = std::sqrt(softplus(l));
        }
        if (cfg_.score_func == "softmax") {
            float mx = *std::max_element(score.begin(), score.end()), sum = 0.0f;
            for (auto& v : score) sum += (v = std::exp(v - mx));
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
            if (cfg_.is_v41()) {
                if (cfg_.norm_topk_prob && K > 1) v = v / (sum + 1e-20f);
            } else if (cfg_.score_func != "softmax") {
                v = v / sum;
            }
            sel[t * K + k] = top[k];
            wsel[t * K + k] = v * static_cast<float>(cfg_.route_scale);
        }
    }

    // Experts in ascending id order, each over the rows routed to it.
    std::vector<float> y(static_cast<size_t>(T * D), 0.0f);
    for (int e = 0; e < E; ++e) {
        std::vector<int64_t> rows;
        std::vector<float> weights;
        for (int64_t t = 0; t < T; ++t)
            for (int k = 0; k < K; ++k)
                if (sel[t * K + k] == e) {
                    rows.push_back(t);
                    weights.push_back(wsel[t * K + k]);
                }
        if (rows.empty()) continue;
        Tensor xe = Tensor::zeros(DType::F32, {static_cast<int64_t>(rows.size()), D});
        for (size_t r = 0; r < rows.size(); ++r)
            std::copy(x.f32() + rows[r] * D, x.f32() + (rows[r] + 1) * D, xe.f32() + static_cast<int64_t>(r) * D);
        Tensor ye = run_expert(*this, w.experts[static_cast<size_t>(e)], xe, weights.data(), limit);
        for (size_t r = 0; r < rows.size(); ++r)
            for (int64_t c = 0; c < D; ++c) y[rows[r] * D + c] += ye.f32()[static_cast<int64_t>(r) * D + c];
    }
    Tensor shared = run_expert(*this, w.shared, x, nullptr, limit);
    Tensor out = Tensor::zeros(DType::F32, {T, D});
    for (int64_t i = 0; i < T * D; ++i) out.f32()[i] = round_bf16(y[i] + shared.f32()[i]);
    return out;
}

}  // namespace peregrine::cpu
