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

void PenaltyState::add_prompt(std::span<const int32_t> ids, int vocab) {
    if (seen.empty()) seen.assign(static_cast<size_t>(vocab), 0);
    for (int32_t id : ids)
        if (id >= 0 && id < vocab) seen[static_cast<size_t>(id)] = 1;
}

void PenaltyState::add_generated(int32_t id, int vocab) {
    if (seen.empty()) seen.assign(static_cast<size_t>(vocab), 0);
    ++generated[id];
    if (id >= 0 && id < vocab) seen[static_cast<size_t>(id)] = 1;
}

void apply_logit_adjustments(float* logits, int vocab, const SamplingParams& p, const PenaltyState& st) {
    for (auto [id, bias] : p.logit_bias)
        if (id >= 0 && id < vocab) logits[id] += bias;
    if (p.repetition_penalty != 1.0f && !st.seen.empty()) {
        for (int i = 0; i < vocab; ++i)
            if (st.seen[static_cast<size_t>(i)])
                logits[i] = logits[i] > 0.0f ? logits[i] / p.repetition_penalty : logits[i] * p.repetition_penalty;
    }
    if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
        for (auto [id, count] : st.generated)
            if (id >= 0 && id < vocab) logits[id] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
    }
}

TokenLogprob chosen_logprob(const float* logits, int vocab, int32_t chosen, std::vector<TokenLogprob>* top, int top_n) {
    double mx = -INFINITY;
    for (int i = 0; i < vocab; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
    const double lse = mx + std::log(sum);
    auto lp = [&](int32_t id) { return static_cast<float>(static_cast<double>(logits[id]) - lse); };
    if (top && top_n > 0) {
        std::vector<int32_t> idx(static_cast<size_t>(vocab));
        std::iota(idx.begin(), idx.end(), 0);
        const size_t n = std::min(idx.size(), static_cast<size_t>(top_n));
        std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(n), idx.end(), [&](int32_t a, int32_t b) {
            return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
        });
        top->clear();
        for (size_t i = 0; i < n; ++i) top->push_back({idx[i], lp(idx[i])});
    }
    return {chosen, lp(chosen)};
}

Sampler::Sampler(const SamplingParams& p)
    : p_(p), rng_(p.seed >= 0 ? static_cast<uint64_t>(p.seed) : std::random_device{}()) {}

int32_t Sampler::sample(const float* logits, int vocab) {
    if (p_.temperature <= 0.0f) return argmax(logits, vocab);
    // Weights exp((l - max) / T) in double; the best token weighs 1. Only truncation (top-k, top-p, min-p)
    // needs the candidates in logit order, and then only a prefix of them: it is sorted in growing
    // prefixes (ties by id, so the order is deterministic) instead of sorting the whole vocabulary.
    const double inv_t = 1.0 / p_.temperature;
    const float mx = logits[argmax(logits, vocab)];
    weight_.resize(static_cast<size_t>(vocab));
    for (int i = 0; i < vocab; ++i) weight_[static_cast<size_t>(i)] = std::exp((logits[i] - mx) * inv_t);
    const size_t V = static_cast<size_t>(vocab);
    const size_t k = p_.top_k > 0 ? std::min(V, static_cast<size_t>(p_.top_k)) : V;
    const bool truncate = k < V || p_.top_p < 1.0f || p_.min_p > 0.0f;
    auto draw = [&](double mass) { return std::uniform_real_distribution<double>(0.0, mass)(rng_); };
    if (!truncate) {  // the whole softmax, walked in id order
        double total = 0.0;
        for (double w : weight_) total += w;
        double u = draw(total);
        for (size_t i = 0; i < V; ++i) {
            u -= weight_[i];
            if (u <= 0.0) return static_cast<int32_t>(i);
        }
        return argmax(logits, vocab);
    }
    auto by_logit = [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
    idx_.resize(V);
    std::iota(idx_.begin(), idx_.end(), 0);
    // The top-k set's total normalises top-p (the whole vocabulary's when top-k is off).
    double total = 0.0;
    size_t sorted = std::min(k, static_cast<size_t>(1024));
    if (k < V) {
        std::partial_sort(idx_.begin(), idx_.begin() + static_cast<long>(k), idx_.end(), by_logit);
        for (size_t i = 0; i < k; ++i) total += weight_[static_cast<size_t>(idx_[i])];
        sorted = k;
    } else {
        for (double w : weight_) total += w;
        std::partial_sort(idx_.begin(), idx_.begin() + static_cast<long>(sorted), idx_.end(), by_logit);
    }
    // n: candidates kept. min-p drops those below min_p x the best; top-p keeps the shortest prefix whose
    // mass reaches top_p. Either cut found inside the sorted prefix settles n; else sort a longer prefix.
    size_t n;
    for (;;) {
        n = sorted;
        bool settled = sorted == k;
        for (size_t i = 0; i < sorted; ++i)
            if (i > 0 && p_.min_p > 0.0f && weight_[static_cast<size_t>(idx_[i])] < p_.min_p) {
                n = i;
                settled = true;
                break;
            }
        if (p_.top_p < 1.0f) {
            double cum = 0.0;
            for (size_t i = 0; i < n; ++i) {
                cum += weight_[static_cast<size_t>(idx_[i])] / total;
                if (cum >= p_.top_p) {
                    n = i + 1;
                    settled = true;
                    break;
                }
            }
        }
        if (settled) break;
        const size_t more = std::min(k, sorted * 8);
        std::partial_sort(idx_.begin() + static_cast<long>(sorted), idx_.begin() + static_cast<long>(more), idx_.end(), by_logit);
        sorted = more;
    }
    double mass = 0.0;
    for (size_t i = 0; i < n; ++i) mass += weight_[static_cast<size_t>(idx_[i])];
    double u = draw(mass);
    for (size_t i = 0; i < n; ++i) {
        u -= weight_[static_cast<size_t>(idx_[i])];
        if (u <= 0.0) return idx_[i];
    }
    return idx_[n - 1];
}

}  // namespace peregrine
