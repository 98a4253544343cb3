#pragma once
// Token sampling from fp32 logits: logit bias and penalties, then temperature, top-k, top-p, min-p, with
// a per-request seeded generator (same seed and logits give the same token whatever else is in the batch).
#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace peregrine {

struct SamplingParams {
    float temperature = 1.0f;  // 0: greedy
    int top_k = 0;             // 0 or negative: off
    float top_p = 1.0f;
    float min_p = 0.0f;
    int64_t seed = -1;         // -1: random
    // OpenAI penalties over the generated tokens: logit -= presence * [count > 0] + frequency * count.
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    // HF/CTRL repetition penalty over prompt and generated tokens (1: off): positive logits are divided
    // by it, negative ones multiplied.
    float repetition_penalty = 1.0f;
    std::vector<std::pair<int32_t, float>> logit_bias;  // added to the raw logits

    bool has_penalties() const {
        return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
    }
};

// Token history the penalties look at.
struct PenaltyState {
    std::unordered_map<int32_t, int> generated;  // id -> times generated
    std::vector<uint8_t> seen;                   // ids in the prompt or generated (repetition penalty)
    void add_prompt(std::span<const int32_t> ids, int vocab);
    void add_generated(int32_t id, int vocab);
};

// Applies logit_bias and the penalties in place.
void apply_logit_adjustments(float* logits, int vocab, const SamplingParams& p, const PenaltyState& st);

struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0.0f;
};

// log-softmax of `logits` at the chosen id, and the `top_n` most likely ids (best first, ties by id).
TokenLogprob chosen_logprob(const float* logits, int vocab, int32_t chosen, std::vector<TokenLogprob>* top, int top_n);

class Sampler {
public:
    explicit Sampler(const SamplingParams& p);
    // Picks a token id from logits[0..vocab).
    int32_t sample(const float* logits, int vocab);
    const SamplingParams& params() const { return p_; }

private:
    SamplingParams p_;
    std::mt19937_64 rng_;
    std::vector<double> weight_;  // per call, kept to avoid reallocating a vocabulary-sized buffer
    std::vector<int32_t> idx_;
};

// Index of the largest logit (lowest index on ties).
int32_t argmax(const float* logits, int vocab);

}  // namespace peregrine
