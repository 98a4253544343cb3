#include "engine/output_processor.h"

#include <algorithm>

namespace peregrine {

namespace {
double seconds(EngineClock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

OutputProcessor::OutputProcessor(Scheduler& scheduler, const Tokenizer* tok, int32_t eos, int vocab,
                                 int64_t context_length)
    : scheduler_(scheduler), tok_(tok), eos_(eos), vocab_(vocab), context_length_(context_length) {}

void OutputProcessor::process(StepOutput out) {
    const auto now = EngineClock::now();
    {  // counted before a client can hear of the step's tokens
        std::lock_guard lk(mu_);
        if (out.stepped) ++st_.steps_total;
        for (const auto& v : out.verified) {
            ++st_.spec_verify_total;
            st_.spec_draft_tokens_total += static_cast<uint64_t>(v.drafts);
            st_.spec_accepted_tokens_total += static_cast<uint64_t>(v.accepted);
            st_.spec_accept_length.observe(v.accepted + 1);
            auto& drafts = st_.spec_drafts_by_position;
            auto& accepted = st_.spec_accepted_by_position;
            if (drafts.size() < static_cast<size_t>(v.drafts)) drafts.resize(static_cast<size_t>(v.drafts));
            if (accepted.size() < drafts.size()) accepted.resize(drafts.size());
            for (int i = 0; i < v.drafts; ++i) ++drafts[static_cast<size_t>(i)];
            for (int i = 0; i < v.accepted; ++i) ++accepted[static_cast<size_t>(i)];
        }
        if (!out.verified.empty()) st_.spec_verify_step.observe(out.seconds);
        if (out.overlapped) ++st_.steps_overlapped;
    }
    uint64_t generated = 0;
    for (auto& [r, token] : out.tokens) {
        if (r->phase == Request::Phase::finished) continue;  // cancelled meanwhile
        deliver(r, std::move(token), now);
        ++generated;
    }
    std::lock_guard lk(mu_);
    tp_tokens_ += generated;
    const double window = seconds(now - tp_window_);
    if (window >= 1.0) {
        st_.gen_throughput = static_cast<double>(tp_tokens_) / window;
        tp_tokens_ = 0;
        tp_window_ = now;
    }
}

void OutputProcessor::deliver(const RequestPtr& r, TokenOutput out, EngineClock::time_point now) {
    const auto& p = r->params;
    const int32_t id = out.id;
    ++r->completion;
    if (p.sampling.has_penalties()) r->penalties.add_generated(id, vocab_);
    if (p.processor) p.processor->accept(id);
    {  // counted before the client can hear of the token
        std::lock_guard lk(mu_);
        ++st_.generation_tokens_total;
        if (!r->got_first) st_.ttft.observe(seconds(now - r->arrival));
        else st_.itl.observe(seconds(now - r->last_token));
    }
    r->got_first = true;
    r->last_token = now;

    const bool is_eos = !p.ignore_eos && id == eos_;
    const bool is_stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) != p.stop_token_ids.end();
    if (is_eos || is_stop_id) {
        std::string matched = tok_ && tok_->is_valid(id) ? tok_->token_text(id) : std::to_string(id);
        finish(r, FinishReason::stop, r->text.flush(), matched);
        return;
    }
    r->seq.push_back(id);
    std::string text = r->text.push(id);
    r->stream->push(std::move(out), text, r->completion);
    if (r->text.stopped()) finish(r, FinishReason::stop, "", r->text.matched());
    else if (p.processor && p.processor->done()) finish(r, FinishReason::stop, r->text.flush());
    else if (r->completion >= p.max_new_tokens) finish(r, FinishReason::length, r->text.flush());
    else if (static_cast<int64_t>(r->seq.size()) >= context_length_) finish(r, FinishReason::length, r->text.flush());
}

void OutputProcessor::finish(const RequestPtr& r, FinishReason why, std::string text, std::string matched,
                             std::string error) {
    scheduler_.remove(r);
    close(r, why, std::move(text), std::move(matched), std::move(error));
}

void OutputProcessor::close(const RequestPtr& r, FinishReason why, std::string text, std::string matched,
                            std::string error) {
    {  // counted before the client hears of it, so /metrics never lags a delivered response
        std::lock_guard lk(mu_);
        if (why == FinishReason::abort) ++st_.requests_aborted;
        else ++st_.requests_finished;
        st_.e2e.observe(seconds(EngineClock::now() - r->arrival));
    }
    r->stream->set_usage(r->prompt_len, r->cached_tokens, r->preemptions, r->cached_host, r->cached_storage);
    r->stream->finish(why, std::move(text), std::move(matched), std::move(error), r->completion);
}

void OutputProcessor::admitted(Request& r) {
    r.stream->set_usage(r.prompt_len, r.cached_tokens, r.preemptions, r.cached_host, r.cached_storage);
    std::lock_guard lk(mu_);
    st_.prompt_tokens_total += static_cast<uint64_t>(r.prompt_len);
    st_.cached_tokens_total += static_cast<uint64_t>(r.cached_tokens);
    st_.cached_tokens_host_total += static_cast<uint64_t>(r.cached_host);
    st_.cached_tokens_storage_total += static_cast<uint64_t>(r.cached_storage);
    st_.queue_time.observe(seconds(EngineClock::now() - r.arrival));
}

void OutputProcessor::preempted(Request& r) {
    r.stream->set_usage(r.prompt_len, r.cached_tokens, r.preemptions, r.cached_host, r.cached_storage);
    std::lock_guard lk(mu_);
    ++st_.preemptions_total;
}

void OutputProcessor::ended(const RequestPtr& r, FinishReason why, const std::string& error) {
    close(r, why, r->text.flush(), {}, error);
}

void OutputProcessor::count_submitted(bool rejected) {
    std::lock_guard lk(mu_);
    if (rejected) ++st_.requests_rejected;
    else ++st_.requests_total;
}

void OutputProcessor::publish_gauges(const CacheManager& kv) {
    const CacheManager::Stats ks = kv.stats();
    std::lock_guard lk(mu_);
    st_.running = static_cast<int64_t>(scheduler_.running().size());
    st_.queued = scheduler_.queued().load();
    st_.pages_total = ks.pages_total;
    st_.page_tokens = kv.layout().page_tokens;
    st_.pages_used = ks.pages_used;
    st_.pages_cached = ks.pages_cached;
    st_.pages_evictable = ks.pages_evictable;
    st_.window_pages_total = ks.window_pages_total;
    st_.window_pages_used = ks.window_pages_used;
    st_.window_pages_cached = ks.window_pages_cached;
    st_.window_pages_evictable = ks.window_pages_evictable;
    st_.host_pages_total = ks.host_pages_total;
    st_.host_pages_cached = ks.cache.host_pages;
    st_.evicted_pages_total = static_cast<uint64_t>(ks.cache.evicted_pages);
    st_.host_evicted_pages_total = static_cast<uint64_t>(ks.cache.host_evicted_pages);
    st_.bytes_to_host_total = static_cast<uint64_t>(ks.cache.bytes_to_host);
    st_.bytes_from_host_total = static_cast<uint64_t>(ks.cache.bytes_from_host);
    st_.bytes_to_storage_total = static_cast<uint64_t>(ks.cache.bytes_to_storage);
    st_.bytes_from_storage_total = static_cast<uint64_t>(ks.cache.bytes_from_storage);
    st_.storage_writes_total = static_cast<uint64_t>(ks.cache.storage_writes);
    st_.storage_writes_dropped_total = static_cast<uint64_t>(ks.cache.storage_writes_dropped);
    st_.storage_corrupt_total = static_cast<uint64_t>(ks.cache.storage_corrupt);
    st_.token_usage = static_cast<double>(st_.pages_used - st_.pages_evictable) / static_cast<double>(st_.pages_total);
    st_.cache_hit_rate = st_.prompt_tokens_total ? static_cast<double>(st_.cached_tokens_total) /
                                                       static_cast<double>(st_.prompt_tokens_total)
                                                 : 0.0;
}

EngineStats OutputProcessor::stats() const {
    std::lock_guard lk(mu_);
    EngineStats s = st_;
    s.queued = scheduler_.queued().load();
    return s;
}

}  // namespace peregrine
