#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/output_processor.h"
#include "engine/scheduler.h"
#include "util/log.h"
#include "util/switches.h"

#include <condition_variable>
#include <deque>
#include <mutex>

namespace peregrine {

namespace {
double ms_since(EngineClock::time_point t) {
    return std::chrono::duration<double, std::milli>(EngineClock::now() - t).count();
}

// PEREGRINE_ENGINE_TRACE=1: the host's time per step by phase, logged as averages every 500 steps.
struct StepTrace {
    bool on = false;
    int64_t steps = 0;
    double build = 0, forward = 0, wait = 0, deliver = 0, total = 0;
    void add(double b, std::pair<double, double> run, double d, double t, const std::optional<SpecSchedule>& spec) {
        if (!on) return;
        build += b, forward += run.first, wait += run.second, deliver += d, total += t;
        if (++steps < 500) return;
        const double n = static_cast<double>(steps);
        spdlog::info("engine trace: {} steps, ms/step: build {:.3f}, forward enqueue {:.3f}, wait for tokens {:.3f}, "
                     "deliver {:.3f}, all {:.3f}{}", steps, build / n, forward / n, wait / n, deliver / n, total / n,
                     spec ? "; " + spec->corrections() : "");
        *this = StepTrace{true};
    }
};
}  // namespace

// One rank: its engine thread, requests and state pages. A step reads as the three parts: the scheduler decides
// what runs, the model runner runs it and samples, the output processor delivers the tokens.
struct Engine::Impl {
    Model& model;
    CacheManager kv;
    OutputProcessor output;
    Scheduler scheduler;
    ModelRunner runner;

    // Shared with client threads.
    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<RequestPtr> incoming;
    std::atomic<int64_t> n_running{0};
    bool stop = false, wake = false;
    std::atomic<bool> failed{false};  // its expert-parallel group failed: no more requests
    int64_t flush_pending = 0;        // flush requests not yet served
    int64_t flush_result = 0;
    std::condition_variable flush_cv;

    StepTrace trace;
    bool group_stopped = false, group_failed = false;
    std::thread thread;

    Impl(Model& m, const Tokenizer* tok, const EngineOptions& o)
        : model(m),
          kv(m.backend().state_memory(), m.layout(), {o.kv_pages, o.window_pages > 0 ? o.window_pages : o.kv_pages},
             o.radix_cache, o.hicache, o.swa_replay),
          output(scheduler, tok, m.config().eos_token_id, m.config().vocab_size, o.context_length),
          scheduler(kv, {o.max_running_requests, o.chunked_prefill_size, o.context_length}, output),
          runner(m, kv, tok, o.overlap_schedule, o.speculative_draft_tokens, o.drafter) {
        if (o.speculative_draft_tokens > 0 && o.speculative_schedule)
            runner.set_spec_schedule(
                SpecSchedule::profile(m, kv.pool(), o.max_running_requests, o.speculative_draft_tokens));
        output.publish_gauges(kv);
        trace.on = switch_is("PEREGRINE_ENGINE_TRACE", "1");
        thread = std::thread([this] { loop(); });
    }

    ~Impl() {
        {
            std::lock_guard lk(mu);
            stop = true;
        }
        cv.notify_all();
        thread.join();
        const auto shutdown = [&](const RequestPtr& r) {
            scheduler.remove(r);
            r->stream->finish(FinishReason::abort, "", "", "server shutting down", r->completion);
        };
        for (auto r : std::vector<RequestPtr>(scheduler.running().begin(), scheduler.running().end())) shutdown(r);
        for (auto r : std::vector<RequestPtr>(scheduler.waiting().begin(), scheduler.waiting().end())) shutdown(r);
        for (auto& r : incoming) r->stream->finish(FinishReason::abort, "", "", "server shutting down", 0);
    }

    void notify() {
        {
            std::lock_guard lk(mu);
            wake = true;
        }
        cv.notify_all();
    }

    // ---- the step ----------------------------------------------------------------------------------

    void step() {
        const auto t0 = EngineClock::now();
        serve_flush();
        // Cancelled requests leave first, so that their pages serve this very step.
        for (auto r : std::vector<RequestPtr>(scheduler.waiting().begin(), scheduler.waiting().end()))
            if (r->stream->cancelled()) output.finish(r, FinishReason::abort, "");
        for (auto r : std::vector<RequestPtr>(scheduler.running().begin(), scheduler.running().end()))
            if (r->stream->cancelled()) output.finish(r, FinishReason::abort, r->text.flush());
        scheduler.admit();
        // Without the overlapped schedule this step, the launched step's tokens are needed first.
        const bool overlap = runner.overlapping(scheduler.running());
        if (!overlap) output.process(runner.drain());
        runner.draft(scheduler.running());
        ScheduledBatch batch = scheduler.schedule();
        const double build = ms_since(t0);
        if (batch.empty()) {
            output.process(runner.drain());
            return runner.idle_step();
        }
        StepOutput out = runner.run(batch, overlap);
        const auto td = EngineClock::now();
        output.process(std::move(out));
        // Every request ended: nothing to overlap with.
        if (overlap && scheduler.running().empty()) output.process(runner.drain());
        const double total = ms_since(t0);
        runner.note_step_seconds(total / 1e3);
        trace.add(build, runner.take_times(), ms_since(td), total, runner.spec_schedule());
    }

    // At shutdown or after a failed step (`why`): every started sample is dropped and no request waits for a token
    // any more; after a failure, a preempted request whose token is lost ends with the error.
    void drop_launched(const std::string& why = "") {
        try {
            runner.discard();
        } catch (const std::exception& e) {
            spdlog::error("dropping the started samples: {}", e.what());
        }
        for (auto r : std::vector<RequestPtr>(scheduler.waiting().begin(), scheduler.waiting().end()))
            if (r->pending && !why.empty()) output.finish(r, FinishReason::error, r->text.flush(), {}, why);
        for (auto& r : scheduler.running()) r->pending = 0;
        for (auto& r : scheduler.waiting()) r->pending = 0;
    }

    // ---- the thread ---------------------------------------------------------------------------------

    void loop() {
        model.backend().bind_thread();
        ExpertParallel* ep = model.expert_parallel();
        for (;;) {
            bool stopping;
            {
                std::unique_lock lk(mu);
                const bool idle = scheduler.idle();
                auto ready = [&] { return stop || wake || !incoming.empty() || flush_pending > 0; };
                // A rank of an expert-parallel group polls: the group decides together whether to step.
                if (idle && !ep) cv.wait(lk, ready);
                else if (idle) cv.wait_for(lk, std::chrono::milliseconds(1), ready);
                stopping = stop;
                if (stop && !ep) {
                    lk.unlock();
                    drop_launched();
                    return;
                }
                wake = false;
                while (!incoming.empty()) {
                    scheduler.enqueue(std::move(incoming.front()));
                    incoming.pop_front();
                }
            }
            if (ep && !group_should_step(*ep, stopping)) {
                if (group_failed || group_stopped) return;
                continue;
            }
            try {
                step();
            } catch (const std::exception& e) {
                spdlog::error("engine step failed: {}", e.what());
                drop_launched(e.what());
                for (auto r : std::vector<RequestPtr>(scheduler.running().begin(), scheduler.running().end()))
                    output.finish(r, FinishReason::error, r->text.flush(), {}, e.what());
                if (ep) {  // the other ranks wait in this step's exchanges: the group cannot go on
                    ep->comm().abort();
                    fail_group(e.what());
                    return;
                }
            }
            output.publish_gauges(kv);
            n_running = static_cast<int64_t>(scheduler.running().size());
        }
    }

    // Expert parallelism: every rank learns whether any rank has work (then all step, idle ones through
    // Model::idle_step) or is stopping (then all stop in the same iteration).
    bool group_should_step(ExpertParallel& ep, bool stopping) {
        const bool mine = !scheduler.idle() || flush_pending > 0;
        const uint8_t flags = static_cast<uint8_t>((mine ? 1 : 0) | (stopping ? 2 : 0));
        std::vector<std::vector<uint8_t>> got;
        try {
            got = ep.comm().exchange_bytes(
                std::vector<std::vector<uint8_t>>(static_cast<size_t>(ep.comm().size()), {flags}));
        } catch (const std::exception& e) {
            fail_group(e.what());
            return false;
        }
        bool any = false;
        for (const auto& g : got) {
            if (g.empty()) continue;
            any = any || (g[0] & 1);
            group_stopped = group_stopped || (g[0] & 2);
        }
        return any && !group_stopped;
    }

    // A rank of the group failed: nothing can run any more; every request here ends with the error.
    void fail_group(const std::string& why) {
        spdlog::error("expert-parallel group failed: {}", why);
        group_failed = true;
        failed = true;
        for (auto r : std::vector<RequestPtr>(scheduler.running().begin(), scheduler.running().end()))
            output.finish(r, FinishReason::error, r->text.flush(), {}, why);
        for (auto r : std::vector<RequestPtr>(scheduler.waiting().begin(), scheduler.waiting().end()))
            output.finish(r, FinishReason::error, r->text.flush(), {}, why);
        std::lock_guard lk(mu);
        for (auto& r : incoming) r->stream->finish(FinishReason::error, "", "", why, 0);
        incoming.clear();
    }

    void serve_flush() {
        {
            std::lock_guard lk(mu);
            if (flush_pending == 0) return;
        }
        const int64_t freed = kv.flush();
        output.publish_gauges(kv);  // before the caller wakes, so stats() already shows the emptied cache
        {
            std::lock_guard lk(mu);
            flush_result = freed;
            flush_pending = 0;
        }
        flush_cv.notify_all();
    }
};

Engine::Engine(Model& model, const Tokenizer* tok, EngineOptions opts)
    : Engine(std::vector<Model*>{&model}, tok, opts) {}

Engine::Engine(std::vector<Model*> ranks, const Tokenizer* tok, EngineOptions opts)
    : model_(*ranks.at(0)), tok_(tok), opts_(opts) {
    if (opts_.context_length <= 0) opts_.context_length = model_.config().max_position_embeddings;
    PEREGRINE_CHECK(opts_.context_length > 1, "context length must be at least 2 tokens");
    PEREGRINE_CHECK(opts_.kv_pages > 0, "the engine needs at least one state page");
    PEREGRINE_CHECK(opts_.max_running_requests > 0, "max running requests must be positive");
    if (opts_.speculative_draft_tokens > 0) {
        const ModelConfig& c = model_.config();
        PEREGRINE_CHECK(opts_.drafter || model_.can_draft(),
                        "speculative decoding drafts with a DSpark head or an MTP layer, which {} has not",
                        c.model_type);
        PEREGRINE_CHECK(opts_.drafter || !model_.has_dspark() || opts_.speculative_draft_tokens <= c.dspark_block_size,
                        "{} draft tokens: the DSpark head drafts {} at a time", opts_.speculative_draft_tokens,
                        c.dspark_block_size);
        PEREGRINE_CHECK(ranks.size() == 1, "speculative decoding does not run with expert parallelism yet");
    }
    for (Model* m : ranks) {
        PEREGRINE_CHECK(ranks.size() == 1 || (m->expert_parallel() &&
                                              m->expert_parallel()->comm().size() == static_cast<int>(ranks.size())),
                        "data-parallel ranks must form one expert-parallel group");
        ranks_.push_back(std::make_unique<Impl>(*m, tok, opts_));
    }
}

Engine::~Engine() {
    // Every rank stops before any is torn down: a rank of a group stops in step with the others.
    for (auto& im : ranks_) {
        std::lock_guard lk(im->mu);
        im->stop = true;
    }
    for (auto& im : ranks_) im->cv.notify_all();
}

int64_t Engine::kv_tokens() const { return ranks_[0]->kv.capacity_tokens(); }

std::string Engine::speculative_schedule() const {
    const auto& s = ranks_[0]->runner.spec_schedule();
    return s ? s->describe() : "";
}

std::shared_ptr<RequestStream> Engine::submit(std::vector<int32_t> prompt, GenerationParams params) {
    const int vocab = model_.config().vocab_size;
    if (prompt.empty()) fail("the prompt is empty");
    for (int32_t id : prompt)
        if (id < 0 || id >= vocab) fail("prompt token id {} is outside the model's vocabulary (0..{})", id, vocab - 1);
    const int64_t n = static_cast<int64_t>(prompt.size());
    if (n >= opts_.context_length)
        fail("the prompt has {} tokens but the context length is {} (room for at least one generated token is needed)",
             n, opts_.context_length);
    if (n + 1 > kv_tokens()) fail("the prompt has {} tokens but the KV memory holds only {}", n, kv_tokens());
    if (params.max_new_tokens <= 0) fail("max_new_tokens must be positive");
    for (int32_t id : params.stop_token_ids)
        if (id < 0) fail("stop token id {} is negative", id);

    // The rank with the fewest requests (data-parallel attention: each rank its own requests and KV).
    Impl* best = nullptr;
    int64_t best_load = 0;
    for (auto& im : ranks_) {
        const int64_t load = im->scheduler.queued().load() + im->n_running.load();
        if (!best || load < best_load) {
            best = im.get();
            best_load = load;
        }
    }
    Impl& im = *best;
    if (im.failed) fail("the engine's expert-parallel group has failed; restart the server");

    auto r = std::make_shared<Request>(tok_, std::move(params));
    r->prompt_len = n;
    r->seq = std::move(prompt);
    r->arrival = EngineClock::now();
    if (r->params.sampling.repetition_penalty != 1.0f) r->penalties.add_prompt(r->seq, vocab);
    {
        std::lock_guard lk(im.mu);
        if (im.scheduler.queued().load() >= opts_.max_queued_requests) {
            im.output.count_submitted(true);
            throw QueueFullError(fmt::format("the queue is full ({} requests waiting)", im.scheduler.queued().load()));
        }
        r->id = next_id_++;
        r->stream = std::make_shared<RequestStream>(r->id);
        r->stream->set_waker([&im] { im.notify(); });
        ++im.scheduler.queued();
        im.incoming.push_back(r);
    }
    im.output.count_submitted(false);
    im.cv.notify_all();
    return r->stream;
}

EngineStats Engine::stats() const {
    EngineStats s;
    for (size_t i = 0; i < ranks_.size(); ++i) {
        EngineStats r = ranks_[i]->output.stats();
        if (i == 0) s = r;
        else s.merge(r);
    }
    return s;
}

int64_t Engine::flush_cache() {
    int64_t freed = 0;
    for (auto& p : ranks_) {
        Impl& im = *p;
        std::unique_lock lk(im.mu);
        ++im.flush_pending;
        im.cv.notify_all();
        im.flush_cv.wait(lk, [&] { return im.flush_pending == 0 || im.stop || im.failed; });
        freed += im.flush_result;
    }
    return freed;
}

}  // namespace peregrine
