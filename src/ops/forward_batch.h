#pragma once
// One forward step's input: the sequences it feeds, their new tokens packed as rows, and what kind of step it is.
#include "kv/sequence_state.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace peregrine {

// One sequence's share of a forward step: rows [row0, row0 + n_tokens) hold its tokens at positions
// start_pos.. ; its state already covers positions < start_pos.
struct BatchSeq {
    SeqState* state = nullptr;
    int64_t start_pos = 0;
    int n_tokens = 0;
    int row0 = 0;
    // SWA bounded replay: window positions below window_floor are absent (their K=V was never computed); rows at
    // positions below replay_from skip the layers after the last KV source (Model::forward).
    int64_t window_floor = 0;
    int64_t replay_from = 0;
    // Drafts under verification: state->step_carries (n_tokens + 1 slots) gets the carry as of each position, so
    // that rejected positions can be cut off (PagePool::cut). The backend writes the ones after each token but the
    // last; Model::forward the step's first and last.
    bool speculative = false;
    // Batch-invariant keys (ModelOptions::batch_invariant): every row lists its window and compressed entries as
    // feeding the sequence one token a step would (keys_as_decode, ops/attention_plan.h), so that its result is the
    // same however the sequence was cut into steps (prefill chunks, prefix hits, re-prefill after preemption, verify
    // steps).
    bool decode_keys = false;
};

// What a step computes, as the scheduler decided: every sequence feeds one token (decode: row i is sequence i), none
// does (prefill chunks), or both. Backends pick their path by it (the CUDA backend plans decode steps' attention on
// the device and replays their layers as graphs); Model::forward checks that a decode batch has that shape.
enum class BatchMode { prefill, decode, mixed };

struct ForwardBatch {
    BatchMode mode = BatchMode::mixed;
    std::vector<BatchSeq> seqs;
    std::vector<int32_t> token_ids;  // per row; negative: a deferred id (DeviceSampler::deferred_id)
    int rows() const { return static_cast<int>(token_ids.size()); }
};
// The mode a batch's shape gives (for callers that build batches by hand: tests, benchmarks, SequenceRunner).
BatchMode batch_mode_of(const ForwardBatch& batch);

}  // namespace peregrine
