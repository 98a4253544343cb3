#pragma once
// Runs one sequence under SWA bounded replay's conditions by hand (the engine sets them through kv's CacheManager):
// a resume from a full prefill's pages, a window floor, a decoder replay point, chunks.
#include "kv/page_pool.h"
#include "model/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace peregrine::test {

struct Replay {
    int64_t resume = 0;       // the sequence starts from a full prefill's pages of tokens [0, resume)
    int64_t floor = 0;        // window K=V below it absent (encoder replay: the resume point)
    int64_t replay_from = 0;  // rows below it stop after the last KV source (decoder replay)
    int chunk = 0;            // tokens per step (0: one step)
};

// Logits of positions [max(resume, replay_from), n) of ids[0, n) computed under `r`.
inline std::vector<float> replay_run(Model& m, const std::vector<int32_t>& ids, int64_t n, const Replay& r) {
    const StateLayout& L = m.layout();
    PagePool pool(m.backend().state_memory(), L, 2 * L.pages_for(n + 1));
    SeqState prefix, s;
    pool.init(prefix);
    if (r.resume > 0) {
        EXPECT_TRUE(pool.reserve(prefix, r.resume));
        ForwardBatch b;
        b.seqs.push_back({&prefix, 0, static_cast<int>(r.resume), 0});
        b.token_ids.assign(ids.begin(), ids.begin() + r.resume);
        b.mode = batch_mode_of(b);
        m.forward(b, {});
        s.pages = prefix.pages;
        s.tokens = prefix.tokens;
        // Replayed: the window pages below the floor are gone (a read of them would be out of the pool).
        for (int64_t row = 0; row < r.floor / L.page_tokens; ++row)
            s.pages[static_cast<size_t>(row)][kWindowPages] = -1;
    }
    pool.restore(s, r.resume);
    s.window_floor = r.floor;
    EXPECT_TRUE(pool.reserve(s, n));
    std::vector<float> out;
    const int V = m.config().vocab_size;
    for (int64_t p = r.resume; p < n;) {
        const int count = static_cast<int>(r.chunk > 0 ? std::min<int64_t>(r.chunk, n - p) : n - p);
        ForwardBatch b;
        b.seqs.push_back({&s, p, count, 0});
        b.seqs.back().replay_from = r.replay_from;
        b.token_ids.assign(ids.begin() + p, ids.begin() + p + count);
        b.mode = batch_mode_of(b);
        std::vector<int> rows;
        for (int i = 0; i < count; ++i)
            if (p + i >= r.replay_from) rows.push_back(i);
        Tensor l = m.forward(b, rows);
        out.insert(out.end(), l.f32(), l.f32() + static_cast<int64_t>(rows.size()) * V);
        p += count;
    }
    for (size_t i = 0; i < s.pages.size(); ++i)  // s's own pages back; the shared ones are prefix's
        if (static_cast<int64_t>(i) >= r.resume / L.page_tokens) pool.free(s.pages[i]);
    s.pages.clear();
    pool.release(s);
    pool.release(prefix);
    return out;
}

}  // namespace peregrine::test
