// The scheduler and the output processor driven by a fake model runner (no model): what each step feeds (token
// budget, chunking, decodes first, the batch's mode), admission, preemption when pages run short (outputs
// unchanged), and requests that can never fit.
#include "engine/output_processor.h"
#include "engine/scheduler.h"
#include "engine/spec_schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>

using namespace peregrine;

namespace {

constexpr int kPage = 4, kVocab = 97;

StateLayout layout() {
    StateSpec spec;
    spec.layers.resize(1);
    spec.layers[0].window = {fp8_entry_format(64, 64, 32), 1};
    return make_state_layout(spec, kPage);
}

// Stands in for the model runner: a step's state is "computed" (its history and n_cached move on, as
// Model::forward does), and the token after a sampled row depends only on the tokens before it.
struct FakeRunner {
    std::vector<ScheduledBatch> steps;
    StepOutput run(const ScheduledBatch& b) {
        steps.push_back(b);
        StepOutput out;
        out.stepped = true;
        for (const auto& e : b.entries) {
            Request& r = *e.request;
            SeqState& s = r.kv.state;
            EXPECT_EQ(s.n_cached, e.start);
            EXPECT_GE(static_cast<int64_t>(s.pages.size()) * kPage, e.start + e.n_tokens);
            s.tokens.resize(static_cast<size_t>(e.start));
            for (int i = 0; i < e.n_tokens; ++i) s.tokens.push_back(r.seq.at(static_cast<size_t>(e.start + i)));
            s.n_cached = e.start + e.n_tokens;
            if (!e.sampled) continue;
            uint64_t h = 1469598103934665603ull;
            for (int32_t t : s.tokens) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
            TokenOutput t;
            t.id = static_cast<int32_t>(h % kVocab);
            out.tokens.emplace_back(e.request, t);
        }
        return out;
    }
};

struct Harness {
    HostStateMemory memory;
    CacheManager kv;
    OutputProcessor output;
    Scheduler scheduler;
    FakeRunner runner;
    std::vector<RequestPtr> requests;

    Harness(int64_t pages, SchedulerOptions o)
        : kv(memory, layout(), {pages, pages}, true), output(scheduler, nullptr, -1, kVocab, o.context_length),
          scheduler(kv, o, output) {}

    RequestPtr submit(int prompt_len, int max_new, int first = 1) {
        GenerationParams p;
        p.max_new_tokens = max_new;
        auto r = std::make_shared<Request>(nullptr, p);
        r->id = requests.size() + 1;
        r->stream = std::make_shared<RequestStream>(r->id);
        r->seq.resize(static_cast<size_t>(prompt_len));
        std::iota(r->seq.begin(), r->seq.end(), first);
        r->prompt_len = prompt_len;
        r->arrival = EngineClock::now();
        ++scheduler.queued();
        scheduler.enqueue(r);
        requests.push_back(r);
        return r;
    }
    // Steps until every request has finished (at most max_steps).
    void run(int max_steps = 1000) {
        for (int i = 0; i < max_steps && !scheduler.idle(); ++i) {
            scheduler.admit();
            ScheduledBatch b = scheduler.schedule();
            if (b.empty()) continue;
            output.process(runner.run(b));
        }
        EXPECT_TRUE(scheduler.idle());
    }
    std::vector<int32_t> ids(const RequestPtr& r) {
        RequestDelta d = r->stream->wait();
        EXPECT_TRUE(d.finished);
        std::vector<int32_t> v;
        for (auto& t : d.tokens) v.push_back(t.id);
        return v;
    }
};

SchedulerOptions options(int budget, int max_running = 64) {
    SchedulerOptions o;
    o.chunked_prefill_size = budget;
    o.max_running_requests = max_running;
    o.context_length = 1 << 20;
    return o;
}

}  // namespace

TEST(Scheduler, BudgetChunksPrefillsAndPutsDecodesFirst) {
    Harness h(64, options(8));
    auto a = h.submit(10, 3), b = h.submit(5, 2, 100);
    h.run();
    ASSERT_FALSE(h.runner.steps.empty());
    for (const auto& s : h.runner.steps) {
        int tokens = 0;
        bool prefill_seen = false;
        for (const auto& e : s.entries) {
            tokens += e.n_tokens;
            if (e.n_tokens > 1) prefill_seen = true;
            else EXPECT_FALSE(prefill_seen) << "a decode after a prefill chunk";
        }
        EXPECT_LE(tokens, 8);
        bool all_one = true, none_one = true;
        for (const auto& e : s.entries) all_one = all_one && e.n_tokens == 1, none_one = none_one && e.n_tokens > 1;
        EXPECT_EQ(s.mode, all_one ? BatchMode::decode : none_one ? BatchMode::prefill : BatchMode::mixed);
    }
    // Step 1: a's first 8 prompt tokens (the whole budget); step 2: a's last 2 and b's first 6 (b's 5 and room).
    const auto& s1 = h.runner.steps[0];
    ASSERT_EQ(s1.entries.size(), 1u);
    EXPECT_EQ(s1.entries[0].n_tokens, 8);
    EXPECT_FALSE(s1.entries[0].sampled);
    EXPECT_EQ(s1.mode, BatchMode::prefill);
    const auto& s2 = h.runner.steps[1];
    ASSERT_EQ(s2.entries.size(), 2u);
    EXPECT_EQ(s2.entries[0].n_tokens, 2);
    EXPECT_TRUE(s2.entries[0].sampled);
    EXPECT_EQ(s2.entries[1].n_tokens, 5);
    EXPECT_TRUE(s2.entries[1].sampled);
    EXPECT_EQ(h.runner.steps.back().mode, BatchMode::decode);
    EXPECT_EQ(h.ids(a).size(), 3u);
    EXPECT_EQ(h.ids(b).size(), 2u);
}

TEST(Scheduler, AdmitsUpToMaxRunning) {
    Harness h(64, options(64, 2));
    auto a = h.submit(3, 4), b = h.submit(3, 4, 50), c = h.submit(3, 4, 90);
    h.scheduler.admit();
    EXPECT_EQ(h.scheduler.running().size(), 2u);
    EXPECT_EQ(h.scheduler.queued().load(), 1);
    h.run();
    for (auto& r : {a, b, c}) EXPECT_EQ(h.ids(r).size(), 4u);
    // c ran only once a finished.
    size_t first_c = 0;
    for (size_t i = 0; i < h.runner.steps.size() && !first_c; ++i)
        for (const auto& e : h.runner.steps[i].entries)
            if (e.request == c) first_c = i;
    EXPECT_GE(first_c, 4u);
    EXPECT_EQ(h.kv.stats().pages_used - h.kv.stats().pages_evictable, 0);
}

// With few pages the newest requests are preempted and resumed from the prefix cache; every output is what it is
// with room to spare.
TEST(Scheduler, PreemptionChangesNoOutput) {
    auto outputs = [](int64_t pages, int64_t* preemptions) {
        Harness h(pages, options(16));
        std::vector<RequestPtr> rs;
        for (int i = 0; i < 4; ++i) rs.push_back(h.submit(9 + i, 20, 10 * i + 1));
        h.run();
        std::vector<std::vector<int32_t>> out;
        for (auto& r : rs) out.push_back(h.ids(r));
        *preemptions = h.output.stats().preemptions_total;
        return out;
    };
    int64_t roomy = 0, tight = 0;
    const auto expected = outputs(256, &roomy);
    const auto got = outputs(16, &tight);
    EXPECT_EQ(roomy, 0);
    EXPECT_GT(tight, 0);
    EXPECT_EQ(got, expected);
    for (const auto& o : expected) EXPECT_EQ(o.size(), 20u);
}

TEST(Scheduler, RequestsThatCanNeverFitEnd) {
    {  // more state than the pool holds, with nothing running: an error at admission
        Harness h(4, options(64));
        auto r = h.submit(40, 2);
        h.run();
        RequestDelta d = r->stream->wait();
        EXPECT_EQ(d.finish, FinishReason::error);
        EXPECT_NE(d.error.find("KV memory holds 16"), std::string::npos) << d.error;
    }
    {  // admitted, then alone and out of pages while it generates: stops at the length it reached
        Harness h(4, options(64));
        auto r = h.submit(10, 100);
        h.run();
        RequestDelta d = r->stream->wait();
        EXPECT_EQ(d.finish, FinishReason::length);
        EXPECT_EQ(d.tokens.size(), 7u);  // 16 positions of pages: 10 prompt + 6 fed back, and the 7th sampled
        EXPECT_EQ(h.kv.stats().pages_used - h.kv.stats().pages_evictable, 0);
    }
}

// Confidence-scheduled verification: drafts nearly free (a small batch on a GPU) are all taken, best first; drafts
// that cost their share of the step (a large batch, a CPU) only where their acceptance pays for them.
TEST(SpecSchedule, KeepsTheDraftsThatRaiseTokensPerSecond) {
    // seconds by batch 1, 64 and drafts per sequence 0..4
    SpecSchedule s({1, 64}, {{1.0, 1.05, 1.1, 1.15, 1.2}, {1.0, 2.0, 3.0, 4.0, 5.0}});
    EXPECT_DOUBLE_EQ(s.step_seconds(1, 2), 1.1);
    EXPECT_DOUBLE_EQ(s.step_seconds(64, 32), 1.5);   // half a draft per sequence
    EXPECT_DOUBLE_EQ(s.step_seconds(128, 0), 2.0);   // beyond the table: in proportion
    EXPECT_NEAR(s.step_seconds(32, 0), 1.0, 1e-12);  // between rows
    EXPECT_EQ(s.plan({{0.9, 0.8, 0.6, 0.3}}, 1), std::vector<int>({4}));
    // 2.2 tokens in 1.15 s beat 2.25 in 1.2 s: the fourth draft costs more than it adds.
    EXPECT_EQ(s.plan({{0.9, 0.2, 0.1, 0.05}}, 1), std::vector<int>({3}));
    // At 64 sequences a draft costs 1/64 of a step: it must be accepted more often than one in ~1.02... never.
    EXPECT_EQ(s.plan({{0.99, 0.9}, {0.5}}, 64), std::vector<int>({0, 0}));
    // Cheap drafts at batch 64 (one second more for a whole draft per sequence): the likely ones, best first.
    SpecSchedule cheap({64}, {{1.0, 1.25, 1.5}});
    std::vector<std::vector<double>> accept(64, {0.1});
    accept[3] = {0.95, 0.9};
    accept[7] = {0.6, 0.1};
    EXPECT_EQ(cheap.plan(accept, 64)[3], 2);
    EXPECT_EQ(cheap.plan(accept, 64)[7], 1);
    EXPECT_EQ(cheap.plan(accept, 64)[0], 0);

    // Drafting's own cost, decided before drafting from the running rates: free drafts pay at batch 1 and 64; at 0.2 s
    // for one sequence they still pay at batch 1 (0.9 + 0.8 more tokens for 0.3 s more), at 12.8 s for 64 not.
    EXPECT_TRUE(s.worth_drafting({0.9, 0.8}, 1));
    EXPECT_FALSE(s.worth_drafting({0.9, 0.8}, 64)) << "each draft costs its share of the step";
    EXPECT_TRUE(cheap.worth_drafting({0.5, 0.4}, 64));
    SpecSchedule costly({1, 64}, {{1.0, 1.05, 1.1}, {1.0, 1.25, 1.5}}, {0.2, 12.8});
    EXPECT_DOUBLE_EQ(costly.draft_seconds(128), 25.6);
    EXPECT_TRUE(costly.worth_drafting({0.9, 0.8}, 1));
    EXPECT_FALSE(costly.worth_drafting({0.9, 0.8}, 64));
    EXPECT_FALSE(costly.worth_drafting({0.1, 0.05}, 1)) << "1.15 tokens in 1.3 s lose to 1 in 1 s";
}

// Served steps correct the profile, which times the forward alone: verify steps with their drafting that take three
// times as long as profiled (sampling, acceptance, the host's share) turn drafting off where it paid on paper; steps
// without drafts keep their own ratio, and one outlier moves a ratio only a little.
TEST(SpecSchedule, ServedStepsCorrectThePredictions) {
    SpecSchedule s({1, 64}, {{1.0, 1.05, 1.1}, {1.0, 1.25, 1.5}}, {0.2, 0.4});
    EXPECT_TRUE(s.worth_drafting({0.9, 0.8}, 1));  // 1.9 tokens in 1.25 s beat 1 in 1 s
    for (int i = 0; i < 300; ++i) {
        s.observe(1, 2, true, 3 * (1.1 + 0.2));
        s.observe(1, 0, false, 1.0);
    }
    EXPECT_NEAR(s.step_seconds(1, 2), 3.3, 1e-3);
    EXPECT_NEAR(s.draft_seconds(1), 0.6, 1e-3);
    EXPECT_NEAR(s.step_seconds(1, 0), 1.0, 1e-9);
    EXPECT_FALSE(s.worth_drafting({0.9, 0.8}, 1)) << "2.7 tokens in 3.9 s lose to 1 in 1 s";
    // The other row keeps its profile; between the rows the ratio is interpolated.
    EXPECT_DOUBLE_EQ(s.step_seconds(64, 64), 1.25);
    EXPECT_GT(s.step_seconds(32, 32), 1.0 * 1.05 + 1e-3);
    EXPECT_LT(s.step_seconds(32, 32), 3.0 * 1.25);
    s.observe(64, 0, false, 1000.0);  // a stalled step: its ratio counts as 4, a twentieth of the way
    EXPECT_NEAR(s.step_seconds(64, 0), 1.15, 1e-9);
    EXPECT_NE(s.corrections().find("64: 1.15 1.00"), std::string::npos) << s.corrections();
}
