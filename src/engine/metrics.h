#pragma once
// Engine counters, gauges and latency histograms (Prometheus-style cumulative buckets). The engine thread
// records; any thread may take a snapshot.
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace peregrine {

struct Histogram {
    std::vector<double> bounds;     // upper bounds, ascending (+Inf implied)
    std::vector<uint64_t> counts;   // per bucket (non-cumulative), bounds.size() + 1
    double sum = 0.0;
    uint64_t count = 0;

    explicit Histogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
    void observe(double v);
    void merge(const Histogram& o);  // same bounds
    double quantile(double q) const;  // bucket upper bound estimate (for logs)
};

struct EngineStats {
    // Counters.
    uint64_t requests_total = 0, requests_finished = 0, requests_aborted = 0, requests_rejected = 0;
    uint64_t prompt_tokens_total = 0, generation_tokens_total = 0, cached_tokens_total = 0;
    uint64_t cached_tokens_host_total = 0, cached_tokens_storage_total = 0;  // of cached_tokens_total
    // The prefix cache's tiers: pages evicted (device to host, or dropped; host copies dropped), bytes moved,
    // storage writes done and dropped, storage entries found corrupt.
    uint64_t evicted_pages_total = 0, host_evicted_pages_total = 0;
    uint64_t bytes_to_host_total = 0, bytes_from_host_total = 0, bytes_to_storage_total = 0,
             bytes_from_storage_total = 0;
    uint64_t storage_writes_total = 0, storage_writes_dropped_total = 0, storage_corrupt_total = 0;
    uint64_t preemptions_total = 0, steps_total = 0;
    uint64_t steps_overlapped = 0;  // steps enqueued before the previous step's tokens were on the host
    // Speculative decoding: verify steps of a request, drafts they verified and accepted.
    uint64_t spec_verify_total = 0, spec_draft_tokens_total = 0, spec_accepted_tokens_total = 0;
    // The same by draft position (0: the first draft of a step): drafts verified there and accepted.
    std::vector<uint64_t> spec_drafts_by_position, spec_accepted_by_position;
    // Gauges.
    int64_t running = 0, queued = 0;
    int64_t pages_total = 0, pages_used = 0, pages_cached = 0, pages_evictable = 0, page_tokens = 0;
    int64_t window_pages_total = 0, window_pages_used = 0, window_pages_cached = 0, window_pages_evictable = 0;
    int64_t host_pages_total = 0, host_pages_cached = 0;  // the hierarchical cache's host rows
    double token_usage = 0.0;  // pages held by live requests / all pages
    double cache_hit_rate = 0.0;  // cached prompt tokens / prompt tokens, since start
    double gen_throughput = 0.0;  // generated tokens per second over the last few seconds
    // Histograms (seconds).
    Histogram ttft, itl, e2e, queue_time;
    Histogram spec_accept_length;  // tokens a verify step emits (accepted drafts + the target's own)
    Histogram spec_verify_step;    // forward steps that verify drafts: the step and the choice of its tokens

    EngineStats();
    // Adds another rank's figures (data-parallel ranks): counters, gauges and histograms summed, ratios
    // recomputed over the sums.
    void merge(const EngineStats& o);
};

}  // namespace peregrine
