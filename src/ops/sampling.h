#pragma once
// Token sampling from fp32 logits: logit bias and penalties, then temperature, top-k, top-p, min-p, with
// a per-request seeded counter-based generator (same seed and logits give the same token whatever else is
// in the batch, on the host and on the device: see ops/sampling_math.h for the arithmetic both share).
//
// The kept set, over the adjusted logits l, with ranking by (logit descending, id ascending) and integer
// weights W = floor(exp((l - max) / T) * 2^44):
//  1. top-k (0 < k < vocab): the k best-ranked tokens; their total weight normalises top-p (the whole
//     vocabulary's when top-k is off);
//  2. min-p (> 0): of those, the tokens with W >= min_p * 2^44, and always the best one;
//  3. top-p (< 1): of those in rank order, the shortest prefix whose cumulative weight reaches top_p x the
//     total of step 1 (all of them when it never does).
// The token is then drawn with probability W / (kept total) by inverse CDF over the kept tokens in id
// order, from one 64-bit Philox4x32-10 draw keyed by the seed at counter = the request's sample index.
// Temperature <= 0 (or a non-finite best logit) is greedy: the best-ranked token.
// Ties: ranking by logit then lower id (-0 equals +0, NaN ranks below -inf), so top-k, top-p and top-n cut
// between equal logits by id. Rounding: the kept set and the draw use only integers and correctly rounded
// double operations (ops/sampling_math.h), so host and device agree bit for bit; only logprobs (library
// exp/log in double, sums in another order) may differ, by about 1e-7.
#include "ops/sampling_math.h"

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace peregrine {

using sampling::LogitAdjust;

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
void apply_adjustments(float* logits, int vocab, std::span<const LogitAdjust> adj, const sampling::Penalties& pen);
// Applies logit_bias and the penalties in place.
void apply_logit_adjustments(float* logits, int vocab, const SamplingParams& p, const PenaltyState& st);

struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0.0f;
};

// log-softmax of `logits` at the chosen id, and the `top_n` most likely ids (best first, ties by id).
TokenLogprob chosen_logprob(const float* logits, int vocab, int32_t chosen, std::vector<TokenLogprob>* top, int top_n);

// The truncation and temperature of one draw, in the form both samplers take.
struct SampleConfig {
    double inv_t = 0.0;     // 1 / temperature; 0: greedy
    int top_k = 0;          // 0: off (also when >= vocab)
    double top_p = 1.0;     // >= 1: off
    uint64_t min_p_weight = 0;  // min_p * 2^44; 0: off
};
SampleConfig sample_config(const SamplingParams& p);

// Reused buffers of the host sampler (vocabulary-sized).
struct SampleScratch {
    std::vector<uint64_t> weight;
    std::vector<uint64_t> keys;
    std::vector<float> row;
};

// The token drawn from logits[0..vocab) with the `index`-th random draw of `seed` (see the top of this file).
int32_t sample_token(const float* logits, int vocab, const SampleConfig& c, uint64_t seed, uint64_t index,
                     SampleScratch& scratch);

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

// Index of the largest logit (lowest index on ties).
int32_t argmax(const float* logits, int vocab);

// One row of a batched sampling call (Backend::sample): the logits row, its adjustments, the draw and what
// to report.
struct SampleRow {
    int row = 0;                       // row of the logits tensor
    std::vector<LogitAdjust> adjust;   // sorted by id, unique ids (logit_adjustments)
    sampling::Penalties penalties;
    SampleConfig config;
    uint64_t seed = 0, index = 0;
    bool logprobs = false;             // report the chosen token's log-softmax
    int top_logprobs = 0;              // and the n best (at most kMaxTopLogprobs)
};
constexpr int kMaxTopLogprobs = 64;

struct SampleResult {
    int32_t id = 0;
    float logprob = 0.0f;
    std::vector<TokenLogprob> top;
};

// The host sampler over a [rows, vocab] host logits tensor (the CPU backend's Backend::sample, and the
// reference for the device one). Rows are adjusted in a copy; `logits` is not changed.
std::vector<SampleResult> sample_rows_host(const float* logits, int vocab, const std::vector<SampleRow>& rows);

}  // namespace peregrine
