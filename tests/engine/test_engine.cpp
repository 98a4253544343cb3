// The serving engine driven through its C++ API on the tiny fixture models: continuous batching,
// prefix-cache hits and preemption must not change a single token of greedy (or seeded) output.
#include "util/switches.h"
#include "engine/engine.h"
#include "engine/sequence_runner.h"
#include "kv/page_pool.h"
#include "ops/comm.h"
#include "model/fixture.h"

#include <gtest/gtest.h>
#include <array>
#include <cmath>
#include <cstdlib>
#include <map>
#include <filesystem>
#include <unistd.h>
#include <thread>

using namespace peregrine;
using test::fixture_dir;
using test::read_ids;

namespace {

Model& model(const std::string& name) {
    static std::map<std::string, std::unique_ptr<Model>> models;
    auto& m = models[name];
    if (!m) m = Model::load(fixture_dir(name));
    return *m;
}

std::vector<int32_t> prompt(const std::string& fx, int n, int offset = 0) {
    auto ids = read_ids(fixture_dir(fx) + "/cases/prefill.ids");
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(ids[static_cast<size_t>((i + offset) % ids.size())]);
    return p;
}

// Greedy continuation computed one sequence at a time, outside the engine.
std::vector<int32_t> reference_greedy(Model& m, const std::vector<int32_t>& p, int n) {
    SequenceRunner run(m, static_cast<int64_t>(p.size()) + n);
    auto logits = run.feed(p);
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
        int32_t t = argmax(logits.data(), m.config().vocab_size);
        out.push_back(t);
        if (i + 1 < n) logits = run.feed({t});
    }
    return out;
}

GenerationParams greedy(int n) {
    GenerationParams g;
    g.sampling.temperature = 0.0f;
    g.max_new_tokens = n;
    g.ignore_eos = true;
    return g;
}

std::vector<int32_t> ids_of(const RequestDelta& d) {
    std::vector<int32_t> v;
    for (auto& t : d.tokens) v.push_back(t.id);
    return v;
}

EngineOptions opts(int64_t pages, bool cache = true) {
    EngineOptions o;
    o.kv_pages = pages;
    o.radix_cache = cache;
    o.chunked_prefill_size = 24;
    // The suite runs twice (tests/engine/CMakeLists.txt): as the CPU backend picks, and with the overlapped
    // schedule forced on.
    if (switch_set("PEREGRINE_ENGINE_OVERLAP"))
        o.overlap_schedule = static_cast<int>(switch_int("PEREGRINE_ENGINE_OVERLAP", -1, 1));
    return o;
}

}  // namespace

TEST(Engine, BatchedGreedyMatchesSingleSequence) {
    for (const char* fx : {"dsv4-tiny-a", "dsv41-tiny-a"}) {
        Model& m = model(fx);
        // References first: the model may serve only one thread at a time (the engine's, once it runs).
        std::vector<std::vector<int32_t>> prompts, refs;
        for (int i = 0; i < 5; ++i) {
            prompts.push_back(prompt(fx, 5 + 9 * i, i));  // different lengths: prefill chunks mix with decodes
            refs.push_back(reference_greedy(m, prompts.back(), 12));
        }
        Engine eng(m, nullptr, opts(64));
        std::vector<std::shared_ptr<RequestStream>> streams;
        for (auto& p : prompts) streams.push_back(eng.submit(p, greedy(12)));
        for (int i = 0; i < 5; ++i) {
            auto d = streams[static_cast<size_t>(i)]->wait();
            EXPECT_EQ(d.finish, FinishReason::length);
            EXPECT_EQ(d.completion_tokens, 12);
            EXPECT_EQ(ids_of(d), refs[static_cast<size_t>(i)]) << fx << " request " << i;
        }
    }
}

TEST(Engine, PrefixCacheHitGivesIdenticalOutput) {
    for (const char* fx : {"dsv4-tiny-a", "dsv41-tiny-a"}) {
        Model& m = model(fx);
        const int P = m.layout().page_tokens;
        Engine eng(m, nullptr, opts(64));
        auto p = prompt(fx, 2 * P + 7);
        auto cold = eng.submit(p, greedy(10))->wait();
        EXPECT_EQ(cold.cached_tokens, 0);
        auto warm = eng.submit(p, greedy(10))->wait();
        EXPECT_EQ(warm.cached_tokens, 2 * P) << fx;  // whole pages of the prompt
        EXPECT_EQ(ids_of(warm), ids_of(cold)) << fx;
        // A longer prompt sharing the first page (a new turn that diverges later) hits one page.
        auto q = p;
        q[static_cast<size_t>(P + 3)] = (q[static_cast<size_t>(P + 3)] + 1) % m.config().vocab_size;
        auto other = eng.submit(q, greedy(10))->wait();
        EXPECT_EQ(other.cached_tokens, P) << fx;
        EXPECT_EQ(ids_of(other), reference_greedy(m, q, 10)) << fx;
        // The generated tokens were cached too: the next turn continues from prompt + answer.
        auto turn2 = p;
        for (auto t : ids_of(cold)) turn2.push_back(t);
        turn2.push_back(p[0]);
        auto t2 = eng.submit(turn2, greedy(6))->wait();
        EXPECT_EQ(t2.cached_tokens, static_cast<int64_t>((p.size() + 9) / P * P)) << fx;
        EXPECT_EQ(ids_of(t2), reference_greedy(m, turn2, 6)) << fx;
        EXPECT_GT(eng.stats().cache_hit_rate, 0.0);
        EXPECT_GT(eng.flush_cache(), 0);
        EXPECT_EQ(eng.stats().pages_cached, 0);
    }
}

// Window pages: a running request holds its last window only, so a small window table serves requests many
// times longer than it (preempting when short), and a finished request's window tail lets its next turn resume
// exactly.
TEST(Engine, WindowPagesGoBackAndTailsResumeExactly) {
    for (const char* fx : {"dsv41-tiny-a", "dsv4-tiny-b"}) {
        Model& m = model(fx);
        const int P = m.layout().page_tokens;
        const int64_t wr = m.layout().window_rows();
        ASSERT_GT(wr, 0) << fx;
        std::vector<std::vector<int32_t>> prompts, refs;
        for (int i = 0; i < 5; ++i) {
            prompts.push_back(prompt(fx, 4 * P + 3 + 5 * i, 7 * i));
            refs.push_back(reference_greedy(m, prompts.back(), 2 * P));
        }
        const int64_t context = 16 * P;  // beyond what the fixtures declare: RoPE has no hard limit
        {
            EngineOptions o = opts(64);
            o.context_length = context;
            o.window_pages = 2 * (wr + 3);  // two requests' windows at once
            Engine eng(m, nullptr, o);
            std::vector<std::shared_ptr<RequestStream>> streams;
            for (auto& p : prompts) streams.push_back(eng.submit(p, greedy(2 * P)));
            for (size_t i = 0; i < streams.size(); ++i) {
                auto d = streams[i]->wait();
                ASSERT_EQ(d.finish, FinishReason::length) << fx << " " << d.error;
                EXPECT_EQ(ids_of(d), refs[i]) << fx << " request " << i;
            }
            EXPECT_EQ(eng.stats().window_pages_total, o.window_pages);
        }
        // One request alone in a window table that holds a single window: its rows keep their history, few keep
        // their window, its tail among them.
        EngineOptions o = opts(64);
        o.context_length = context;
        o.window_pages = wr + 3;
        Engine eng(m, nullptr, o);
        const auto& p = prompts[0];
        auto first = eng.submit(p, greedy(2 * P))->wait();
        EXPECT_EQ(ids_of(first), refs[0]) << fx;
        const int64_t known = static_cast<int64_t>(p.size()) + 2 * P - 1;  // the last token was never fed
        EXPECT_EQ(eng.stats().pages_cached, known / P) << fx << ": every row's history";
        EXPECT_LT(eng.stats().window_pages_cached, known / P) << fx;
        EXPECT_GE(eng.stats().window_pages_cached, wr) << fx << ": at least the tail";
        auto turn2 = p;
        for (auto t : refs[0]) turn2.push_back(t);
        turn2.push_back(p[1]);
        auto t2 = eng.submit(turn2, greedy(6))->wait();
        EXPECT_EQ(t2.cached_tokens, known / P * P) << fx;
        EXPECT_EQ(ids_of(t2), reference_greedy(m, turn2, 6)) << fx;
        // Leaving the path early, where no window was kept: nothing to resume from, the output unchanged.
        auto fork = p;
        fork.resize(static_cast<size_t>(2 * P));
        fork.push_back(p[0]);
        auto f = eng.submit(fork, greedy(4))->wait();
        EXPECT_EQ(f.cached_tokens, 0) << fx;
        EXPECT_EQ(ids_of(f), reference_greedy(m, fork, 4)) << fx;
    }
}

// Decoder SWA bounded replay: a prefill's rows below replay_from skip the layers after the last KV source, so
// their window pages hold nothing there and never enter the cache: a prompt leaving that path early starts cold
// with the output of a fresh engine; the next turn still resumes at the tail.
TEST(Engine, DecoderReplayNeverCachesTheWindowsItSkipped) {
    const char* fx = "dsv41-tiny-a";
    Model& m = model(fx);
    const int P = m.layout().page_tokens;
    EngineOptions o = opts(64);
    o.context_length = 16 * P;
    o.swa_replay.decoder = true;
    auto p = prompt(fx, 4 * P + 3);
    auto fork = p;
    fork.resize(static_cast<size_t>(3 * P));
    fork.push_back(p[0]);
    std::vector<int32_t> fresh;
    {
        Engine eng(m, nullptr, o);
        fresh = ids_of(eng.submit(fork, greedy(6))->wait());
    }
    Engine eng(m, nullptr, o);
    auto first = eng.submit(p, greedy(8))->wait();
    ASSERT_EQ(first.finish, FinishReason::length) << first.error;
    EXPECT_EQ(eng.stats().pages_cached, (p.size() + 7) / P);
    auto f = eng.submit(fork, greedy(6))->wait();
    EXPECT_EQ(f.cached_tokens, 0) << "a window page the prefill skipped was cached";
    EXPECT_EQ(ids_of(f), fresh);
    auto turn2 = p;
    for (auto t : ids_of(first)) turn2.push_back(t);
    turn2.push_back(p[1]);
    auto t2 = eng.submit(turn2, greedy(4))->wait();
    EXPECT_EQ(t2.cached_tokens, static_cast<int64_t>(p.size() + 7) / P * P) << "the tail resumes";
}

// Encoder SWA bounded replay: a prefix whose window pages were evicted resumes a window of rows before its end
// instead of at the last row whose window is still cached.
TEST(Engine, EncoderReplayResumesWhereWindowsWereEvicted) {
    for (const char* fx : {"dsv41-tiny-a", "dsv4-tiny-b"}) {
        Model& m = model(fx);
        const int P = m.layout().page_tokens;
        const int64_t wr = m.layout().window_rows();
        auto p = prompt(fx, 6 * P + 3);
        auto fork = p;
        fork.resize(static_cast<size_t>(5 * P));
        fork.push_back(p[0]);
        int64_t exact = -1;
        for (bool replay : {false, true}) {
            EngineOptions o = opts(64);
            o.context_length = 16 * P;
            o.window_pages = wr + 3;  // a single window: cached rows keep their history, few their window
            o.swa_replay.encoder = replay;
            Engine eng(m, nullptr, o);
            eng.submit(p, greedy(2))->wait();
            eng.submit(prompt(fx, 6 * P + 3, 5), greedy(2))->wait();  // its windows take p's
            auto f = eng.submit(fork, greedy(6))->wait();
            ASSERT_EQ(f.finish, FinishReason::length) << fx << " " << f.error;
            if (!replay) {
                exact = f.cached_tokens;
                ASSERT_LT(exact, (5 - wr) * P) << fx << ": p's windows before the fork were not evicted";
                EXPECT_EQ(ids_of(f), reference_greedy(m, fork, 6)) << fx;
            } else {
                EXPECT_EQ(f.cached_tokens, (5 - wr) * P) << fx << " (exact hit: " << exact << ")";
            }
        }
    }
}

// The hierarchical cache: a prompt whose rows were evicted from the device comes back from host memory, and after a
// restart from storage, with outputs token for token those of a cold run; so does the next turn of a conversation
// whose tail was evicted with it.
TEST(Engine, HostAndStorageHitsGiveIdenticalOutput) {
    const auto dir = std::filesystem::temp_directory_path() / ("peregrine-engine-hicache-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    for (const char* fx : {"dsv41-tiny-a", "dsv4-tiny-b"}) {
        Model& m = model(fx);
        const int P = m.layout().page_tokens;
        auto p = prompt(fx, 4 * P + 5);
        const auto ref = reference_greedy(m, p, 8);
        EngineOptions o = opts(16);
        o.context_length = 16 * P;
        o.hicache.enabled = true;
        o.hicache.host_pages = {64, 64};
        o.hicache.write_through = std::string(fx) == "dsv4-tiny-b";  // both policies
        o.hicache.storage_backend = "file";
        o.hicache.storage_dir = dir / fx;
        o.hicache.identity = fx;
        std::filesystem::create_directories(o.hicache.storage_dir);
        {
            Engine eng(m, nullptr, o);
            auto cold = eng.submit(p, greedy(8))->wait();
            EXPECT_EQ(cold.cached_tokens, 0);
            EXPECT_EQ(ids_of(cold), ref) << fx;
            auto dev = eng.submit(p, greedy(8))->wait();
            EXPECT_EQ(dev.cached_tokens, 4 * P) << fx;
            EXPECT_EQ(dev.cached_host + dev.cached_storage, 0) << fx;
            EXPECT_EQ(ids_of(dev), ref) << fx;
            // Other prompts take every device page: p's rows go to host memory.
            for (int i = 1; i <= 3; ++i) eng.submit(prompt(fx, 10 * P, 13 * i), greedy(2))->wait();
            auto host = eng.submit(p, greedy(8))->wait();
            EXPECT_EQ(host.cached_tokens, 4 * P) << fx;
            EXPECT_GT(host.cached_host, 0) << fx;
            EXPECT_EQ(ids_of(host), ref) << fx;
            // The next turn resumes at the end of the last one, its tail brought back too.
            auto turn2 = p;
            for (auto t : ref) turn2.push_back(t);
            turn2.push_back(p[2]);
            const auto ref2 = reference_greedy(m, turn2, 6);
            for (int i = 1; i <= 3; ++i) eng.submit(prompt(fx, 10 * P, 17 * i), greedy(2))->wait();
            auto t2 = eng.submit(turn2, greedy(6))->wait();
            EXPECT_EQ(t2.cached_tokens, static_cast<int64_t>(turn2.size() - 1) / P * P) << fx;
            EXPECT_GT(t2.cached_host, 0) << fx;
            EXPECT_EQ(ids_of(t2), ref2) << fx;
            const auto st = eng.stats();
            EXPECT_GT(st.bytes_to_host_total, 0u);
            EXPECT_GT(st.bytes_from_host_total, 0u);
            EXPECT_GT(st.cached_tokens_host_total, 0u);
        }
        // A restart: host memory is gone, storage is not.
        Engine eng(m, nullptr, o);
        auto stored = eng.submit(p, greedy(8))->wait();
        EXPECT_EQ(stored.cached_tokens, 4 * P) << fx;
        EXPECT_EQ(stored.cached_storage, 4 * P) << fx;
        EXPECT_EQ(ids_of(stored), ref) << fx;
        EXPECT_GT(eng.stats().bytes_from_storage_total, 0u);
    }
    std::filesystem::remove_all(dir);
}

TEST(Engine, RunningRequestsShareTheirPrefixPages) {
    for (const char* fx : {"dsv4-tiny-a", "dsv41-tiny-a"}) {
        Model& m = model(fx);
        const int P = m.layout().page_tokens;
        auto p = prompt(fx, 2 * P + 5);
        auto ref = reference_greedy(m, p, 20);
        Engine eng(m, nullptr, opts(64));
        // Two at once: both compute the prefix in the same step (the second keeps its duplicate pages).
        auto a = eng.submit(p, greedy(20)), b = eng.submit(p, greedy(20));
        RequestDelta first;
        while (!a->next(first, std::chrono::milliseconds(1000))) {
        }
        // A third arrives while they run: the prompt's pages are already in the cache.
        auto c = eng.submit(p, greedy(20))->wait();
        EXPECT_EQ(c.cached_tokens, 2 * P) << fx;
        EXPECT_EQ(ids_of(c), ref) << fx;
        auto da = a->wait(), db = b->wait();
        auto ia = ids_of(da);
        ia.insert(ia.begin(), first.tokens[0].id);
        EXPECT_EQ(ia, ref) << fx;
        EXPECT_EQ(ids_of(db), ref) << fx;
        // Everything is released: only unreferenced cached pages remain.
        for (int i = 0; i < 2000 && eng.stats().running; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        auto st = eng.stats();
        EXPECT_EQ(st.pages_used, st.pages_cached);
        EXPECT_EQ(st.pages_evictable, st.pages_cached);
    }
}

TEST(Engine, PreemptionUnderTinyBudgetLosesNothing) {
    for (const char* fx : {"dsv4-tiny-a", "dsv41-tiny-a"}) {
        Model& m = model(fx);
        const int P = m.layout().page_tokens;
        for (bool cache : {true, false}) {
            if (!cache && std::string(fx) == "dsv41-tiny-a") continue;  // keep the suite fast
            // 6 pages: two requests of up to 3 pages each, so six requests keep preempting each other.
            Engine eng(m, nullptr, opts(6, cache));
            std::vector<std::vector<int32_t>> prompts;
            std::vector<std::shared_ptr<RequestStream>> streams;
            for (int i = 0; i < 6; ++i) {
                prompts.push_back(prompt(fx, P + 3 + i, 3 * i));
                GenerationParams g = greedy(2 * P - 8 - i);
                if (i % 2) {  // seeded sampling resumes exactly too
                    g.sampling.temperature = 0.9f;
                    g.sampling.seed = 100 + i;
                }
                streams.push_back(eng.submit(prompts.back(), g));
            }
            int64_t preempted = 0;
            std::vector<RequestDelta> results;
            for (auto& st : streams) results.push_back(st->wait());
            for (int i = 0; i < 6; ++i) {
                const auto& d = results[static_cast<size_t>(i)];
                ASSERT_EQ(d.finish, FinishReason::length) << d.error;
                preempted += d.preemptions;
                if (i % 2 == 0)
                    EXPECT_EQ(ids_of(d), reference_greedy(m, prompts[static_cast<size_t>(i)], 2 * P - 8 - i)) << fx;
                else {  // same seed alone in a big pool
                    Engine solo(m, nullptr, opts(64));
                    GenerationParams g = greedy(2 * P - 8 - i);
                    g.sampling.temperature = 0.9f;
                    g.sampling.seed = 100 + i;
                    EXPECT_EQ(ids_of(d), ids_of(solo.submit(prompts[static_cast<size_t>(i)], g)->wait())) << fx;
                }
            }
            EXPECT_GT(preempted, 0) << fx;
            EXPECT_EQ(eng.stats().preemptions_total, static_cast<uint64_t>(preempted));
            EXPECT_EQ(eng.stats().running, 0);
        }
    }
}

// Speculative decoding: drafts verified by the next step give exactly the greedy tokens whatever they are. An oracle
// drafter (right, partly right: cuts inside and across compressor groups and pages, or wrong) among batched requests,
// with and without preemption; then V4.1's own DSpark head.
TEST(Engine, SpeculativeDecodingKeepsGreedyOutputs) {
    for (const char* fx : {"dsv41-tiny-a", "dsv4-tiny-a"}) {
        Model& m = model(fx);
        std::vector<std::vector<int32_t>> prompts, refs;
        for (int i = 0; i < 5; ++i) {
            prompts.push_back(prompt(fx, 5 + 9 * i, i));
            refs.push_back(reference_greedy(m, prompts.back(), 20));  // within the fixtures' 64-token context
        }
        for (int64_t pages : {64, 6}) {  // 6 pages: requests keep preempting each other
            auto calls = std::make_shared<int>(0);
            EngineOptions o = opts(pages);
            o.speculative_draft_tokens = 4;
            o.drafter = [&, calls](const std::vector<int32_t>& seq, int k) {
                std::vector<int32_t> d;
                for (size_t i = 0; i < prompts.size(); ++i) {
                    const auto& p = prompts[i];
                    if (seq.size() < p.size() || !std::equal(p.begin(), p.end(), seq.begin())) continue;
                    const size_t done = seq.size() - p.size();  // outputs so far (the last one not yet fed)
                    for (int j = 0; j < k && done + j < refs[i].size(); ++j) {
                        const int32_t right = refs[i][done + static_cast<size_t>(j)];
                        d.push_back((*calls + j) % 3 == 2 ? (right + 1) % m.config().vocab_size : right);
                    }
                    break;
                }
                ++*calls;
                return d;
            };
            Engine eng(m, nullptr, o);
            std::vector<std::shared_ptr<RequestStream>> streams;
            for (auto& p : prompts) streams.push_back(eng.submit(p, greedy(20)));
            for (size_t i = 0; i < streams.size(); ++i) {
                auto d = streams[i]->wait();
                ASSERT_EQ(d.finish, FinishReason::length) << d.error;
                EXPECT_EQ(ids_of(d), refs[i]) << fx << " request " << i << ", " << pages << " pages";
            }
            const EngineStats st = eng.stats();
            EXPECT_GT(st.spec_verify_total, 0u);
            EXPECT_GT(st.spec_accepted_tokens_total, 0u) << fx;
            EXPECT_LT(st.spec_accepted_tokens_total, st.spec_draft_tokens_total) << fx;
            EXPECT_EQ(st.spec_accept_length.count, st.spec_verify_total);
            ASSERT_EQ(st.spec_drafts_by_position.size(), 4u);
            uint64_t drafts = 0, accepted = 0;
            for (size_t i = 0; i < 4; ++i) {
                drafts += st.spec_drafts_by_position[i];
                accepted += st.spec_accepted_by_position[i];
                if (i > 0) EXPECT_LE(st.spec_accepted_by_position[i], st.spec_accepted_by_position[i - 1]);
            }
            EXPECT_EQ(drafts, st.spec_draft_tokens_total);
            EXPECT_EQ(accepted, st.spec_accepted_tokens_total);
            EXPECT_GT(st.spec_verify_step.count, 0u);
            EXPECT_LE(st.spec_verify_step.count, st.spec_verify_total);
            if (pages == 6) EXPECT_GT(st.preemptions_total, 0u) << fx;
        }
    }
    Model& m = model("dsv41-tiny-a");  // its DSpark head drafts
    EngineOptions o = opts(64);
    o.speculative_draft_tokens = m.config().dspark_block_size;
    Engine eng(m, nullptr, o);
    auto p = prompt("dsv41-tiny-a", 30);
    EXPECT_EQ(ids_of(eng.submit(p, greedy(20))->wait()), reference_greedy(m, p, 20));
    EXPECT_GT(eng.stats().spec_verify_total, 0u);
    EngineOptions v4 = opts(64);
    v4.speculative_draft_tokens = 2;
    EXPECT_THROW(Engine(model("dsv4-tiny-a"), nullptr, v4), Error) << "V4 has no DSpark head";
}

namespace {

// A grammar over token ids: no token in the same class (id mod 3) as the one before it. Keeps its history so that
// speculative decoding can show it drafts and undo them.
class NoRepeatedClass : public LogitProcessor {
public:
    void process(float* logits, int vocab) override {
        if (hist_.empty()) return;
        for (int i = hist_.back() % 3; i < vocab; i += 3) logits[i] = -INFINITY;
    }
    void accept(int32_t id) override {
        if (!hist_.empty()) EXPECT_NE(id % 3, hist_.back() % 3) << "a token the mask forbade";
        hist_.push_back(id);
    }
    int max_rollback() const override { return 8; }
    void rollback(int n) override {
        ASSERT_LE(n, static_cast<int>(hist_.size()));
        hist_.resize(hist_.size() - static_cast<size_t>(n));
    }
    std::vector<int32_t> hist_;
};

// Sampling parameters a speculative step must honour at every drafted position.
std::vector<GenerationParams> sampled_params(int n) {
    std::vector<GenerationParams> v(5, greedy(n));
    v[0].sampling.temperature = 1.0f;
    v[0].sampling.top_p = 0.9f;
    v[1].sampling.temperature = 0.7f;
    v[1].sampling.top_k = 20;
    v[1].sampling.min_p = 0.05f;
    v[1].logprobs = true;
    v[1].top_logprobs = 3;
    v[2].sampling.temperature = 0.9f;
    v[2].sampling.presence_penalty = 0.4f;
    v[2].sampling.frequency_penalty = 0.3f;
    v[2].sampling.repetition_penalty = 1.3f;
    v[2].sampling.logit_bias = {{5, 2.0f}, {9, -1.5f}};
    v[3].ignore_eos = false;  // the end of sequence is masked until min_new_tokens
    v[3].min_new_tokens = n - 2;
    v[4].sampling.temperature = 1.0f;
    for (size_t i = 0; i < v.size(); ++i) v[i].sampling.seed = static_cast<int64_t>(100 + i);
    return v;
}

// Chi-square statistic of two samples' histograms over the same bins (bins with fewer than 10 in both merged) and its
// degrees of freedom.
std::pair<double, int> chi_square(const std::map<int32_t, int>& a, const std::map<int32_t, int>& b) {
    std::map<int32_t, std::pair<double, double>> bins;
    for (auto [k, n] : a) bins[k].first += n;
    for (auto [k, n] : b) bins[k].second += n;
    std::vector<std::pair<double, double>> cells(1, {0.0, 0.0});  // cells[0]: the merged rare bins
    for (auto [k, c] : bins) {
        if (c.first + c.second < 10) cells[0].first += c.first, cells[0].second += c.second;
        else cells.push_back(c);
    }
    if (cells[0].first + cells[0].second == 0) cells.erase(cells.begin());
    double na = 0, nb = 0;
    for (auto [x, y] : cells) na += x, nb += y;
    double chi = 0;
    for (auto [x, y] : cells) {
        const double ea = (x + y) * na / (na + nb), eb = (x + y) * nb / (na + nb);
        chi += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
    }
    return {chi, static_cast<int>(cells.size()) - 1};
}

// The chi-square distribution's upper 0.1% point (Wilson-Hilferty; within 1% from 3 degrees of freedom).
double chi_square_critical_001(int df) {
    const double z = 3.0902, k = 2.0 / (9.0 * df);
    return df * std::pow(1.0 - k + z * std::sqrt(k), 3.0);
}

}  // namespace

// Seeded samples are the same tokens (and log-probabilities) with speculation as without: temperature, top-k/p,
// min-p, penalties, logit bias, min_new_tokens and a grammar mask at every drafted position, drafts right, partly
// right and wrong, with and without preemption; then V4.1's DSpark head drafting with the requests' own sampling.
TEST(Engine, SpeculativeSamplingGivesTheSameSeededTokens) {
    for (const char* fx : {"dsv41-tiny-a", "dsv4-tiny-a"}) {
        Model& m = model(fx);
        const auto params = sampled_params(20);
        std::vector<std::vector<int32_t>> prompts;
        for (size_t i = 0; i < params.size(); ++i) prompts.push_back(prompt(fx, 6 + 8 * static_cast<int>(i), 3 * i));
        auto run = [&](EngineOptions o) {
            Engine eng(m, nullptr, std::move(o));
            std::vector<std::shared_ptr<RequestStream>> streams;
            for (size_t i = 0; i < prompts.size(); ++i) {
                GenerationParams g = params[i];
                if (i == 4) g.processor = std::make_shared<NoRepeatedClass>();
                streams.push_back(eng.submit(prompts[i], g));
            }
            std::vector<RequestDelta> out;
            for (auto& st : streams) out.push_back(st->wait());
            return std::make_pair(out, eng.stats());
        };
        const auto refs = run(opts(64)).first;
        for (int64_t pages : {64, 6}) {
            auto calls = std::make_shared<int>(0);
            EngineOptions o = opts(pages);
            o.speculative_draft_tokens = 3;
            o.drafter = [&, calls](const std::vector<int32_t>& seq, int k) {  // the reference's tokens, some wrong
                std::vector<int32_t> d;
                for (size_t i = 0; i < prompts.size(); ++i) {
                    const auto& p = prompts[i];
                    if (seq.size() < p.size() || !std::equal(p.begin(), p.end(), seq.begin())) continue;
                    const auto right = ids_of(refs[i]);
                    for (size_t j = seq.size() - p.size(); d.size() < static_cast<size_t>(k) && j < right.size(); ++j)
                        d.push_back((*calls + static_cast<int>(j)) % 4 == 3 ? (right[j] + 1) % 64 : right[j]);
                    break;
                }
                ++*calls;
                return d;
            };
            auto [got, st] = run(o);
            for (size_t i = 0; i < refs.size(); ++i) {
                ASSERT_EQ(got[i].finish, refs[i].finish) << got[i].error;
                EXPECT_EQ(ids_of(got[i]), ids_of(refs[i])) << fx << " request " << i << ", " << pages << " pages";
                if (!params[i].logprobs) continue;
                for (size_t t = 0; t < refs[i].tokens.size(); ++t) {
                    EXPECT_EQ(got[i].tokens[t].logprob, refs[i].tokens[t].logprob) << fx << " token " << t;
                    ASSERT_EQ(got[i].tokens[t].top.size(), 3u);
                    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(got[i].tokens[t].top[j].id, refs[i].tokens[t].top[j].id);
                }
            }
            EXPECT_GT(st.spec_accepted_tokens_total, st.spec_verify_total / 2) << fx;
            EXPECT_LT(st.spec_accepted_tokens_total, st.spec_draft_tokens_total) << fx;
        }
        if (!m.has_dspark()) continue;
        EngineOptions o = opts(64);
        o.speculative_draft_tokens = m.config().dspark_block_size;
        auto [got, st] = run(o);
        for (size_t i = 0; i < refs.size(); ++i) EXPECT_EQ(ids_of(got[i]), ids_of(refs[i])) << "DSpark, request " << i;
        EXPECT_GT(st.spec_verify_total, 0u);
    }
}

// The distribution of sampled tokens at drafted positions is the target's: 20,000 seeded samples with speculation
// against 20,000 without (other seeds) pass a two-sample chi-square test at the 0.1% level, for temperature 1,
// top-p 0.9 and a grammar mask. The drafts are the most frequent tokens at those positions (a draft distribution
// far from the target's: accepting drafts wrongly would pile the samples onto them).
TEST(Engine, SpeculativeSamplingKeepsTheTargetDistribution) {
    if (switch_set("PEREGRINE_ENGINE_OVERLAP")) GTEST_SKIP() << "speculation turns the overlapped schedule off";
    // dsv41-tiny-a narrowed to one window-only layer (made-up weights): cheap enough for 120,000 requests.
    ModelConfig c = model("dsv41-tiny-a").config();
    c.dim = 64;
    c.n_heads = 2;
    c.q_lora_rank = c.o_lora_rank = c.moe_inter_dim = 32;
    c.o_groups = 1;
    c.n_routed_experts = 4;
    c.n_layers = 1;
    c.n_mtp_layers = 0;
    c.compress_ratios = {0};
    c.kv_source_layers = c.index_source_layers = c.engram_layer_ids = {};
    c.engram_num_embeddings = {};
    c.candidate_source_layer = -1;
    c.dspark_target_layer_ids = {};
    c.dspark_block_size = 0;
    auto tiny = Model::synthetic(c);
    Model& m = *tiny;
    const int n = 20000;
    const auto p = prompt("dsv41-tiny-a", 2);
    for (int config = 0; config < 3; ++config) {
        GenerationParams g = greedy(4);
        g.sampling.temperature = 1.0f;
        // Made-up weights give nearly flat logits: a bias makes the distribution worth drafting for (part of the
        // target's distribution like any request's).
        g.sampling.logit_bias = {{5, 5.0f}, {9, 4.0f}, {17, 3.0f}, {33, 3.0f}, {40, 2.0f}, {41, 2.0f}, {60, 1.0f}};
        if (config == 1) g.sampling.top_p = 0.9f;
        // Positions 1 and 2 of each output: the two drafted ones (position 0 comes from the prompt's step).
        auto sample = [&](EngineOptions o, int64_t seed0, std::array<std::map<int32_t, int>, 2>& hist) {
            o.max_running_requests = 256;
            o.max_queued_requests = n;
            o.chunked_prefill_size = 4096;
            Engine eng(m, nullptr, std::move(o));
            std::vector<std::shared_ptr<RequestStream>> streams;
            for (int i = 0; i < n; ++i) {
                g.sampling.seed = seed0 + i;
                if (config == 2) g.processor = std::make_shared<NoRepeatedClass>();
                streams.push_back(eng.submit(p, g));
            }
            for (auto& s : streams) {
                auto ids = ids_of(s->wait());
                EXPECT_EQ(ids.size(), 4u);
                ++hist[0][ids.at(1)];
                ++hist[1][ids.at(2)];
            }
            return eng.stats();
        };
        std::array<std::map<int32_t, int>, 2> plain, spec;
        sample(opts(2048), 0, plain);
        std::vector<int32_t> modes;
        for (auto& h : plain)
            modes.push_back(std::max_element(h.begin(), h.end(), [](auto& a, auto& b) { return a.second < b.second; })
                                ->first);
        EngineOptions o = opts(2048);
        o.speculative_draft_tokens = 2;
        o.drafter = [&](const std::vector<int32_t>& seq, int k) {
            return std::vector<int32_t>(modes.begin(), modes.begin() + std::min<int64_t>(k, 3 + p.size() - seq.size()));
        };
        const EngineStats st = sample(o, n, spec);
        EXPECT_GT(st.spec_accepted_tokens_total, st.spec_verify_total / 20) << "config " << config;
        EXPECT_LT(st.spec_accepted_tokens_total, st.spec_draft_tokens_total / 2) << "config " << config;
        for (int pos = 0; pos < 2; ++pos) {
            auto [chi, df] = chi_square(plain[pos], spec[pos]);
            ASSERT_GE(df, 3) << "config " << config;
            EXPECT_LT(chi, chi_square_critical_001(df)) << "config " << config << ", position " << pos + 1 << ": "
                                                        << df << " degrees of freedom";
            std::printf("config %d position %d: chi-square %.1f, %d degrees of freedom (0.1%% point %.1f); %llu of %llu "
                        "drafts accepted\n", config, pos + 1, chi, df, chi_square_critical_001(df),
                        static_cast<unsigned long long>(st.spec_accepted_tokens_total),
                        static_cast<unsigned long long>(st.spec_draft_tokens_total));
        }
    }
}

TEST(Engine, SeedGivesSameOutputWhateverTheBatch) {
    Model& m = model("dsv4-tiny-a");
    GenerationParams g;
    g.sampling.temperature = 1.0f;
    g.sampling.top_p = 0.9f;
    g.sampling.seed = 7;
    g.max_new_tokens = 16;
    g.ignore_eos = true;
    auto p = prompt("dsv4-tiny-a", 20);
    Engine a(m, nullptr, opts(64));
    auto alone = ids_of(a.submit(p, g)->wait());
    Engine b(m, nullptr, opts(64));
    std::vector<std::shared_ptr<RequestStream>> others;
    for (int i = 0; i < 4; ++i) others.push_back(b.submit(prompt("dsv4-tiny-a", 30, 5 * i), greedy(16)));
    auto crowded = ids_of(b.submit(p, g)->wait());
    for (auto& o : others) o->wait();
    EXPECT_EQ(alone, crowded);
    g.sampling.seed = 8;
    EXPECT_NE(ids_of(a.submit(p, g)->wait()), alone);
}

TEST(Engine, CancelFreesMemory) {
    Model& m = model("dsv4-tiny-a");
    Engine eng(m, nullptr, opts(64, false));
    auto s = eng.submit(prompt("dsv4-tiny-a", 40), greedy(200));
    RequestDelta d;
    while (!s->next(d, std::chrono::milliseconds(1000)) || d.tokens.empty()) {
    }
    EXPECT_GT(eng.stats().pages_used, 0);
    s->cancel();
    auto rest = s->wait();
    EXPECT_EQ(rest.finish, FinishReason::abort);
    for (int i = 0; i < 100 && eng.stats().pages_used != 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(eng.stats().pages_used, 0);
    EXPECT_EQ(eng.stats().running, 0);
    EXPECT_EQ(eng.stats().requests_aborted, 1u);
}

TEST(Engine, RejectsWhatCannotRun) {
    Model& m = model("dsv4-tiny-a");
    EngineOptions o = opts(4);
    o.max_queued_requests = 2;
    o.max_running_requests = 1;
    Engine eng(m, nullptr, o);
    EXPECT_THROW(eng.submit({}, greedy(4)), Error);
    EXPECT_THROW(eng.submit({1, 2, 256}, greedy(4)), Error);                       // outside the vocabulary
    EXPECT_THROW(eng.submit(prompt("dsv4-tiny-a", 256), greedy(4)), Error);        // the whole context
    EXPECT_THROW(eng.submit(prompt("dsv4-tiny-a", 4 * 16), greedy(4)), Error);     // more than the KV memory
    EXPECT_THROW(eng.submit(prompt("dsv4-tiny-a", 4), greedy(0)), Error);
    // One runs, two wait, the next is refused.
    std::vector<std::shared_ptr<RequestStream>> s;
    s.push_back(eng.submit(prompt("dsv4-tiny-a", 8), greedy(40)));
    RequestDelta d;
    while (!s[0]->next(d, std::chrono::milliseconds(1000))) {
    }
    s.push_back(eng.submit(prompt("dsv4-tiny-a", 8), greedy(4)));
    s.push_back(eng.submit(prompt("dsv4-tiny-a", 8), greedy(4)));
    EXPECT_THROW(eng.submit(prompt("dsv4-tiny-a", 8), greedy(4)), QueueFullError);
    for (auto& x : s) x->wait();
    EXPECT_EQ(eng.stats().requests_rejected, 1u);
}

TEST(Engine, StopsOnEosAndStopIdsAndContext) {
    Model& m = model("dsv4-tiny-a");
    auto p = prompt("dsv4-tiny-a", 12);
    auto ref = reference_greedy(m, p, 8);
    Engine eng(m, nullptr, opts(64));
    GenerationParams g = greedy(8);
    g.stop_token_ids = {ref[3]};
    auto d = eng.submit(p, g)->wait();
    EXPECT_EQ(d.finish, FinishReason::stop);
    auto first = std::find(ref.begin(), ref.end(), ref[3]) - ref.begin();
    EXPECT_EQ(ids_of(d), std::vector<int32_t>(ref.begin(), ref.begin() + first));  // the stop id is not output
    EXPECT_EQ(d.completion_tokens, first + 1);
    // min_new_tokens keeps stop ids away until then.
    g.min_new_tokens = 8;
    auto e = eng.submit(p, g)->wait();
    EXPECT_EQ(e.completion_tokens, 8);
    // The context ends generation with "length".
    auto near = prompt("dsv4-tiny-a", 250);
    auto c = eng.submit(near, greedy(100))->wait();
    EXPECT_EQ(c.finish, FinishReason::length);
    EXPECT_EQ(c.completion_tokens, 6);
}

// The overlapped schedule (the next step enqueued before the current step's tokens are on the host, its inputs
// deferred ids) changes no token, logprob or finish: a mixed batch of greedy, seeded, logprob, stop-id,
// min-tokens, one-token and EOS-ended requests, with a penalised one that makes some steps wait for their tokens.
TEST(Engine, OverlapScheduleGivesTheSameTokens) {
    for (const char* fx : {"dsv4-tiny-a", "dsv41-tiny-a"}) {
        Model& m = model(fx);
        std::vector<std::pair<std::vector<int32_t>, GenerationParams>> reqs;
        for (int i = 0; i < 8; ++i) {
            GenerationParams g = greedy(6 + 3 * i);
            if (i % 2) {
                g.sampling.temperature = 0.9f;
                g.sampling.top_p = 0.95f;
                g.sampling.seed = 40 + i;
            }
            if (i == 1) g.logprobs = true, g.top_logprobs = 3;
            if (i == 2) g.max_new_tokens = 1;
            if (i == 3) g.ignore_eos = false;
            if (i == 4) g.stop_token_ids = {7, 9, 11, 13}, g.min_new_tokens = 3;
            if (i == 5) g.sampling.frequency_penalty = 0.5f;  // host-known history: its steps do not overlap
            reqs.emplace_back(prompt(fx, 4 + 7 * i, 2 * i), g);
        }
        auto run = [&](int overlap, bool with_penalised, EngineStats* stats) {
            EngineOptions o = opts(64);
            o.overlap_schedule = overlap;
            Engine eng(m, nullptr, o);
            std::vector<std::shared_ptr<RequestStream>> streams;
            for (size_t i = 0; i < reqs.size(); ++i)
                if (with_penalised || i != 5) streams.push_back(eng.submit(reqs[i].first, reqs[i].second));
            std::vector<RequestDelta> out;
            for (auto& st : streams) out.push_back(st->wait());
            for (int i = 0; i < 200 && eng.stats().running != 0; ++i)
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            *stats = eng.stats();
            return out;
        };
        for (bool with_penalised : {false, true}) {
            EngineStats on_stats, off_stats;
            auto on = run(1, with_penalised, &on_stats), off = run(0, with_penalised, &off_stats);
            ASSERT_EQ(on.size(), off.size());
            for (size_t i = 0; i < on.size(); ++i) {
                EXPECT_EQ(on[i].finish, off[i].finish) << fx << " request " << i;
                EXPECT_EQ(on[i].completion_tokens, off[i].completion_tokens) << fx << " request " << i;
                ASSERT_EQ(ids_of(on[i]), ids_of(off[i])) << fx << " request " << i;
                for (size_t t = 0; t < on[i].tokens.size(); ++t) {
                    EXPECT_EQ(on[i].tokens[t].logprob, off[i].tokens[t].logprob);
                    ASSERT_EQ(on[i].tokens[t].top.size(), off[i].tokens[t].top.size());
                    for (size_t k = 0; k < on[i].tokens[t].top.size(); ++k)
                        EXPECT_EQ(on[i].tokens[t].top[k].id, off[i].tokens[t].top[k].id);
                }
            }
            EXPECT_EQ(on_stats.generation_tokens_total, off_stats.generation_tokens_total);
            // The penalised request runs through most of the batch's steps on dsv41-tiny-a's short context.
            if (!with_penalised) EXPECT_GT(on_stats.steps_overlapped, 0u) << fx;
            EXPECT_EQ(off_stats.steps_overlapped, 0u);
            EXPECT_EQ(on_stats.running, 0);
            EXPECT_EQ(on_stats.pages_used, on_stats.pages_cached) << "no page held once the requests are gone";
            EXPECT_EQ(off_stats.pages_used, off_stats.pages_cached);
        }
    }
}

// Data-parallel attention with expert parallelism: three ranks of one in-process group, each with its own
// scheduler, pages and requests, and a third of the experts. Greedy outputs equal one model's; ranks with
// nothing of their own keep serving their experts; the summed stats count every request.
TEST(Engine, ExpertParallelRanksMatchOneModel) {
    for (const char* fx : {"dsv4-tiny-a", "dsv41-tiny-a"}) {
        Model& single = model(fx);
        std::vector<std::vector<int32_t>> prompts, refs;
        for (int i = 0; i < 5; ++i) {
            prompts.push_back(prompt(fx, 5 + 9 * i, i));
            refs.push_back(reference_greedy(single, prompts.back(), 10));
        }
        const int n = 2;
        auto group = make_loopback_group(n);
        std::vector<std::unique_ptr<Model>> ranks;
        std::vector<Model*> ptrs;
        for (int r = 0; r < n; ++r) {
            ranks.push_back(Model::load(fixture_dir(fx)));
            const int E = ranks.back()->config().n_routed_experts;
            ranks.back()->set_expert_parallel(std::make_shared<ExpertParallel>(*group[static_cast<size_t>(r)],
                                                                               ExpertPlacement::contiguous(E, n)));
            ptrs.push_back(ranks.back().get());
        }
        Engine eng(ptrs, nullptr, opts(64));
        EXPECT_EQ(eng.ranks(), n);
        // One request alone first (the other rank idles through every step), then all at once.
        auto solo = eng.submit(prompts[0], greedy(10))->wait();
        EXPECT_EQ(ids_of(solo), refs[0]) << fx;
        std::vector<std::shared_ptr<RequestStream>> streams;
        for (auto& p : prompts) streams.push_back(eng.submit(p, greedy(10)));
        for (int i = 0; i < 5; ++i) {
            auto d = streams[static_cast<size_t>(i)]->wait();
            EXPECT_EQ(d.finish, FinishReason::length);
            EXPECT_EQ(ids_of(d), refs[static_cast<size_t>(i)]) << fx << " request " << i;
        }
        const EngineStats s = eng.stats();
        EXPECT_EQ(s.requests_finished, 6u);
        EXPECT_EQ(s.generation_tokens_total, 60u);
        EXPECT_EQ(s.pages_total, 2 * 64);
    }
}
