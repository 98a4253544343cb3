#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace peregrine {

int32_t argmax(const float* logits, int vocab) {
    int32_t best = 0;
    for (int i = 1; i < vocab; ++i)
        if (logits[i] > logits[best]) best = i;
    return best;
}

Sampler::Sampler(const SamplingParams& p)
    : p_(p), rng_(p.seed >= 0 ? static_cast<uint64_t>(p.seed) : std::random_device{}()) {}

int32_t Sampler::sample(const float* logits, int vocab) {
    if (p_.temperature <= 0.0f) return argmax(logits, vocab);
    // Candidates sorted by logit (ties by id, so the order is deterministic).
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    size_t keep = idx.size();
    if (p_.top_k > 0) keep = std::min(keep, static_cast<size_t>(p_.top_k));
    auto by_logit = [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
    if (keep < idx.size()) {
        std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(keep), idx.end(), by_logit);
        idx.resize(keep);
    } else {
        std::sort(idx.begin(), idx.end(), by_logit);
    }
    // Softmax at temperature over the candidates (double for stable sums).
    const double inv_t = 1.0 / p_.temperature, mx = logits[idx[0]];
    std::vector<double> prob(idx.size());
    double total = 0.0;
    for (size_t i = 0; i < idx.size(); ++i) total += (prob[i] = std::exp((logits[idx[i]] - mx) * inv_t));
    for (auto& v : prob) v /= total;
    size_t n = idx.size();
    if (p_.min_p > 0.0f) {
        const double floor = p_.min_p * prob[0];
        while (n > 1 && prob[n - 1] < floor) --n;
    }
    if (p_.top_p < 1.0f) {
        double cum = 0.0;
        for (size_t i = 0; i < n; ++i) {
            cum += prob[i];
            if (cum >= p_.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    double mass = 0.0;
    for (size_t i = 0; i < n; ++i) mass += prob[i];
    double u = std::uniform_real_distribution<double>(0.0, mass)(rng_);
    for (size_t i = 0; i < n; ++i) {
        u -= prob[i];
        if (u <= 0.0) return idx[i];
    }
    return idx[n - 1];
}

}  // namespace peregrine
