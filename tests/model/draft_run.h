#pragma once
// Drafts for several sequences at once against each drafted alone (Model::draft): sequences of different lengths
// (their own window rings and positions) fed from a fixture's prompt, anchors of their own.
#include "kv/page_pool.h"
#include "model/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace peregrine::test {

struct DraftBatchDiff {
    bool same_ids = true;
    float logits = 0, confidence = 0;  // largest differences
};

inline DraftBatchDiff drafts_together_vs_alone(Model& m, const std::vector<int32_t>& ids) {
    const std::vector<int64_t> lengths = {7, 19, std::min<int64_t>(30, static_cast<int64_t>(ids.size()))};
    PagePool pool(m.backend().state_memory(), m.layout(), 3 * m.layout().pages_for(lengths.back() + 1));
    std::vector<SeqState> seqs(lengths.size());
    std::vector<const SeqState*> all;
    std::vector<int32_t> anchors;
    for (size_t j = 0; j < seqs.size(); ++j) {
        pool.init(seqs[j]);
        EXPECT_TRUE(pool.reserve(seqs[j], lengths[j]));
        ForwardBatch b;
        b.seqs.push_back({&seqs[j], 0, static_cast<int>(lengths[j]), 0});
        b.token_ids.assign(ids.begin() + static_cast<int64_t>(j), ids.begin() + static_cast<int64_t>(j) + lengths[j]);
        b.mode = BatchMode::prefill;
        m.forward(b, {});
        all.push_back(&seqs[j]);
        anchors.push_back(ids[static_cast<size_t>(lengths[j])]);
    }
    const std::vector<DraftResult> together = m.draft(all, anchors);
    DraftBatchDiff d;
    for (size_t j = 0; j < seqs.size(); ++j) {
        const DraftResult alone = m.draft({all[j]}, {anchors[j]}).at(0);
        d.same_ids = d.same_ids && alone.ids == together[j].ids;
        for (size_t i = 0; i < alone.logits.size(); ++i)
            d.logits = std::max(d.logits, std::fabs(alone.logits[i] - together[j].logits.at(i)));
        for (size_t i = 0; i < alone.confidence.size(); ++i)
            d.confidence = std::max(d.confidence, std::fabs(alone.confidence[i] - together[j].confidence.at(i)));
    }
    for (SeqState& s : seqs) pool.release(s);
    return d;
}

}  // namespace peregrine::test
