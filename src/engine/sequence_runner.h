#pragma once
// Runs one sequence through a model with its own page pool: prefill (optionally in chunks), then one
// token at a time. Used by `forward`, `generate` and the parity tests; the server batches through the
// scheduler instead.
#include "kv/page_pool.h"
#include "model/model.h"

#include <memory>
#include <vector>

namespace peregrine {

class SequenceRunner {
public:
    // max_tokens sizes the private page pool.
    SequenceRunner(Model& model, int64_t max_tokens);
    ~SequenceRunner();

    // Feeds `ids` in chunks of at most `chunk` tokens (0: one chunk); returns the logits of every fed
    // position ([n, vocab]) when all_logits, else only of the last one ([1, vocab]).
    std::vector<float> feed(const std::vector<int32_t>& ids, int chunk = 0, bool all_logits = false);
    int64_t length() const { return state_.n_cached; }
    const std::vector<int32_t>& tokens() const { return state_.tokens; }
    const SeqState& state() const { return state_; }  // what a drafter reads
    // Back to its first n_tokens (a page boundary), from that page's snapshot, as a prefix-cache hit resumes.
    void rewind(int64_t n_tokens) { pool_->restore(state_, n_tokens); }

private:
    Model& model_;
    std::unique_ptr<PagePool> pool_;
    SeqState state_;
};

}  // namespace peregrine
