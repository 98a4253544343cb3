#include "engine/engine.h"
#include "engine/text_stream.h"
#include "kv/cache_manager.h"
#include "util/log.h"
#include "util/switches.h"
#include "util/thread_pool.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <optional>

namespace peregrine {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

// One request as the scheduler sees it. Queued -> running (prefill chunks, then one token per step) ->
// finished; a running request may be preempted (its pages go to the prefix cache) and queued again at
// the front, keeping its sampler and output so that it resumes exactly where it was.
struct EngineRequest {
    enum class Phase { queued, running, preempted, finished };

    uint64_t id = 0;
    std::shared_ptr<RequestStream> stream;
    GenerationParams params;
    std::vector<int32_t> seq;  // prompt, then every sampled token on the host (the last one not yet fed)
    int64_t prompt_len = 0;
    int64_t completion = 0;  // sampled tokens, EOS / stop ids included
    Phase phase = Phase::queued;

    CachedSequence kv;  // its state and what it shares with the prefix cache
    int64_t cached_tokens = 0;
    bool admitted_once = false;
    int64_t preemptions = 0;

    Sampler sampler;
    PenaltyState penalties;
    TextStream text;

    // The overlapped schedule: tokens sampled by launched steps whose ids are not on the host yet (0-2); the
    // row of the latest launch's samples that is this request's (its next input, as a deferred id); the
    // position of its state's token history holding a deferred id (-1: none), set right when the id arrives.
    int pending = 0;
    int sample_row = -1;
    int64_t deferred_pos = -1;

    Clock::time_point arrival, last_token;
    bool got_first = false;

    EngineRequest(const Tokenizer* tok, GenerationParams p)
        : params(std::move(p)), sampler(params.sampling), text(tok, params.stop, params.skip_special_tokens) {}
    int64_t to_feed() const { return static_cast<int64_t>(seq.size()) + pending - kv.state.n_cached; }
    // Whether the overlapped schedule may sample it: its logits need no host code and its penalties no
    // knowledge of the tokens still on their way.
    bool overlappable() const { return !params.processor && !params.sampling.has_penalties(); }
};

struct Engine::Impl {
    Engine& eng;
    Model& model;
    const Tokenizer* tok;
    EngineOptions opts;
    int P, vocab;
    std::unique_ptr<CacheManager> kv;

    // Shared with client threads.
    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<std::shared_ptr<EngineRequest>> incoming;
    std::atomic<int64_t> queued{0}, n_running{0};
    bool stop = false, wake = false;
    std::atomic<bool> failed{false};  // its expert-parallel group failed: no more requests
    int64_t flush_pending = 0;  // flush requests not yet served
    int64_t flush_result = 0;
    std::condition_variable flush_cv;

    mutable std::mutex stats_mu;
    EngineStats st;
    Clock::time_point tp_window = Clock::now();
    uint64_t tp_tokens = 0;

    // Engine thread only.
    std::deque<std::shared_ptr<EngineRequest>> waiting;
    std::list<std::shared_ptr<EngineRequest>> running;  // in admission order

    std::thread thread;

    Impl(Engine& e, Model& m, const Tokenizer* t, EngineOptions o)
        : eng(e), model(m), tok(t), opts(o), P(m.layout().page_tokens), vocab(m.config().vocab_size) {
        kv = std::make_unique<CacheManager>(model.backend().state_memory(), model.layout(), opts.kv_pages,
                                            opts.radix_cache);
        st.pages_total = kv->stats().pages_total;
        st.page_tokens = P;
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
        for (auto& r : running) release(*r);
        for (auto& r : running) r->stream->finish(FinishReason::abort, "", "", "server shutting down", r->completion);
        for (auto& r : waiting) r->stream->finish(FinishReason::abort, "", "", "server shutting down", r->completion);
        for (auto& r : incoming) r->stream->finish(FinishReason::abort, "", "", "server shutting down", 0);
        kv.reset();
    }

    void notify() {
        {
            std::lock_guard lk(mu);
            wake = true;
        }
        cv.notify_all();
    }

    // ---- memory -------------------------------------------------------------------------------------

    bool ensure_pages(EngineRequest& r, int64_t n_tokens) { return kv->reserve(r.kv, n_tokens); }

    // Gives a request's pages back: whole pages of known tokens to the prefix cache (so a resumed or later request
    // with the same prefix skips them), the rest to the pool.
    void release(EngineRequest& r) {
        int64_t known = r.kv.state.n_cached;
        if (r.deferred_pos >= 0) known = std::min(known, r.deferred_pos);  // a token never known (a failed step)
        kv->release(r.kv, known);
        r.deferred_pos = -1;
    }

    // ---- admission ----------------------------------------------------------------------------------

    // Matches the prefix cache and sets up the request's state; false when memory is short right now.
    bool admit(EngineRequest& r) {
        const int64_t cached = kv->admit(r.kv, r.seq);
        if (cached < 0) return false;
        if (!r.admitted_once) {
            r.admitted_once = true;
            r.cached_tokens = std::min(cached, r.prompt_len);
            r.stream->set_usage(r.prompt_len, r.cached_tokens, r.preemptions);
            std::lock_guard lk(stats_mu);
            st.prompt_tokens_total += static_cast<uint64_t>(r.prompt_len);
            st.cached_tokens_total += static_cast<uint64_t>(r.cached_tokens);
            st.queue_time.observe(seconds(Clock::now() - r.arrival));
        }
        r.phase = EngineRequest::Phase::running;
        return true;
    }

    void preempt(std::shared_ptr<EngineRequest> r) {
        release(*r);
        r->phase = EngineRequest::Phase::preempted;
        ++r->preemptions;
        r->stream->set_usage(r->prompt_len, r->cached_tokens, r->preemptions);
        running.remove(r);
        waiting.push_front(r);
        ++queued;
        std::lock_guard lk(stats_mu);
        ++st.preemptions_total;
    }

    // ---- finishing ----------------------------------------------------------------------------------

    void finish(std::shared_ptr<EngineRequest> r, FinishReason why, std::string text, std::string matched = {},
                std::string error = {}) {
        if (r->phase == EngineRequest::Phase::running) {
            release(*r);
            running.remove(r);
        } else if (r->phase == EngineRequest::Phase::queued || r->phase == EngineRequest::Phase::preempted) {
            waiting.erase(std::remove(waiting.begin(), waiting.end(), r), waiting.end());
            --queued;
        }
        r->phase = EngineRequest::Phase::finished;
        {  // counted before the client hears of it, so /metrics never lags a delivered response
            std::lock_guard lk(stats_mu);
            if (why == FinishReason::abort) ++st.requests_aborted;
            else ++st.requests_finished;
            st.e2e.observe(seconds(Clock::now() - r->arrival));
        }
        r->stream->set_usage(r->prompt_len, r->cached_tokens, r->preemptions);
        r->stream->finish(why, std::move(text), std::move(matched), std::move(error), r->completion);
    }

    // ---- the loop -----------------------------------------------------------------------------------

    void loop() {
        model.backend().bind_thread();
        ExpertParallel* ep = model.expert_parallel();
        for (;;) {
            bool stopping;
            {
                std::unique_lock lk(mu);
                const bool idle = running.empty() && waiting.empty();
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
                    waiting.push_back(std::move(incoming.front()));
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
                auto all = std::vector<std::shared_ptr<EngineRequest>>(running.begin(), running.end());
                for (auto& r : all) finish(r, FinishReason::error, r->text.flush(), {}, e.what());
                if (ep) {  // the other ranks wait in this step's exchanges: the group cannot go on
                    ep->comm().abort();
                    fail_group(e.what());
                    return;
                }
            }
            publish_gauges();
        }
    }

    // Expert parallelism: every rank learns whether any rank has work (then all step, idle ones through
    // Model::idle_step) or is stopping (then all stop in the same iteration).
    bool group_stopped = false, group_failed = false;
    bool group_should_step(ExpertParallel& ep, bool stopping) {
        const bool mine = !running.empty() || !waiting.empty() || flush_pending > 0;
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
        for (auto r : std::vector<std::shared_ptr<EngineRequest>>(running.begin(), running.end()))
            finish(r, FinishReason::error, r->text.flush(), {}, why);
        for (auto r : std::vector<std::shared_ptr<EngineRequest>>(waiting.begin(), waiting.end()))
            finish(r, FinishReason::error, r->text.flush(), {}, why);
        std::lock_guard lk(mu);
        for (auto& r : incoming) r->stream->finish(FinishReason::error, "", "", why, 0);
        incoming.clear();
    }

    void serve_flush() {
        int64_t freed = 0;
        {
            std::lock_guard lk(mu);
            if (flush_pending == 0) return;
        }
        freed = kv->flush();
        publish_gauges();  // before the caller wakes, so stats() already shows the emptied cache
        {
            std::lock_guard lk(mu);
            flush_result = freed;
            flush_pending = 0;
        }
        flush_cv.notify_all();
    }

    // A step without rows of this rank: under expert parallelism it still serves the group's MoE layers.
    void idle_step() {
        if (model.expert_parallel()) model.idle_step();
    }

    // A step whose samples are on their way (the overlapped schedule): its sampled requests in sample-row order
    // and the requests it fed, whose completed pages join the prefix cache once their ids are known.
    struct Launched {
        std::vector<std::shared_ptr<EngineRequest>> sampled, in_batch;
    };
    std::optional<Launched> launched;

    // PEREGRINE_ENGINE_TRACE=1: the host's time per step by phase, logged as averages every 500 steps.
    struct Trace {
        bool on = false;
        int64_t steps = 0, rows = 0;
        double build = 0, forward = 0, wait = 0, deliver = 0, total = 0;
    } trace;
    static double ms_since(Clock::time_point t) {
        return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
    }
    void trace_step(int rows, Clock::time_point t0) {
        if (!trace.on) return;
        trace.rows += rows;
        trace.total += ms_since(t0);
        if (++trace.steps < 500) return;
        const double n = static_cast<double>(trace.steps);
        spdlog::info("engine trace: {} steps, {:.1f} rows, ms/step: build {:.3f}, forward enqueue {:.3f}, wait for "
                     "tokens {:.3f}, deliver {:.3f}, all {:.3f}", trace.steps, static_cast<double>(trace.rows) / n,
                     trace.build / n, trace.forward / n, trace.wait / n, trace.deliver / n, trace.total / n);
        trace = Trace{true};
    }

    bool overlap_on() const {
        if (opts.overlap_schedule == 0 || model.expert_parallel()) return false;
        if (opts.overlap_schedule < 0 && !model.backend().sampler().async()) return false;
        for (auto& r : running)
            if (!r->overlappable()) return false;
        return true;
    }

    uint64_t finish_launched() {
        if (!launched) return 0;
        Launched l = std::move(*launched);
        launched.reset();
        return take_samples(l);
    }

    // Takes step l's samples (the oldest the backend has started): patches the deferred ids that the step
    // launched since (`fed`) left in token histories, lets both steps' completed pages join the prefix cache,
    // and hands the tokens to their requests (which may finish them).
    uint64_t take_samples(Launched& l, const std::vector<std::shared_ptr<EngineRequest>>& fed = {}) {
        auto tw = Clock::now();
        std::vector<SampleResult> res = model.backend().sampler().finish();
        trace.wait += ms_since(tw);
        tw = Clock::now();
        PEREGRINE_CHECK(res.size() == l.sampled.size(), "{} samples for {} requests", res.size(), l.sampled.size());
        for (size_t i = 0; i < res.size(); ++i) {
            EngineRequest& r = *l.sampled[i];
            --r.pending;
            if (r.deferred_pos >= 0) {  // fed to the step launched since: its input was this sample
                r.kv.state.tokens.at(static_cast<size_t>(r.deferred_pos)) = res[i].id;
                r.deferred_pos = -1;
            }
        }
        extend_cache(l.in_batch);
        extend_cache(fed);
        const auto now = Clock::now();
        uint64_t generated = 0;
        for (size_t i = 0; i < res.size(); ++i) {
            auto& r = l.sampled[i];
            if (r->phase == EngineRequest::Phase::finished) continue;  // cancelled meanwhile
            generated += deliver(r, token_output(std::move(res[i])), now);
        }
        trace.deliver += ms_since(tw);
        return generated;
    }

    // At shutdown or after a failed step (`why`): every started sample is dropped (the backend's queue stays in
    // step with its callers) and no request waits for a token any more; after a failure, a preempted request whose
    // token is lost ends with the error.
    void drop_launched(const std::string& why = "") {
        launched.reset();
        try {
            model.backend().sampler().discard();
        } catch (const std::exception& e) {
            spdlog::error("dropping the started samples: {}", e.what());
        }
        for (auto r : std::vector<std::shared_ptr<EngineRequest>>(waiting.begin(), waiting.end()))
            if (r->pending && !why.empty()) finish(r, FinishReason::error, r->text.flush(), {}, why);
        for (auto& r : running) r->pending = 0;
        for (auto& r : waiting) r->pending = 0;
    }

    // Pages completed by the requests' fed tokens join the prefix cache at once, so concurrent requests with the
    // same prefix (a shared system prompt) reuse them while these are still running.
    void extend_cache(const std::vector<std::shared_ptr<EngineRequest>>& reqs) {
        for (auto& r : reqs)
            if (r->phase == EngineRequest::Phase::running && r->deferred_pos < 0) kv->share(r->kv, r->kv.state.n_cached);
    }

    void step() {
        const auto t0 = Clock::now();
        serve_flush();
        // Cancelled requests leave first, so their pages serve this very step.
        for (auto r : std::vector<std::shared_ptr<EngineRequest>>(waiting.begin(), waiting.end()))
            if (r->stream->cancelled()) finish(r, FinishReason::abort, "");
        for (auto r : std::vector<std::shared_ptr<EngineRequest>>(running.begin(), running.end()))
            if (r->stream->cancelled()) finish(r, FinishReason::abort, r->text.flush());

        // Admission, first come first served.
        while (!waiting.empty() && static_cast<int>(running.size()) < opts.max_running_requests) {
            auto r = waiting.front();
            if (!admit(*r)) {
                if (running.empty()) {
                    finish(r, FinishReason::error, r->text.flush(), {},
                           fmt::format("the request needs {} tokens of state but the KV memory holds {}",
                                       r->seq.size() + 1, kv->capacity_tokens()));
                    continue;
                }
                break;
            }
            waiting.pop_front();
            --queued;
            running.push_back(r);
        }
        // Without the overlapped schedule this step, the launched one's tokens are needed first.
        const bool overlap = overlap_on();
        uint64_t generated = overlap ? 0 : finish_launched();
        if (running.empty()) {
            generated += finish_launched();
            count_step(generated, false);
            return idle_step();
        }

        // The batch: decodes first (one token each), then prefill chunks, within the token budget. A token on its
        // way is fed as a deferred id, unless it surely ends its request.
        std::vector<std::shared_ptr<EngineRequest>> order;
        for (auto& r : running)
            if (r->to_feed() == 1) order.push_back(r);
        for (auto& r : running)
            if (r->to_feed() > 1) order.push_back(r);
        ForwardBatch batch;
        std::vector<int> logit_rows;
        std::vector<std::shared_ptr<EngineRequest>> in_batch, sampled;
        int budget = std::max(1, opts.chunked_prefill_size);
        for (auto& r : order) {
            if (budget <= 0) break;
            if (r->phase != EngineRequest::Phase::running) continue;  // preempted by an earlier one
            const int64_t known = static_cast<int64_t>(r->seq.size()), tokens = known + r->pending;
            if (r->pending && (r->completion + r->pending >= r->params.max_new_tokens || tokens >= opts.context_length))
                continue;
            const int take = static_cast<int>(std::min<int64_t>(r->to_feed(), budget));
            const int64_t start = r->kv.state.n_cached;
            bool ok = ensure_pages(*r, start + take);
            while (!ok) {
                // Preempt the newest running request that is not in this batch (possibly r itself).
                std::shared_ptr<EngineRequest> victim;
                for (auto it = running.rbegin(); it != running.rend(); ++it)
                    if (std::find(in_batch.begin(), in_batch.end(), *it) == in_batch.end()) {
                        victim = *it;
                        break;
                    }
                if (!victim) break;
                if (victim == r) {
                    if (in_batch.empty()) {  // alone and still short: it can never fit
                        finish(r, FinishReason::length, r->text.flush());
                    } else {
                        preempt(r);
                    }
                    break;
                }
                preempt(victim);
                ok = ensure_pages(*r, start + take);
            }
            if (!ok) continue;
            const int row0 = batch.rows();
            batch.seqs.push_back({&r->kv.state, start, take, row0});
            for (int64_t pos = start; pos < start + take; ++pos) {
                if (pos < known) {
                    batch.token_ids.push_back(r->seq[static_cast<size_t>(pos)]);
                } else {
                    batch.token_ids.push_back(DeviceSampler::deferred_id(r->sample_row));
                    r->deferred_pos = pos;
                }
            }
            in_batch.push_back(r);
            budget -= take;
            if (start + take == tokens) {
                logit_rows.push_back(row0 + take - 1);
                sampled.push_back(r);
            }
        }
        if (batch.seqs.empty()) {
            generated += finish_launched();
            count_step(generated, false);
            return idle_step();
        }

        // Where the backend samples on the device, the logits stay there and only the chosen ids come back;
        // rows with a logit processor (grammar masks, host code) copy just their own logits to the host.
        Backend& be = model.backend();
        const bool on_device = be.sampler().on_device();
        auto tf = Clock::now();
        trace.build += std::chrono::duration<double, std::milli>(tf - t0).count();
        Tensor logits = model.forward(batch, logit_rows, !on_device && !overlap);
        if (overlap) {
            // This step's samples start; the previous step's arrive (the device runs this step meanwhile).
            std::vector<SampleRow> rows;
            for (size_t i = 0; i < sampled.size(); ++i) rows.push_back(sample_row(*sampled[i], static_cast<int>(i)));
            be.sampler().start(logits, rows);
            trace.forward += ms_since(tf);
            for (size_t i = 0; i < sampled.size(); ++i) {
                ++sampled[i]->pending;
                sampled[i]->sample_row = static_cast<int>(i);
            }
            std::optional<Launched> prev = std::move(launched);
            launched = Launched{sampled, in_batch};
            if (prev) generated += take_samples(*prev, in_batch);
            else extend_cache(in_batch);
            if (running.empty()) generated += finish_launched();  // every request ended: nothing to overlap with
            count_step(generated, true, prev.has_value());
            trace_step(batch.rows(), t0);
            return;
        }
        extend_cache(in_batch);
        trace.forward += ms_since(tf);
        auto tw = Clock::now();
        std::vector<TokenOutput> chosen(sampled.size());
        std::vector<size_t> device_rows, host_rows;
        for (size_t i = 0; i < sampled.size(); ++i)
            (on_device && !sampled[i]->params.processor ? device_rows : host_rows).push_back(i);
        Tensor host_logits = logits;  // row j: sampled[host_rows[j]]
        if (on_device && !host_rows.empty())
            host_logits = be.sampler().rows_to_host(logits, std::vector<int>(host_rows.begin(), host_rows.end()));
        if (!device_rows.empty()) {
            std::vector<SampleRow> rows;
            for (size_t i : device_rows) rows.push_back(sample_row(*sampled[i], static_cast<int>(i)));
            std::vector<SampleResult> res = be.sampler().sample(logits, rows);
            for (size_t j = 0; j < device_rows.size(); ++j) chosen[device_rows[j]] = token_output(std::move(res[j]));
        }
        // Choosing the tokens on the host is independent per request (own logits row, sampler, grammar
        // matcher): it runs in parallel; delivering them and the finishing rules run in order.
        parallel_for(static_cast<int64_t>(host_rows.size()), [&](int64_t j0, int64_t j1) {
            std::vector<float> row;
            for (int64_t j = j0; j < j1; ++j) {
                const size_t i = host_rows[static_cast<size_t>(j)];
                const int64_t src = on_device ? j : static_cast<int64_t>(i);
                chosen[i] = choose(*sampled[i], host_logits.f32() + src * static_cast<int64_t>(vocab), row);
            }
        });
        trace.wait += ms_since(tw);  // the synchronous sample (or the host's choice) waits for the logits
        tw = Clock::now();
        const auto now = Clock::now();
        for (size_t i = 0; i < sampled.size(); ++i) generated += deliver(sampled[i], std::move(chosen[i]), now);
        trace.deliver += ms_since(tw);
        count_step(generated, true);
        trace_step(batch.rows(), t0);
    }

    void count_step(uint64_t generated, bool stepped, bool overlapped = false) {
        const auto now = Clock::now();
        std::lock_guard lk(stats_mu);
        if (stepped) ++st.steps_total;
        if (overlapped) ++st.steps_overlapped;
        tp_tokens += generated;
        const double window = seconds(now - tp_window);
        if (window >= 1.0) {
            st.gen_throughput = static_cast<double>(tp_tokens) / window;
            tp_tokens = 0;
            tp_window = now;
        }
    }

    // The ids `r` may not produce yet (EOS and stop ids before min_new_tokens) and its logit adjustments.
    std::vector<LogitAdjust> adjustments(const EngineRequest& r) const {
        const auto& p = r.params;
        std::vector<int32_t> masked;
        if (r.completion + r.pending < p.min_new_tokens) {  // tokens on their way count
            const int32_t eos = model.config().eos_token_id;
            if (!p.ignore_eos && eos >= 0 && eos < vocab) masked.push_back(eos);
            masked.insert(masked.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
        }
        if (!p.sampling.has_penalties() && p.sampling.logit_bias.empty() && masked.empty()) return {};
        return logit_adjustments(p.sampling, r.penalties, masked, vocab);
    }

    // The device sampler's row for `r` (logits row `row`); takes the request's next draw.
    SampleRow sample_row(EngineRequest& r, int row) const {
        const auto& p = r.params;
        SampleRow s;
        s.row = row;
        s.adjust = adjustments(r);
        s.penalties = penalties_of(p.sampling);
        s.config = r.sampler.config();
        s.seed = r.sampler.seed();
        s.index = r.sampler.take_index();
        s.logprobs = p.logprobs;
        s.top_logprobs = p.logprobs ? p.top_logprobs : 0;
        return s;
    }

    // A token the backend sampled, with its bytes for the stream.
    TokenOutput token_output(SampleResult&& s) const {
        TokenOutput out;
        out.id = s.id;
        out.logprob = s.logprob;
        out.top = std::move(s.top);
        if (tok && tok->is_valid(out.id)) out.text = tok->token_bytes(out.id);
        return out;
    }

    // Samples the next token of `r` from its logits row on the host (grammar mask, then the same adjustments
    // and draw as the device sampler).
    TokenOutput choose(EngineRequest& r, const float* raw, std::vector<float>& row) const {
        const auto& p = r.params;
        row.assign(raw, raw + vocab);
        float* l = row.data();
        if (p.processor) p.processor->process(l, vocab);
        apply_adjustments(l, vocab, adjustments(r), penalties_of(p.sampling));
        const int32_t id = r.sampler.sample(l, vocab);
        TokenOutput out;
        out.id = id;
        if (p.logprobs) out.logprob = chosen_logprob(l, vocab, id, &out.top, p.top_logprobs).logprob;
        if (tok && tok->is_valid(id)) out.text = tok->token_bytes(id);
        return out;
    }

    // Hands the chosen token to `r` and applies every finishing rule.
    int deliver(std::shared_ptr<EngineRequest> r, TokenOutput out, Clock::time_point now) {
        const auto& p = r->params;
        const int32_t id = out.id;
        const int32_t eos = model.config().eos_token_id;
        ++r->completion;
        if (p.sampling.has_penalties()) r->penalties.add_generated(id, vocab);
        if (p.processor) p.processor->accept(id);
        {  // counted before the client can hear of the token
            std::lock_guard lk(stats_mu);
            ++st.generation_tokens_total;
            if (!r->got_first) st.ttft.observe(seconds(now - r->arrival));
            else st.itl.observe(seconds(now - r->last_token));
        }
        r->got_first = true;
        r->last_token = now;

        const bool is_eos = !p.ignore_eos && id == eos;
        const bool is_stop_id =
            std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) != p.stop_token_ids.end();
        if (is_eos || is_stop_id) {
            std::string matched = tok && tok->is_valid(id) ? tok->token_text(id) : std::to_string(id);
            finish(r, FinishReason::stop, r->text.flush(), matched);
            return 1;
        }
        r->seq.push_back(id);
        std::string text = r->text.push(id);
        r->stream->push(std::move(out), text, r->completion);
        if (r->text.stopped()) finish(r, FinishReason::stop, "", r->text.matched());
        else if (p.processor && p.processor->done()) finish(r, FinishReason::stop, r->text.flush());
        else if (r->completion >= p.max_new_tokens) finish(r, FinishReason::length, r->text.flush());
        else if (static_cast<int64_t>(r->seq.size()) >= opts.context_length)
            finish(r, FinishReason::length, r->text.flush());
        return 1;
    }

    void publish_gauges() {
        std::lock_guard lk(stats_mu);
        st.running = static_cast<int64_t>(running.size());
        n_running = st.running;
        st.queued = queued.load();
        const CacheManager::Stats ks = kv->stats();
        st.pages_used = ks.pages_used;
        st.pages_cached = ks.pages_cached;
        st.pages_evictable = ks.pages_evictable;
        st.token_usage = static_cast<double>(st.pages_used - st.pages_evictable) / static_cast<double>(st.pages_total);
        st.cache_hit_rate = st.prompt_tokens_total ? static_cast<double>(st.cached_tokens_total) /
                                                         static_cast<double>(st.prompt_tokens_total)
                                                   : 0.0;
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
    for (Model* m : ranks) {
        PEREGRINE_CHECK(ranks.size() == 1 || (m->expert_parallel() &&
                                              m->expert_parallel()->comm().size() == static_cast<int>(ranks.size())),
                        "data-parallel ranks must form one expert-parallel group");
        ranks_.push_back(std::make_unique<Impl>(*this, *m, tok, opts_));
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

int64_t Engine::kv_tokens() const { return ranks_[0]->kv->capacity_tokens(); }

std::shared_ptr<RequestStream> Engine::submit(std::vector<int32_t> prompt, GenerationParams params) {
    const int vocab = model_.config().vocab_size;
    if (prompt.empty()) fail("the prompt is empty");
    for (int32_t id : prompt)
        if (id < 0 || id >= vocab) fail("prompt token id {} is outside the model's vocabulary (0..{})", id, vocab - 1);
    const int64_t n = static_cast<int64_t>(prompt.size());
    if (n >= opts_.context_length)
        fail("the prompt has {} tokens but the context length is {} (room for at least one generated token is needed)",
             n, opts_.context_length);
    if (n + 1 > kv_tokens())
        fail("the prompt has {} tokens but the KV memory holds only {}", n, kv_tokens());
    if (params.max_new_tokens <= 0) fail("max_new_tokens must be positive");
    for (int32_t id : params.stop_token_ids)
        if (id < 0) fail("stop token id {} is negative", id);

    // The rank with the fewest requests (data-parallel attention: each rank its own requests and KV).
    Impl* best = nullptr;
    int64_t best_load = 0;
    for (auto& im : ranks_) {
        const int64_t load = im->queued.load() + im->n_running.load();
        if (!best || load < best_load) {
            best = im.get();
            best_load = load;
        }
    }
    Impl& im = *best;
    if (im.failed) fail("the engine's expert-parallel group has failed; restart the server");

    auto r = std::make_shared<EngineRequest>(tok_, std::move(params));
    r->prompt_len = n;
    r->seq = std::move(prompt);
    r->arrival = Clock::now();
    if (r->params.sampling.repetition_penalty != 1.0f) r->penalties.add_prompt(r->seq, vocab);
    {
        std::lock_guard lk(im.mu);
        if (im.queued.load() >= opts_.max_queued_requests) {
            std::lock_guard sl(im.stats_mu);
            ++im.st.requests_rejected;
            throw QueueFullError(fmt::format("the queue is full ({} requests waiting)", im.queued.load()));
        }
        r->id = next_id_++;
        r->stream = std::make_shared<RequestStream>(r->id);
        r->stream->set_waker([&im] { im.notify(); });
        ++im.queued;
        im.incoming.push_back(r);
    }
    {
        std::lock_guard sl(im.stats_mu);
        ++im.st.requests_total;
    }
    im.cv.notify_all();
    return r->stream;
}

EngineStats Engine::stats() const {
    EngineStats s;
    for (size_t i = 0; i < ranks_.size(); ++i) {
        EngineStats r;
        {
            std::lock_guard lk(ranks_[i]->stats_mu);
            r = ranks_[i]->st;
        }
        r.queued = ranks_[i]->queued.load();
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
