#include "ops/cpu/cpu_backend.h"
#include "ops/rounded_math.h"
#include "ops/cpu/linear.h"
#include "util/error.h"
#include "util/thread_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <numeric>

namespace peregrine {

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& cfg, const ModelFormat& format, const StateLayout& layout) {
    return std::make_unique<cpu::CpuBackend>(cfg, format, layout);
}

namespace cpu {

float tensor_value(const Tensor& t, int64_t i) {
    switch (t.dtype()) {
        case DType::F32: return t.data<float>()[i];
        case DType::BF16: return bf16_to_f32(t.data<uint16_t>()[i]);
        default: fail("unsupported parameter dtype {}", dtype_name(t.dtype()));
    }
}

void rms_norm_row(const float* x, const float* w, int n, float eps, float* out) {
    double ss = 0.0;
    for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i] * x[i]);
    float var = static_cast<float>(ss) / static_cast<float>(n);
    float r = 1.0f / std::sqrt(var + eps);
    for (int i = 0; i < n; ++i) out[i] = round_bf16(w[i] * (x[i] * r));
}

void rms_norm_row(const float* x, const Tensor& w, int n, float eps, float* out) {
    std::vector<float> wf(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) wf[i] = tensor_value(w, i);
    rms_norm_row(x, wf.data(), n, eps, out);
}

void hadamard_bf16(float* x, int n) {
    std::vector<double> v(x, x + n);
    for (int len = 1; len < n; len <<= 1)
        for (int i = 0; i < n; i += 2 * len)
            for (int j = i; j < i + len; ++j) {
                double a = v[j], b = v[j + len];
                v[j] = a + b;
                v[j + len] = a - b;
            }
    const float scale = static_cast<float>(std::pow(static_cast<double>(n), -0.5));
    for (int i = 0; i < n; ++i) x[i] = round_bf16(static_cast<float>(v[i]) * scale);
}

std::vector<int32_t> topk_desc(const float* v, int n, int k) {
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    k = std::min(k, n);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        if (v[a] != v[b]) return v[a] > v[b];
        return a < b;
    });
    idx.resize(static_cast<size_t>(k));
    return idx;
}

CpuBackend::CpuBackend(const ModelConfig& cfg, const ModelFormat& format, const StateLayout& layout)
    : Backend(format), cfg_(cfg), layout_(layout) {}

const Rope& CpuBackend::rope_for(const AttentionLayerInfo& info) {
    auto key = std::make_pair(info.rope_theta, info.yarn);
    auto it = ropes_.find(key);
    if (it == ropes_.end())
        it = ropes_.emplace(key, Rope(cfg_.rope_head_dim, info.rope_theta, info.yarn ? cfg_.original_seq_len : 0,
                                      cfg_.rope_factor, cfg_.beta_fast, cfg_.beta_slow, format_.yarn_ramp))
                 .first;
    return it->second;
}

std::unique_ptr<StepScratch> CpuBackend::begin_step(const ForwardBatch& batch) {
    auto s = std::make_unique<CpuScratch>();
    s->topk.resize(static_cast<size_t>(batch.rows()));
    s->candidates.resize(static_cast<size_t>(batch.rows()));
    return s;
}

std::unique_ptr<StepScratch> CpuBackend::narrow_step(StepScratch& scratch, const std::vector<int>& rows) {
    auto& from = static_cast<CpuScratch&>(scratch);
    auto s = std::make_unique<CpuScratch>();
    for (int r : rows) {
        s->topk.push_back(from.topk.at(static_cast<size_t>(r)));
        s->candidates.push_back(from.candidates.at(static_cast<size_t>(r)));
    }
    return s;
}

Tensor CpuBackend::first_stream_mix(int T) {
    Tensor pre = Tensor::zeros(DType::F32, {T, cfg_.hc_mult});
    for (int t = 0; t < T; ++t) pre.f32()[t * cfg_.hc_mult] = 1.0f;
    return pre;
}

Tensor CpuBackend::gather_rows(const Tensor& x, const std::vector<int>& rows) {
    std::vector<int64_t> shape = x.shape();
    const int64_t row = x.numel() / shape[0];
    shape[0] = static_cast<int64_t>(rows.size());
    Tensor y = Tensor::zeros(DType::F32, shape);
    for (size_t r = 0; r < rows.size(); ++r)
        std::memcpy(y.f32() + static_cast<int64_t>(r) * row, x.f32() + rows[r] * row,
                    sizeof(float) * static_cast<size_t>(row));
    return y;
}

Tensor CpuBackend::embed(const Tensor& table, const std::vector<int32_t>& ids) {
    const int64_t T = static_cast<int64_t>(ids.size()), D = cfg_.dim, hc = cfg_.hc_mult;
    Tensor h = Tensor::zeros(DType::F32, {T, hc, D});
    for (int64_t t = 0; t < T; ++t) {
        int32_t id = ids[static_cast<size_t>(t)];
        if (id < 0 || id >= table.dim(0)) fail("token id {} is outside the vocabulary (0..{})", id, table.dim(0) - 1);
        float* dst = h.f32() + t * hc * D;
        for (int64_t c = 0; c < D; ++c) dst[c] = tensor_value(table, id * D + c);
        for (int64_t i = 1; i < hc; ++i) std::memcpy(dst + i * D, dst, sizeof(float) * static_cast<size_t>(D));
    }
    return h;
}

HcMix CpuBackend::hc_mixes(const Tensor& h, const HcWeight& w) {
    const int64_t T = h.dim(0), hc = cfg_.hc_mult, D = cfg_.dim, W = hc * D;
    const int64_t n_mix = w.fn.dim(0);
    HcMix m{Tensor::zeros(DType::F32, {T, hc}), Tensor::zeros(DType::F32, {T, hc}),
            Tensor::zeros(DType::F32, {T, hc, hc})};
    const float* fn = w.fn.data<float>();
    const float* base = w.base.data<float>();
    const float* scale = w.scale.data<float>();
    const float hc_eps = static_cast<float>(cfg_.hc_eps);
    parallel_for(T, [&](int64_t t0, int64_t t1) {
        std::vector<float> mixes(static_cast<size_t>(n_mix));
        for (int64_t t = t0; t < t1; ++t) {
            const float* x = h.f32() + t * W;
            double ss = 0.0;
            for (int64_t i = 0; i < W; ++i) ss += static_cast<double>(x[i] * x[i]);
            float r = 1.0f / std::sqrt(static_cast<float>(ss) / static_cast<float>(W) + eps());
            for (int64_t j = 0; j < n_mix; ++j) mixes[j] = dot_exact(x, fn + j * W, static_cast<int>(W)) * r;
            float* pre = m.pre.f32() + t * hc;
            float* post = m.post.f32() + t * hc;
            float* comb = m.comb.f32() + t * hc * hc;
            for (int i = 0; i < hc; ++i) {
                pre[i] = 1.0f / (1.0f + exp_cr(-(mixes[i] * scale[0] + base[i]))) + hc_eps;
                post[i] = 2.0f / (1.0f + exp_cr(-(mixes[hc + i] * scale[1] + base[hc + i])));
            }
            for (int a = 0; a < hc; ++a) {
                float* row = comb + a * hc;
                float mx = -INFINITY;
                for (int b = 0; b < hc; ++b) {
                    row[b] = mixes[2 * hc + a * hc + b] * scale[2] + base[2 * hc + a * hc + b];
                    mx = std::max(mx, row[b]);
                }
                float sum = 0.0f;
                for (int b = 0; b < hc; ++b) sum += (row[b] = exp_cr(row[b] - mx));
                for (int b = 0; b < hc; ++b) row[b] = row[b] / sum + hc_eps;
            }
            auto col_norm = [&] {
                for (int b = 0; b < hc; ++b) {
                    float s = 0.0f;
                    for (int a = 0; a < hc; ++a) s += comb[a * hc + b];
                    for (int a = 0; a < hc; ++a) comb[a * hc + b] /= (s + hc_eps);
                }
            };
            col_norm();
            for (int it = 0; it < cfg_.hc_sinkhorn_iters - 1; ++it) {
                for (int a = 0; a < hc; ++a) {
                    float s = 0.0f;
                    for (int b = 0; b < hc; ++b) s += comb[a * hc + b];
                    for (int b = 0; b < hc; ++b) comb[a * hc + b] /= (s + hc_eps);
                }
                col_norm();
            }
        }
    }, 4);
    return m;
}

Tensor CpuBackend::hc_collapse(const Tensor& h, const Tensor& pre) {
    const int64_t T = h.dim(0), hc = cfg_.hc_mult, D = cfg_.dim;
    Tensor y = Tensor::zeros(DType::F32, {T, D});
    for (int64_t t = 0; t < T; ++t) {
        const float* x = h.f32() + t * hc * D;
        const float* p = pre.f32() + t * hc;
        for (int64_t c = 0; c < D; ++c) {
            float s = 0.0f;
            for (int64_t i = 0; i < hc; ++i) s += p[i] * x[i * D + c];
            y.f32()[t * D + c] = round_bf16(s);
        }
    }
    return y;
}

Tensor CpuBackend::hc_expand(const Tensor& y, const Tensor& residual, const HcMix& mix) {
    const int64_t T = y.dim(0), hc = cfg_.hc_mult, D = cfg_.dim;
    Tensor out = Tensor::zeros(DType::F32, {T, hc, D});
    for (int64_t t = 0; t < T; ++t) {
        const float* yt = y.f32() + t * D;
        const float* r = residual.f32() + t * hc * D;
        const float* post = mix.post.f32() + t * hc;
        const float* comb = mix.comb.f32() + t * hc * hc;
        float* o = out.f32() + t * hc * D;
        for (int64_t j = 0; j < hc; ++j)
            for (int64_t c = 0; c < D; ++c) {
                float s = 0.0f;
                for (int64_t i = 0; i < hc; ++i) s += comb[i * hc + j] * r[i * D + c];
                o[j * D + c] = round_bf16(post[j] * yt[c] + s);
            }
    }
    return out;
}

Tensor CpuBackend::hc_head(const Tensor& h, const HcWeight& w) {
    const int64_t T = h.dim(0), hc = cfg_.hc_mult, D = cfg_.dim, W = hc * D;
    Tensor pre = Tensor::zeros(DType::F32, {T, hc});
    const float hc_eps = static_cast<float>(cfg_.hc_eps);
    for (int64_t t = 0; t < T; ++t) {
        const float* x = h.f32() + t * W;
        double ss = 0.0;
        for (int64_t i = 0; i < W; ++i) ss += static_cast<double>(x[i] * x[i]);
        float r = 1.0f / std::sqrt(static_cast<float>(ss) / static_cast<float>(W) + eps());
        for (int64_t j = 0; j < hc; ++j) {
            float mix = dot_exact(x, w.fn.data<float>() + j * W, static_cast<int>(W)) * r;
            pre.f32()[t * hc + j] =
                1.0f / (1.0f + exp_cr(-(mix * w.scale.data<float>()[0] + w.base.data<float>()[j]))) + hc_eps;
        }
    }
    return hc_collapse(h, pre);
}

Tensor CpuBackend::rms_norm(const Tensor& x, const Tensor& w) {
    const int64_t T = x.numel() / x.dim(-1), D = x.dim(-1);
    Tensor y = Tensor::zeros(DType::F32, x.shape());
    std::vector<float> wf(static_cast<size_t>(D));
    for (int64_t i = 0; i < D; ++i) wf[i] = tensor_value(w, i);
    for (int64_t t = 0; t < T; ++t)
        rms_norm_row(x.f32() + t * D, wf.data(), static_cast<int>(D), eps(), y.f32() + t * D);
    return y;
}

Tensor CpuBackend::hc_mean(const Tensor& h) {
    const int64_t T = h.dim(0), hc = cfg_.hc_mult, D = cfg_.dim;
    Tensor y = Tensor::zeros(DType::F32, {T, D});
    for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < D; ++c) {
            float s = 0.0f;
            for (int64_t i = 0; i < hc; ++i) s += h.f32()[(t * hc + i) * D + c];
            y.f32()[t * D + c] = round_bf16(s / static_cast<float>(hc));
        }
    return y;
}

Tensor CpuBackend::concat_cols(const std::vector<Tensor>& parts) {
    const int64_t T = parts.at(0).dim(0);
    int64_t width = 0;
    for (auto& p : parts) width += p.numel() / T;
    Tensor y = Tensor::zeros(DType::F32, {T, width});
    int64_t off = 0;
    for (auto& p : parts) {
        const int64_t w = p.numel() / T;
        for (int64_t t = 0; t < T; ++t)
            std::memcpy(y.f32() + t * width + off, p.f32() + t * w, sizeof(float) * static_cast<size_t>(w));
        off += w;
    }
    return y;
}

Tensor CpuBackend::linear(const Tensor& x, const LinearWeight& w) {
    const int64_t M = x.numel() / w.in;
    Tensor y = Tensor::zeros(DType::F32, {M, w.out});
    cpu::linear(x.f32(), M, w, y.f32());
    return y;
}

Tensor CpuBackend::logits(const Tensor& x, const LinearWeight& head, bool) {
    // The head runs in fp32 on the (bf16-stored) weights, as the reference upcasts them.
    const int64_t M = x.dim(0), N = head.out, K = head.in;
    Tensor y = Tensor::zeros(DType::F32, {M, N});
    parallel_for(N, [&](int64_t n0, int64_t n1) {
        std::vector<float> wr(static_cast<size_t>(K));
        for (int64_t n = n0; n < n1; ++n) {
            for (int64_t k = 0; k < K; ++k) wr[k] = tensor_value(head.w, n * K + k);
            for (int64_t m = 0; m < M; ++m)
                y.f32()[m * N + n] = dot_exact(x.f32() + m * K, wr.data(), static_cast<int>(K));
        }
    }, 64);
    return y;
}

}  // namespace cpu
}  // namespace peregrine
