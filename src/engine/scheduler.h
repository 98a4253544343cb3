#pragma once
// The scheduler decides what each step computes: which waiting requests start (first come, first served, while
// state memory and max_running_requests allow), and which tokens of the running ones a step feeds under the token
// budget (decodes first, one token each, then prefill chunks), preempting the newest requests when pages run
// short. It owns the queues and each request's memory (through kv's CacheManager) and knows nothing of the model.
#include "engine/request_state.h"
#include "kv/cache_manager.h"
#include "ops/backend.h"

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <string>
#include <vector>

namespace peregrine {

struct SchedulerOptions {
    int max_running_requests = 64;
    int chunked_prefill_size = 512;  // tokens per step, prefill chunks and decodes together
    int64_t context_length = 0;      // tokens a sequence may hold
};

// What the scheduler tells the rest of the engine about requests (the output processor listens).
class SchedulerListener {
public:
    virtual ~SchedulerListener() = default;
    // Its first admission (cached_tokens set).
    virtual void admitted(Request& r) = 0;
    virtual void preempted(Request& r) = 0;
    // The scheduler ended it, its memory already freed: it can never fit, or it ran out of room alone.
    virtual void ended(const RequestPtr& r, FinishReason why, const std::string& error) = 0;
};

// What one step computes: per request, the positions it feeds and whether its last row gives its next token.
struct ScheduledBatch {
    struct Entry {
        RequestPtr request;
        int64_t start = 0;  // its state holds this many tokens
        int n_tokens = 0;
        bool sampled = false;
        int drafts = 0;  // its last n_tokens are drafts to verify (speculative decoding)
    };
    BatchMode mode = BatchMode::mixed;
    std::vector<Entry> entries;  // decodes first, then prefill chunks
    bool empty() const { return entries.empty(); }
};

class Scheduler {
public:
    Scheduler(CacheManager& kv, SchedulerOptions opts, SchedulerListener& listener);

    // A submitted request joins the back of the waiting queue.
    void enqueue(RequestPtr r);
    // Starts waiting requests in order while memory and max_running_requests allow; a request that can never fit
    // (memory short with nothing running) ends with an error.
    void admit();
    // The next step's batch within the token budget. A request whose tokens on their way surely end it is left
    // out; pages that run short are taken from the newest running requests outside the batch (preempted), or the
    // request itself waits (ends when it is alone).
    ScheduledBatch schedule();
    // Frees a request's memory and takes it off the queues (it ends).
    void remove(const RequestPtr& r);

    const std::list<RequestPtr>& running() const { return running_; }
    const std::deque<RequestPtr>& waiting() const { return waiting_; }
    bool idle() const { return running_.empty() && waiting_.empty(); }
    // Requests submitted and not yet running (client threads read it for the 429 limit and rank choice).
    std::atomic<int64_t>& queued() { return queued_; }

private:
    void preempt(const RequestPtr& r);
    void release(Request& r);

    CacheManager& kv_;
    SchedulerOptions opts_;
    SchedulerListener& listener_;
    std::deque<RequestPtr> waiting_;
    std::list<RequestPtr> running_;  // in admission order
    std::atomic<int64_t> queued_{0};
};

}  // namespace peregrine
