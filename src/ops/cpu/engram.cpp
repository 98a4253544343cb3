// Engram: n-gram hash rows (fp8 table) projected to one key per hc copy and a shared value, added to the
// residual stream through a gate that measures how well the key matches each copy.
#include "ops/rounded_math.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/linear.h"

#include <cmath>

namespace peregrine::cpu {

void CpuBackend::engram(Tensor& h, const EngramWeight& w, const std::vector<int64_t>& rows) {
    const int64_t T = h.dim(0), hc = cfg_.hc_mult, D = cfg_.dim, hd = w.head_dim, ncol = w.n_cols;
    Tensor emb = Tensor::zeros(DType::F32, {T, ncol * hd});
    const uint8_t* tab = w.table.data<uint8_t>();
    const uint8_t* sc = w.table_scale.data<uint8_t>();
    for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < ncol; ++c) {
            int64_t r = rows[static_cast<size_t>(t * ncol + c)];
            float* dst = emb.f32() + (t * ncol + c) * hd;
            for (int64_t i = 0; i < hd; ++i)
                dst[i] = round_bf16(e4m3_to_f32(tab[r * hd + i]) * e8m0_to_f32(sc[r * (hd / 32) + i / 32]));
        }
    Tensor kv = linear(emb, w.wkv);  // [T, (hc+1)*D]
    const float e = eps();
    const float inv_sqrt_d = static_cast<float>(std::pow(static_cast<double>(D), -0.5));
    std::vector<float> wgt(static_cast<size_t>(hc * D));
    for (int64_t i = 0; i < hc * D; ++i) wgt[i] = tensor_value(w.q_weight, i) * tensor_value(w.k_weight, i);
    for (int64_t t = 0; t < T; ++t) {
        const float* key_all = kv.f32() + t * (hc + 1) * D;
        const float* value = key_all + hc * D;
        for (int64_t i = 0; i < hc; ++i) {
            float* x = h.f32() + (t * hc + i) * D;
            const float* key = key_all + i * D;
            const float* wi = wgt.data() + i * D;
            double hs = 0.0, ks = 0.0, dot = 0.0;
            for (int64_t c = 0; c < D; ++c) {
                hs += static_cast<double>(x[c] * x[c]);
                ks += static_cast<double>(key[c] * key[c]);
                dot += static_cast<double>(x[c] * wi[c] * key[c]);
            }
            float rstd =
                (1.0f / std::sqrt(static_cast<float>(hs) / D + e)) * (1.0f / std::sqrt(static_cast<float>(ks) / D + e));
            float d = static_cast<float>(dot) * rstd * inv_sqrt_d;
            float g = 1.0f / (1.0f + exp_cr(-std::copysign(std::sqrt(std::max(std::fabs(d), 1e-6f)), d)));
            for (int64_t c = 0; c < D; ++c) x[c] = round_bf16(x[c] + g * value[c]);
        }
    }
}

}  // namespace peregrine::cpu
