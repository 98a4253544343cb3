#pragma once
// Speculative steps by hand, shared by the CPU and GPU tests: verify steps cut back to their accepted drafts, and
// drafts for several sequences at once against each drafted alone; and the engine's outputs with and without drafts.
#include "engine/engine.h"
#include "kv/page_pool.h"
#include "model/model.h"
#include "util/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

namespace peregrine::test {

// ids[0, n0) prefilled, then verify steps of the next token and k drafts, the first j of them right (ids) and the rest
// wrong, each cut back to what it accepted (PagePool::cut): k = 1 + step % 5 and j = step % (k + 1), cuts inside and
// across compressor groups and pages; with `wide_first` a first step of 33 drafts, 20 right, where there is room. The
// logits of every accepted position n0.. ([n - n0, vocab]): what feeding ids one token a step gives. `at_end` sees
// the sequence's state after the last step.
inline std::vector<float> verify_and_cut(Model& m, const std::vector<int32_t>& ids, int64_t n0, int64_t n,
                                         bool wide_first,
                                         const std::function<void(const SeqState&)>& at_end = nullptr) {
    const int V = m.config().vocab_size;
    PagePool pool(m.backend().state_memory(), m.layout(), m.layout().pages_for(n + 40));
    SeqState s;
    pool.init(s);
    EXPECT_TRUE(pool.reserve(s, n0));
    ForwardBatch pre;
    pre.seqs.push_back({&s, 0, static_cast<int>(n0), 0});
    pre.token_ids.assign(ids.begin(), ids.begin() + n0);
    pre.mode = BatchMode::prefill;
    m.forward(pre, {});
    std::vector<float> got;
    for (int64_t p = n0, step = 0; p < n; ++step) {
        const int64_t room = n - p - 1;
        const bool wide = wide_first && step == 0 && room >= 33;
        const int k = wide ? 33 : static_cast<int>(1 + step % 5);                                    // drafts
        const int j = static_cast<int>(std::min<int64_t>(wide ? 20 : step % (k + 1), room));  // of them right
        std::vector<int32_t> fed{ids[static_cast<size_t>(p)]};
        for (int d = 0; d < k; ++d)
            fed.push_back(d < j ? ids[static_cast<size_t>(p + 1 + d)]
                                : (ids[static_cast<size_t>(std::min<int64_t>(p + 1 + d, n - 1))] + 7 + d) % V);
        EXPECT_TRUE(pool.reserve(s, p + 1 + k) && pool.keep_step_carries(s, 1 + k));
        ForwardBatch b;
        b.seqs.push_back({&s, p, 1 + k, 0});
        b.seqs.back().speculative = true;
        b.token_ids = fed;
        b.mode = BatchMode::prefill;
        std::vector<int> rows;
        for (int i = 0; i <= j; ++i) rows.push_back(i);
        Tensor logits = m.forward(b, rows);
        got.insert(got.end(), logits.f32(), logits.f32() + static_cast<int64_t>(j + 1) * V);
        pool.cut(s, p + 1 + j);
        EXPECT_EQ(s.n_cached, p + 1 + j);
        EXPECT_EQ(static_cast<int64_t>(s.tokens.size()), p + 1 + j);
        p += 1 + j;
    }
    EXPECT_THROW(pool.cut(s, s.n_cached - 1), Error) << "a cut needs a speculative step just before";
    if (at_end) at_end(s);
    pool.release(s);
    return got;
}

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

// Request i (prompt i, params gs[i]) through an engine over m without drafts, then with up to `drafts` drafts per step
// from the model's drafter, every draft verified and confidence-scheduled: the same tokens. Prints the verify steps'
// counters; returns those of the run verifying every draft.
inline EngineStats expect_drafts_keep_outputs(Model& m, const std::vector<std::vector<int32_t>>& prompts,
                                              const std::vector<GenerationParams>& gs, int drafts) {
    auto run = [&](int k, bool schedule) {
        EngineOptions o;
        o.kv_pages = 4096;
        o.speculative_draft_tokens = k;
        o.speculative_schedule = schedule;
        Engine eng(m, nullptr, o);
        std::vector<std::shared_ptr<RequestStream>> streams;
        for (size_t i = 0; i < prompts.size(); ++i) streams.push_back(eng.submit(prompts[i], gs.at(i)));
        std::vector<std::vector<int32_t>> out;
        for (auto& s : streams) {
            out.emplace_back();
            for (auto& t : s->wait().tokens) out.back().push_back(t.id);
        }
        return std::make_pair(out, eng.stats());
    };
    const auto plain = run(0, false).first;
    EngineStats every;
    for (bool schedule : {false, true}) {
        auto [got, st] = run(drafts, schedule);
        EXPECT_EQ(got, plain) << (schedule ? "confidence schedule" : "every draft");
        std::printf("%s: %llu verify steps, %llu of %llu drafts accepted\n",
                    schedule ? "confidence schedule" : "all drafts",
                    static_cast<unsigned long long>(st.spec_verify_total),
                    static_cast<unsigned long long>(st.spec_accepted_tokens_total),
                    static_cast<unsigned long long>(st.spec_draft_tokens_total));
        if (!schedule) every = st;
    }
    return every;
}

}  // namespace peregrine::test
