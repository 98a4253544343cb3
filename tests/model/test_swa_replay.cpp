// SWA bounded replay (kv/cache_manager.h SwaReplay): how far its logits depart from a full prefill on the
// fixtures and the demo model (printed; docs/swa-bounded-replay.md quotes them), that they do depart (the cut
// happened), and that chunking a replayed prefill changes nothing.
#include "engine/sequence_runner.h"
#include "model/fixture.h"
#include "model/replay_run.h"

#include <gtest/gtest.h>

#include <cstdio>

using namespace peregrine;
using namespace peregrine::test;

namespace {

std::vector<float> tail(const std::vector<float>& logits, int64_t from_row, int V) {
    return {logits.begin() + from_row * V, logits.end()};
}

}  // namespace

// Decoder replay on V4.1 (layers 4 and 5 follow the last KV source, layer 3): rows below replay_from stop at layer
// 3. The kept rows' logits depart from a full prefill by a bounded amount and agree on top-1 mostly; a chunked
// replayed prefill gives the one-shot replayed logits; a logit row below replay_from is refused.
TEST(SwaReplay, DecoderReplayDepartsBoundedlyAndChunksAgree) {
    auto m = Model::load(fixture_dir("dsv41-tiny-a"));
    ASSERT_EQ(m->replay_layer(), 4);
    auto ids = read_ids(fixture_dir("dsv41-tiny-a") + "/cases/prefill.ids");
    const int64_t n = static_cast<int64_t>(ids.size());
    const int V = m->config().vocab_size, P = m->layout().page_tokens, W = m->config().window_size;
    const int64_t from = (n - W) / P * P;  // as CacheManager::admit sets it
    SequenceRunner full_run(*m, n);
    const auto full = tail(full_run.feed(ids, 0, true), from, V);
    const auto replayed = replay_run(*m, ids, n, {0, 0, from, 0});
    const RowDiff d = compare_logits(replayed, full, V);
    std::printf("decoder replay, dsv41-tiny-a, %lld tokens from %lld: max |logit diff| %.4f, top-1 %.3f\n",
                static_cast<long long>(n), static_cast<long long>(from), d.worst(), d.top1);
    EXPECT_GT(d.worst(), 1e-4f) << "rows below replay_from ran every layer";
    EXPECT_LT(d.worst(), 3.0f);
    EXPECT_GE(d.top1, 0.75);
    for (int chunk : {7, 20, 33}) {
        const RowDiff c = compare_logits(replay_run(*m, ids, n, {0, 0, from, chunk}), replayed, V);
        EXPECT_LE(c.worst(), 1e-5f) << "chunks of " << chunk;
    }
    SeqState s;
    PagePool pool(m->backend().state_memory(), m->layout(), 8);
    pool.init(s);
    ASSERT_TRUE(pool.reserve(s, n));
    ForwardBatch b;
    b.seqs.push_back({&s, 0, static_cast<int>(n), 0});
    b.seqs.back().replay_from = from;
    b.token_ids = ids;
    b.mode = batch_mode_of(b);
    EXPECT_THROW(m->forward(b, {static_cast<int>(from) - 1}), Error);
    pool.release(s);
}

// Encoder replay: a sequence resumes a window of rows before a cached prefix's end, its window K=V below the resume
// point absent, and recomputes the rest. Its logits after the prefix depart from a full prefill by a bounded amount.
TEST(SwaReplay, EncoderReplayDepartsBoundedly) {
    struct Case {
        std::string dir, ids;  // the model, the fixture whose prompt it reads (cycled)
        int after;             // positions compared after the cached prefix
        float max_diff;
        double top1;
    };
    // The tiny fixtures' random weights make every perturbation grow (their READMEs): only the logit bound there.
    const Case cases[] = {{fixture_dir("dsv41-tiny-a"), "dsv41-tiny-a", 16, 4.0f, 0.0},
                          {fixture_dir("dsv4-tiny-a"), "dsv4-tiny-a", 16, 4.0f, 0.0},
                          {std::string(PEREGRINE_SOURCE_DIR) + "/models/peregrine-demo-v4", "dsv4-tiny-a", 64, 2.0f,
                           0.8}};
    for (const Case& c : cases) {
        auto m = Model::load(c.dir);
        const int V = m->config().vocab_size, P = m->layout().page_tokens;
        const int64_t rows = m->layout().window_rows();
        const int64_t cached = (rows + 2) * P, resume = cached - rows * P, n = cached + c.after;
        const auto prompt = read_ids(fixture_dir(c.ids) + "/cases/prefill.ids");
        std::vector<int32_t> ids;
        for (int64_t i = 0; i < n; ++i) ids.push_back(prompt[static_cast<size_t>(i) % prompt.size()]);
        SequenceRunner full_run(*m, n);
        const auto full = tail(full_run.feed(ids, 0, true), cached, V);
        const auto replayed = tail(replay_run(*m, ids, n, {resume, resume, 0, 0}), cached - resume, V);
        const RowDiff d = compare_logits(replayed, full, V);
        std::printf("encoder replay, %s, %lld tokens, cached %lld, replayed from %lld: max |logit diff| %.4f, "
                    "top-1 %.3f\n",
                    c.dir.substr(c.dir.find_last_of('/') + 1).c_str(), static_cast<long long>(n),
                    static_cast<long long>(cached), static_cast<long long>(resume), d.worst(), d.top1);
        EXPECT_GT(d.worst(), 1e-4f) << c.dir << ": the window below the resume point was read";
        EXPECT_LT(d.worst(), c.max_diff) << c.dir;
        EXPECT_GE(d.top1, c.top1) << c.dir;
    }
}
