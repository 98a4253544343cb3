#include "ops/cpu/rope.h"
#include "tensor/dtype.h"

#include <algorithm>

namespace peregrine::cpu {

Rope::Rope(int dim, double theta, int original_seq_len, double factor, double beta_fast, double beta_slow,
           bool arch_v41)
    : dim_(dim), freqs_(static_cast<size_t>(dim / 2)) {
    const float base = static_cast<float>(theta);
    for (int i = 0; i < dim / 2; ++i) {
        float e = static_cast<float>(2 * i) / static_cast<float>(dim);
        freqs_[i] = 1.0f / std::pow(base, e);
    }
    if (original_seq_len > 0) {
        auto corrected = [&](double rotations) {
            return dim * std::log(original_seq_len / (rotations * 2 * M_PI)) / (2 * std::log(theta));
        };
        double low = std::max(std::floor(corrected(beta_fast)), 0.0);
        double high = std::min(std::ceil(corrected(beta_slow)), static_cast<double>(dim - 1));
        float denom;
        if (arch_v41) {
            denom = static_cast<float>(std::max(high - low, 1e-3));
        } else {
            if (low == high) high += 0.001;
            denom = static_cast<float>(high - low);
        }
        const float f = static_cast<float>(factor);
        for (int i = 0; i < dim / 2; ++i) {
            float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) / denom, 0.0f, 1.0f);
            float smooth = 1.0f - ramp;
            freqs_[i] = freqs_[i] / f * (1.0f - smooth) + freqs_[i] * smooth;
        }
    }
}

void Rope::apply(float* x, int64_t pos, bool inverse) const {
    const float p = static_cast<float>(pos);
    for (int i = 0; i < dim_ / 2; ++i) {
        float ang = p * freqs_[i];
        float c = std::cos(ang), s = std::sin(ang);
        if (inverse) s = -s;
        float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = round_bf16(a * c - b * s);
        x[2 * i + 1] = round_bf16(a * s + b * c);
    }
}

}  // namespace peregrine::cpu
