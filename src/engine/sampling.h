#pragma once
// Token sampling from fp32 logits: temperature, top-k, top-p, min-p, with a per-request seeded generator
// (same seed and logits give the same token whatever else is in the batch).
#include <cstdint>
#include <random>
#include <vector>

namespace peregrine {

struct SamplingParams {
    float temperature = 1.0f;  // 0: greedy
    int top_k = 0;             // 0 or negative: off
    float top_p = 1.0f;
    float min_p = 0.0f;
    int64_t seed = -1;         // -1: random
};

class Sampler {
public:
    explicit Sampler(const SamplingParams& p);
    // Picks a token id from logits[0..vocab).
    int32_t sample(const float* logits, int vocab);
    const SamplingParams& params() const { return p_; }

private:
    SamplingParams p_;
    std::mt19937_64 rng_;
};

// Index of the largest logit (lowest index on ties).
int32_t argmax(const float* logits, int vocab);

}  // namespace peregrine
