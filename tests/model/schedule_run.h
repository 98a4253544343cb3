#pragma once
// A sequence fed in different steps, and requests through an engine under different schedules (the parity and
// batch-invariance tests, CPU and GPU): the demo models' held-out prompts, greedy and seeded, alone or side by side,
// in chunks, under preemption, with drafts.
#include "engine/engine.h"
#include "engine/sequence_runner.h"
#include "model/fixture.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <vector>

namespace peregrine::test {

// The first n tokens of held-out chunk i of a demo model's fixture ("demo-v4", "demo-v41").
inline std::vector<int32_t> heldout(const std::string& name, size_t i, size_t n) {
    auto j = nlohmann::json::parse(read_file(fixture_dir(name) + "/demo_heldout.json"));
    auto ids = j["chunks"].at(i)["ids"].get<std::vector<int32_t>>();
    ids.resize(std::min(ids.size(), n));
    return ids;
}

// Every position's logits ([ids, vocab]): the first `first` tokens in chunks of `chunk` (0: one step), then one token
// a step.
inline std::vector<float> feed_logits(Model& m, const std::vector<int32_t>& ids, size_t first, int chunk) {
    SequenceRunner run(m, static_cast<int64_t>(ids.size()));
    auto out = run.feed({ids.begin(), ids.begin() + static_cast<int64_t>(first)}, chunk, true);
    for (size_t p = first; p < ids.size(); ++p) {
        auto row = run.feed({ids[p]}, 0, true);
        out.insert(out.end(), row.begin(), row.end());
    }
    return out;
}

struct ScheduleRequests {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<GenerationParams> params;
};

// Four held-out prompts of 30 to 105 tokens (the outputs cross the 128-token window), 28 tokens each: two greedy,
// two seeded at temperature 0.9.
inline ScheduleRequests schedule_requests(const std::string& name) {
    ScheduleRequests r;
    for (size_t i = 0; i < 4; ++i) {
        r.prompts.push_back(heldout(name, i + 1, 30 + 25 * i));
        GenerationParams g;
        g.max_new_tokens = 28;
        g.ignore_eos = true;
        g.sampling.temperature = i % 2 ? 0.9f : 0.0f;
        g.sampling.seed = 7 + static_cast<int64_t>(i);
        r.params.push_back(g);
    }
    return r;
}

struct Schedule {
    int chunk;            // chunked_prefill_size
    int64_t pages;        // kv_pages
    bool alone;           // each request finishes before the next is submitted
    bool speculate;       // the model's drafter, its default drafts
    int repeats;          // the requests again (prefix hits); each repeat's tokens must equal the first's
};

// Every request's tokens, and the engine's counters.
inline std::pair<std::vector<std::vector<int32_t>>, EngineStats> run_schedule(Model& m, const ScheduleRequests& rq,
                                                                              const Schedule& s) {
    EngineOptions o;
    o.kv_pages = s.pages;
    o.chunked_prefill_size = s.chunk;
    o.speculative_draft_tokens = s.speculate ? m.default_drafts() : 0;
    Engine eng(m, nullptr, o);
    std::vector<std::vector<int32_t>> out(rq.prompts.size());
    for (int r = 0; r < s.repeats; ++r) {
        std::vector<std::shared_ptr<RequestStream>> streams;
        std::vector<RequestDelta> done(rq.prompts.size());
        for (size_t i = 0; i < rq.prompts.size(); ++i) {
            streams.push_back(eng.submit(rq.prompts[i], rq.params[i]));
            if (s.alone) done[i] = streams.back()->wait();
        }
        for (size_t i = 0; i < rq.prompts.size(); ++i) {
            const RequestDelta& d = s.alone ? done[i] : (done[i] = streams[i]->wait());
            EXPECT_EQ(d.finish, FinishReason::length) << d.error;
            std::vector<int32_t> ids;
            for (auto& t : d.tokens) ids.push_back(t.id);
            if (r == 0) out[i] = ids;
            else EXPECT_EQ(ids, out[i]) << "request " << i << " again, " << d.cached_tokens << " tokens cached";
        }
    }
    return {out, eng.stats()};
}

}  // namespace peregrine::test
