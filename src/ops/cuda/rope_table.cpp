#include "ops/cuda/rope_table.h"

#include <algorithm>
#include <cmath>

namespace peregrine::cuda {

std::vector<float> rope_frequencies(int dim, double theta, int original_seq_len, double factor, double beta_fast,
                                    double beta_slow, bool arch_v41) {
    std::vector<float> freqs(static_cast<size_t>(dim / 2));
    const float base = static_cast<float>(theta);
    for (int i = 0; i < dim / 2; ++i) freqs[i] = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
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
            freqs[i] = freqs[i] / f * (1.0f - smooth) + freqs[i] * smooth;
        }
    }
    return freqs;
}

}  // namespace peregrine::cuda
