#include "engine/sampling_params.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace peregrine {

SamplingParams sampling_defaults(const GenerationConfig& g) {
    SamplingParams s;
    if (g.temperature) s.temperature = static_cast<float>(*g.temperature);
    if (g.top_p) s.top_p = static_cast<float>(*g.top_p);
    if (g.top_k) s.top_k = *g.top_k;
    if (g.min_p) s.min_p = static_cast<float>(*g.min_p);
    if (g.repetition_penalty) s.repetition_penalty = static_cast<float>(*g.repetition_penalty);
    return s;
}

void PenaltyState::add_prompt(std::span<const int32_t> ids, int vocab) {
    if (seen.empty()) seen.assign(static_cast<size_t>(vocab), 0);
    for (int32_t id : ids)
        if (id >= 0 && id < vocab && !seen[static_cast<size_t>(id)]) {
            seen[static_cast<size_t>(id)] = 1;
            seen_ids.push_back(id);
        }
}

void PenaltyState::add_generated(int32_t id, int vocab) {
    if (seen.empty()) seen.assign(static_cast<size_t>(vocab), 0);
    ++generated[id];
    if (id >= 0 && id < vocab && !seen[static_cast<size_t>(id)]) {
        seen[static_cast<size_t>(id)] = 1;
        seen_ids.push_back(id);
    }
}

sampling::Penalties penalties_of(const SamplingParams& p) {
    return {p.repetition_penalty, p.presence_penalty, p.frequency_penalty};
}

std::vector<LogitAdjust> logit_adjustments(const SamplingParams& p, const PenaltyState& st,
                                           std::span<const int32_t> masked, int vocab) {
    std::vector<LogitAdjust> raw;
    auto add = [&](int32_t id) -> LogitAdjust& {
        raw.push_back({});
        raw.back().id = id;
        return raw.back();
    };
    for (auto [id, bias] : p.logit_bias)
        if (id >= 0 && id < vocab) {
            auto& a = add(id);
            a.bias = bias;
            a.flags = LogitAdjust::kBiased;
        }
    if (p.repetition_penalty != 1.0f)
        for (int32_t id : st.seen_ids) add(id).flags = LogitAdjust::kSeen;
    if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
        for (auto [id, count] : st.generated)
            if (id >= 0 && id < vocab) add(id).count = count;
    for (int32_t id : masked)
        if (id >= 0 && id < vocab) add(id).flags = LogitAdjust::kMasked;
    // One entry per id (stable: logit_bias entries of an id are summed in the order given).
    std::stable_sort(raw.begin(), raw.end(), [](const LogitAdjust& a, const LogitAdjust& b) { return a.id < b.id; });
    std::vector<LogitAdjust> out;
    for (const auto& a : raw) {
        if (out.empty() || out.back().id != a.id) {
            out.push_back(a);
            continue;
        }
        auto& m = out.back();
        if ((a.flags & LogitAdjust::kBiased) && (m.flags & LogitAdjust::kBiased)) m.bias = m.bias + a.bias;
        else if (a.flags & LogitAdjust::kBiased) m.bias = a.bias;
        m.flags |= a.flags;
        m.count += a.count;
    }
    return out;
}

void apply_logit_adjustments(float* logits, int vocab, const SamplingParams& p, const PenaltyState& st) {
    apply_adjustments(logits, vocab, logit_adjustments(p, st, {}, vocab), penalties_of(p));
}

SampleConfig sample_config(const SamplingParams& p) {
    SampleConfig c;
    if (!(p.temperature > 0.0f)) return c;  // greedy
    c.inv_t = 1.0 / static_cast<double>(p.temperature);
    c.top_k = std::max(p.top_k, 0);
    c.top_p = static_cast<double>(p.top_p);
    if (p.min_p > 0.0f)  // W >= min_p * 2^44 (an exact product) for an integer W
        c.min_p_weight =
            static_cast<uint64_t>(std::ceil(std::min(static_cast<double>(p.min_p), 2.0) * sampling::kWeightOne));
    return c;
}

Sampler::Sampler(const SamplingParams& p) : p_(p), config_(sample_config(p)) {
    if (p.seed >= 0) {
        seed_ = static_cast<uint64_t>(p.seed);
    } else {
        std::random_device rd;
        seed_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
}

int32_t Sampler::sample(const float* logits, int vocab) {
    return sample_token(logits, vocab, config_, seed_, index_++, scratch_);
}

}  // namespace peregrine
