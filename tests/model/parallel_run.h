#pragma once
// Runs sequences through a model rank in forward steps (expert-parallel tests on the CPU and the GPU):
// a prefill step, then greedy decode steps, every sequence of the rank in one batch; a rank without
// sequences takes part through idle steps.
#include "kv/page_pool.h"
#include "model/fixture.h"
#include "model/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace peregrine::test {

struct SeqLogits {
    std::vector<std::vector<float>> logits;  // [step] -> the sequence's last-row logits
};

// Three prompts of different lengths from the fixture's prefill ids.
inline std::vector<std::vector<int32_t>> parallel_prompts(const std::string& fx) {
    auto ids = read_ids(fixture_dir(fx) + "/cases/prefill.ids");
    EXPECT_GE(ids.size(), 48u);
    return {std::vector<int32_t>(ids.begin(), ids.begin() + 37),
            std::vector<int32_t>(ids.begin() + 5, ids.begin() + 20),
            std::vector<int32_t>(ids.begin() + 11, ids.begin() + 48)};
}

// Runs `seqs` (indices into `all`) on `model` for `steps` steps; returns each sequence's logits per step.
inline std::vector<SeqLogits> run_sequences(Model& model, const std::vector<std::vector<int32_t>>& all,
                                            const std::vector<int>& seqs, int steps) {
    model.backend().bind_thread();
    const int vocab = model.config().vocab_size;
    PagePool pool(model.backend().state_memory(), model.layout(), 64);
    std::vector<SeqState> st(seqs.size());
    std::vector<std::vector<int32_t>> toks;
    for (size_t i = 0; i < seqs.size(); ++i) {
        pool.init(st[i]);
        toks.push_back(all[static_cast<size_t>(seqs[i])]);
        EXPECT_TRUE(pool.reserve(st[i], static_cast<int64_t>(toks.back().size()) + steps));
    }
    std::vector<SeqLogits> out(seqs.size());
    for (int step = 0; step < steps; ++step) {
        if (seqs.empty()) {
            model.idle_step();
            continue;
        }
        ForwardBatch batch;
        std::vector<int> rows;
        for (size_t i = 0; i < seqs.size(); ++i) {
            const int64_t start = st[i].n_cached;
            const int n = static_cast<int>(static_cast<int64_t>(toks[i].size()) - start);
            batch.seqs.push_back({&st[i], start, n, batch.rows()});
            batch.token_ids.insert(batch.token_ids.end(), toks[i].begin() + start, toks[i].end());
            rows.push_back(batch.rows() - 1);
        }
        batch.mode = batch_mode_of(batch);
        Tensor l = model.forward(batch, rows);
        for (size_t i = 0; i < seqs.size(); ++i) {
            const float* row = l.f32() + static_cast<int64_t>(i) * vocab;
            out[i].logits.emplace_back(row, row + vocab);
            toks[i].push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
        }
    }
    for (auto& s : st) pool.release(s);
    return out;
}

}  // namespace peregrine::test
