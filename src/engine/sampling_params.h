#pragma once
// A request's sampling policy: its parameters, the token history its penalties look at, the logit adjustments
// they make for its next row, and its seeded generator (the same seed and logits give the same token whatever
// else is in the batch, on the host and on the device: ops/sampling.h has the draw both share).
#include "io/generation_config.h"
#include "ops/sampling.h"

#include <cstdint>
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
    int64_t seed = -1;         // -1: random, drawn once per request
    // OpenAI penalties over the generated tokens: logit -= presence * [count > 0] + frequency * count.
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    // HF/CTRL repetition penalty over prompt and generated tokens (1: off): positive logits are divided
    // by it, negative ones multiplied.
    float repetition_penalty = 1.0f;
    std::vector<std::pair<int32_t, float>> logit_bias;  // added to the raw logits (repeated ids: summed first)

    bool has_penalties() const {
        return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
    }
};

// The parameters a request starts from: the model's generation_config.json values where it has them.
SamplingParams sampling_defaults(const GenerationConfig& g);

// Token history the penalties look at.
struct PenaltyState {
    std::unordered_map<int32_t, int> generated;  // id -> times generated
    std::vector<uint8_t> seen;                   // ids in the prompt or generated (repetition penalty)
    std::vector<int32_t> seen_ids;               // the same ids, each once, in first-seen order
    void add_prompt(std::span<const int32_t> ids, int vocab);
    void add_generated(int32_t id, int vocab);
};

// The per-token adjustments of a request's next logits row, sorted by id, one entry per id: its logit_bias,
// its penalties (only when they are on) and -inf for the `masked` ids.
std::vector<LogitAdjust> logit_adjustments(const SamplingParams& p, const PenaltyState& st,
                                           std::span<const int32_t> masked, int vocab);
sampling::Penalties penalties_of(const SamplingParams& p);
// Applies logit_bias and the penalties in place.
void apply_logit_adjustments(float* logits, int vocab, const SamplingParams& p, const PenaltyState& st);
// The truncation and temperature of a draw.
SampleConfig sample_config(const SamplingParams& p);

// A request's generator: its seed (drawn once when the request has none) and the index of its next draw.
class Sampler {
public:
    explicit Sampler(const SamplingParams& p);
    // Picks a token id from logits[0..vocab) with the next draw of the request's generator.
    int32_t sample(const float* logits, int vocab);
    const SamplingParams& params() const { return p_; }
    uint64_t seed() const { return seed_; }
    const SampleConfig& config() const { return config_; }
    // The index of the next draw, and taking it (a draw made elsewhere, e.g. on the device).
    uint64_t next_index() const { return index_; }
    uint64_t take_index() { return index_++; }

private:
    SamplingParams p_;
    SampleConfig config_;
    uint64_t seed_ = 0, index_ = 0;
    SampleScratch scratch_;
};

}  // namespace peregrine
