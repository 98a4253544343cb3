#include "engine/scheduler.h"

#include <algorithm>
#include <fmt/format.h>
#include <utility>

namespace peregrine {

Scheduler::Scheduler(CacheManager& kv, SchedulerOptions opts, SchedulerListener& listener)
    : kv_(kv), opts_(opts), listener_(listener) {}

void Scheduler::enqueue(RequestPtr r) { waiting_.push_back(std::move(r)); }

// Whole pages of known tokens go to the prefix cache (so a resumed or later request with the same prefix skips
// them), the rest to the pool.
void Scheduler::release(Request& r) {
    kv_.release(r.kv, r.known_tokens());
    r.deferred_pos = -1;
}

void Scheduler::remove(const RequestPtr& r) {
    if (r->phase == Request::Phase::running) {
        release(*r);
        running_.remove(r);
    } else if (r->phase == Request::Phase::queued || r->phase == Request::Phase::preempted) {
        waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
        --queued_;
    }
    r->phase = Request::Phase::finished;
}

void Scheduler::admit() {
    while (!waiting_.empty() && static_cast<int>(running_.size()) < opts_.max_running_requests) {
        RequestPtr r = waiting_.front();
        const int64_t cached = kv_.admit(r->kv, r->seq);
        if (cached < 0) {
            if (!running_.empty()) break;  // room comes back as running requests end
            remove(r);
            listener_.ended(r, FinishReason::error,
                            fmt::format("the request needs {} tokens of state but the KV memory holds {}",
                                        r->seq.size() + 1, kv_.capacity_tokens()));
            continue;
        }
        if (!r->admitted_once) {
            r->admitted_once = true;
            r->cached_tokens = std::min(cached, r->prompt_len);
            r->cached_storage = std::min(r->kv.storage_hit_tokens, r->cached_tokens);
            r->cached_host = std::min(r->kv.host_hit_tokens, r->cached_tokens - r->cached_storage);
            listener_.admitted(*r);
        }
        r->phase = Request::Phase::running;
        waiting_.pop_front();
        --queued_;
        running_.push_back(r);
    }
}

void Scheduler::preempt(const RequestPtr& r) {
    release(*r);
    r->phase = Request::Phase::preempted;
    ++r->preemptions;
    running_.remove(r);
    waiting_.push_front(r);
    ++queued_;
    listener_.preempted(*r);
}

ScheduledBatch Scheduler::schedule() {
    std::vector<RequestPtr> order;  // decodes first (one token each), then prefill chunks
    for (auto& r : running_)
        if (r->to_feed() == 1) order.push_back(r);
    for (auto& r : running_)
        if (r->to_feed() > 1) order.push_back(r);
    ScheduledBatch batch;
    std::vector<RequestPtr> in_batch;
    int budget = std::max(1, opts_.chunked_prefill_size);
    for (auto& r : order) {
        if (budget <= 0) break;
        if (r->phase != Request::Phase::running) continue;  // preempted by an earlier one
        const int64_t tokens = static_cast<int64_t>(r->seq.size()) + r->pending;
        if (r->pending &&
            (r->completion + r->pending >= r->params.max_new_tokens || tokens >= opts_.context_length))
            continue;  // the token on its way surely ends it
        // A decoding request's drafts go with its token when the budget and the context take them all.
        int drafts = !r->drafts.empty() && r->to_feed() == 1 && !r->pending &&
                                   1 + static_cast<int>(r->drafts.size()) <= budget &&
                                   tokens + static_cast<int64_t>(r->drafts.size()) < opts_.context_length &&
                                   kv_.keep_step_carries(r->kv, 1 + static_cast<int>(r->drafts.size()))
                               ? static_cast<int>(r->drafts.size())
                               : 0;
        int take = static_cast<int>(std::min<int64_t>(r->to_feed(), budget)) + drafts;
        const int64_t start = r->kv.state.n_cached;
        bool ok = kv_.reserve(r->kv, start + take);
        if (!ok && drafts > 0) {  // no page for the drafts: the token alone, before anyone is preempted
            take -= std::exchange(drafts, 0);
            ok = kv_.reserve(r->kv, start + take);
        }
        while (!ok) {
            // Preempt the newest running request that is not in this batch (possibly r itself).
            RequestPtr victim;
            for (auto it = running_.rbegin(); it != running_.rend(); ++it)
                if (std::find(in_batch.begin(), in_batch.end(), *it) == in_batch.end()) {
                    victim = *it;
                    break;
                }
            if (!victim) break;
            if (victim == r) {
                if (in_batch.empty()) {  // alone and still short: it can never fit
                    remove(r);
                    listener_.ended(r, FinishReason::length, "");
                } else {
                    preempt(r);
                }
                break;
            }
            preempt(victim);
            ok = kv_.reserve(r->kv, start + take);
        }
        if (!ok) continue;
        batch.entries.push_back({r, start, take, start + take - drafts == tokens, drafts});
        in_batch.push_back(r);
        budget -= take;
    }
    bool decode = !batch.empty(), prefill = !batch.empty();
    for (const auto& e : batch.entries) {
        decode = decode && e.n_tokens == 1;
        prefill = prefill && e.n_tokens > 1;
    }
    batch.mode = decode ? BatchMode::decode : prefill ? BatchMode::prefill : BatchMode::mixed;
    return batch;
}

}  // namespace peregrine
