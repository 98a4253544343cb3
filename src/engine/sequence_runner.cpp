#include "engine/sequence_runner.h"
#include "util/error.h"

#include <algorithm>

namespace peregrine {

SequenceRunner::SequenceRunner(Model& model, int64_t max_tokens) : model_(model) {
    pool_ = std::make_unique<PagePool>(model.backend().state_memory(), model.layout(),
                                       model.layout().pages_for(std::max<int64_t>(max_tokens, 1)));
    pool_->init(state_);
}

SequenceRunner::~SequenceRunner() { pool_->release(state_); }

std::vector<float> SequenceRunner::feed(const std::vector<int32_t>& ids, int chunk, bool all_logits) {
    const int vocab = model_.config().vocab_size;
    const int64_t n = static_cast<int64_t>(ids.size());
    if (chunk <= 0) chunk = static_cast<int>(std::max<int64_t>(n, 1));
    std::vector<float> out;
    for (int64_t p = 0; p < n; p += chunk) {
        const int count = static_cast<int>(std::min<int64_t>(chunk, n - p));
        const int64_t start = state_.n_cached;
        if (!pool_->reserve(state_, start + count))
            fail("sequence of {} tokens exceeds the {} reserved", start + count,
                 pool_->capacity() * model_.layout().page_tokens);
        ForwardBatch b;
        b.seqs.push_back({&state_, start, count, 0});
        b.token_ids.assign(ids.begin() + p, ids.begin() + p + count);
        b.mode = batch_mode_of(b);
        std::vector<int> rows;
        const bool last_chunk = p + count == n;
        if (all_logits)
            for (int i = 0; i < count; ++i) rows.push_back(i);
        else if (last_chunk)
            rows.push_back(count - 1);
        Tensor logits = model_.forward(b, rows);
        out.insert(out.end(), logits.f32(), logits.f32() + static_cast<int64_t>(rows.size()) * vocab);
    }
    return out;
}

}  // namespace peregrine
