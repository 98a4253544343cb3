#pragma once
// Device sampling (sampling.cu): a block per row (a cluster of up to 8 blocks per row when there are few rows),
// the same kept set and draw as the host sampler (ops/sampling.h) found by radix selection over the row instead
// of sorting it.
#include "ops/sampling_math.h"

#include <cstdint>

namespace peregrine::cuda {

struct SampleRowDev {
    int64_t row = 0;               // logits row
    uint64_t seed = 0, index = 0;  // the draw
    double inv_t = 0.0;            // 0: greedy
    double top_p = 1.0;            // >= 1: off
    uint64_t min_p_weight = 0;     // 0: off
    int top_k = 0;                 // 0 or >= vocab: off
    int top_n = -1;                // -1: no logprobs; else the chosen token's and the top_n best
    int adj_begin = 0, adj_count = 0;
    sampling::Penalties pen;
};

struct SampleOutDev {
    int32_t id;
    float logprob;
};

constexpr int kSampleMaxTop = 64;
// The largest vocabulary the kernel handles (its draw keeps per-64-token sums in shared memory).
constexpr int kSampleMaxVocab = 4096 * 64;

// Adjusts the sampled rows of logits [*, vocab] in place and samples them: out[r] = (id, logprob) of row r,
// top[r * kSampleMaxTop + j] = the j-th best (id, logprob) when rows[r].top_n > j.
void sample_rows(float* logits, int vocab, const SampleRowDev* rows, int n_rows, const sampling::LogitAdjust* adj,
                 SampleOutDev* out, SampleOutDev* top);

}  // namespace peregrine::cuda
