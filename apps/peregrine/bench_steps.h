#pragma once
// Shared by `bench engine` and `bench engine --ep`: comma lists, and sequences with a cached context of
// random state (no prefill run) fed a fixed number of tokens per step.
#include "kv/page_pool.h"
#include "model/model.h"
#include "util/error.h"

#include <sstream>
#include <string>
#include <vector>

namespace peregrine {

inline std::vector<int64_t> parse_list(const std::string& s) {
    std::vector<int64_t> v;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) v.push_back(std::stoll(item));
    return v;
}

class CachedSequences {
public:
    // `n_seqs` sequences of `ctx` cached tokens, with pages for `extra` more tokens each; as in serving, window
    // pages only for the rows their queries read.
    CachedSequences(Model& m, Diagnostics& be, int n_seqs, int64_t ctx, int64_t extra)
        : pages_per_seq_(m.layout().pages_for(ctx + extra)),
          pool_(m.backend().state_memory(), m.layout(),
                {pages_per_seq_ * n_seqs, (pages_per_seq_ - m.layout().window_first_row(ctx)) * n_seqs}),
          seqs_(static_cast<size_t>(n_seqs)) {
        const StateLayout& L = m.layout();
        be.fill_state_random(pool_, 12345);
        const int64_t window_from = L.window_first_row(ctx);
        for (int s = 0; s < n_seqs; ++s) {
            SeqState& st = seqs_[static_cast<size_t>(s)];
            pool_.init(st);
            for (int64_t r = 0; r < pages_per_seq_; ++r) {
                PEREGRINE_CHECK(pool_.reserve(st, (r + 1) * L.page_tokens), "bench: page pool too small");
                if (r < window_from) pool_.drop_window(st, r, r + 1);
            }
            st.tokens.resize(static_cast<size_t>(ctx));
            for (int64_t i = 0; i < ctx; ++i)
                st.tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + s) % 100000 + 100);
            st.n_cached = ctx;
        }
    }
    // State bytes such sequences hold.
    static int64_t bytes(const StateLayout& L, int n_seqs, int64_t ctx, int64_t extra) {
        const int64_t rows = L.pages_for(ctx + extra);
        return n_seqs * (rows * static_cast<int64_t>(L.page_bytes[kHistoryPages]) +
                         (rows - L.window_first_row(ctx)) * static_cast<int64_t>(L.page_bytes[kWindowPages]));
    }
    // A verify step of speculative decoding: every sequence fed its token and rows - 1 drafts, logits for all of
    // them; cut_back() then takes the drafts back off (rejected: the context stays where it was).
    ForwardBatch verify_batch(int rows, std::vector<int>& logit_rows) {
        ForwardBatch batch = next_batch(rows, logit_rows);
        logit_rows.clear();
        for (BatchSeq& b : batch.seqs) {
            PEREGRINE_CHECK(pool_.keep_step_carries(*b.state, rows), "bench: no carry slots for a verify step");
            b.speculative = true;
            for (int i = 0; i < rows; ++i) logit_rows.push_back(b.row0 + i);
        }
        return batch;
    }
    void cut_back() {
        for (SeqState& st : seqs_) pool_.cut(st, st.step_carries_from);
    }
    SeqState& seq(size_t i) { return seqs_.at(i); }
    // The next step: `rows` new tokens of every sequence; `logit_rows` gets each sequence's last row.
    ForwardBatch next_batch(int rows, std::vector<int>& logit_rows) {
        ForwardBatch batch;
        logit_rows.clear();
        for (size_t s = 0; s < seqs_.size(); ++s) {
            SeqState& st = seqs_[s];
            const int row0 = static_cast<int>(s) * rows;
            batch.seqs.push_back({&st, st.n_cached, rows, row0});
            for (int i = 0; i < rows; ++i)
                batch.token_ids.push_back(static_cast<int32_t>((st.n_cached + i) % 100000 + 100));
            logit_rows.push_back(row0 + rows - 1);
        }
        batch.mode = batch_mode_of(batch);
        return batch;
    }

private:
    int64_t pages_per_seq_;
    PagePool pool_;
    std::vector<SeqState> seqs_;
};

}  // namespace peregrine
