#pragma once
// Token sampling from fp32 logits: a row's adjustments (logit bias, penalties, masks), then temperature, top-k,
// top-p, min-p, and a seeded counter-based draw (the same seed, index and logits give the same token whatever else
// is in the batch, on the host and on the device: see ops/sampling_math.h for the arithmetic both share). The
// parameters and the history penalties see are chosen above ops (engine/sampling_params.h).
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
#include <span>
#include <vector>

namespace peregrine {

using sampling::LogitAdjust;

// Applies a row's adjustments (sorted by id, one entry per id) in place.
void apply_adjustments(float* logits, int vocab, std::span<const LogitAdjust> adj, const sampling::Penalties& pen);

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

// Reused buffers of the host sampler (vocabulary-sized).
struct SampleScratch {
    std::vector<uint64_t> weight;
    std::vector<uint64_t> keys;
    std::vector<float> row;
};

// The token drawn from logits[0..vocab) with the `index`-th random draw of `seed` (see the top of this file).
int32_t sample_token(const float* logits, int vocab, const SampleConfig& c, uint64_t seed, uint64_t index,
                     SampleScratch& scratch);

// Index of the largest logit (lowest index on ties).
int32_t argmax(const float* logits, int vocab);

// One row of a batched sampling call (DeviceSampler::sample): the logits row, its adjustments, the draw and what
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

// The host sampler over a [rows, vocab] host logits tensor (the CPU backend's, and the reference for the device
// one). Rows are adjusted in a copy; `logits` is not changed.
std::vector<SampleResult> sample_rows_host(const float* logits, int vocab, const std::vector<SampleRow>& rows);

}  // namespace peregrine
