#include "engine/metrics.h"

#include <algorithm>

namespace peregrine {

namespace {
std::vector<double> latency_buckets() {
    return {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
            0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0};
}
}  // namespace

void Histogram::observe(double v) {
    size_t i = static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
    ++counts[i];
    sum += v;
    ++count;
}

double Histogram::quantile(double q) const {
    if (count == 0) return 0.0;
    uint64_t target = static_cast<uint64_t>(q * static_cast<double>(count)), acc = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
        acc += counts[i];
        if (acc > target) return i < bounds.size() ? bounds[i] : bounds.back();
    }
    return bounds.empty() ? 0.0 : bounds.back();
}

EngineStats::EngineStats()
    : ttft(latency_buckets()), itl(latency_buckets()), e2e(latency_buckets()), queue_time(latency_buckets()),
      spec_accept_length({1, 2, 3, 4, 5, 6, 7, 8}), spec_verify_step(latency_buckets()) {}

void Histogram::merge(const Histogram& o) {
    for (size_t i = 0; i < counts.size() && i < o.counts.size(); ++i) counts[i] += o.counts[i];
    sum += o.sum;
    count += o.count;
}

void EngineStats::merge(const EngineStats& o) {
    const double used =
        token_usage * static_cast<double>(pages_total) + o.token_usage * static_cast<double>(o.pages_total);
    requests_total += o.requests_total;
    requests_finished += o.requests_finished;
    requests_aborted += o.requests_aborted;
    requests_rejected += o.requests_rejected;
    prompt_tokens_total += o.prompt_tokens_total;
    generation_tokens_total += o.generation_tokens_total;
    cached_tokens_total += o.cached_tokens_total;
    cached_tokens_host_total += o.cached_tokens_host_total;
    cached_tokens_storage_total += o.cached_tokens_storage_total;
    evicted_pages_total += o.evicted_pages_total;
    host_evicted_pages_total += o.host_evicted_pages_total;
    bytes_to_host_total += o.bytes_to_host_total;
    bytes_from_host_total += o.bytes_from_host_total;
    bytes_to_storage_total += o.bytes_to_storage_total;
    bytes_from_storage_total += o.bytes_from_storage_total;
    storage_writes_total += o.storage_writes_total;
    storage_writes_dropped_total += o.storage_writes_dropped_total;
    storage_corrupt_total += o.storage_corrupt_total;
    preemptions_total += o.preemptions_total;
    steps_total = std::max(steps_total, o.steps_total);  // the ranks step together
    steps_overlapped += o.steps_overlapped;
    running += o.running;
    queued += o.queued;
    pages_total += o.pages_total;
    pages_used += o.pages_used;
    pages_cached += o.pages_cached;
    pages_evictable += o.pages_evictable;
    window_pages_total += o.window_pages_total;
    window_pages_used += o.window_pages_used;
    window_pages_cached += o.window_pages_cached;
    window_pages_evictable += o.window_pages_evictable;
    host_pages_total += o.host_pages_total;
    host_pages_cached += o.host_pages_cached;
    token_usage = pages_total ? used / static_cast<double>(pages_total) : 0.0;
    cache_hit_rate =
        prompt_tokens_total ? static_cast<double>(cached_tokens_total) / static_cast<double>(prompt_tokens_total) : 0.0;
    gen_throughput += o.gen_throughput;
    spec_verify_total += o.spec_verify_total;
    spec_draft_tokens_total += o.spec_draft_tokens_total;
    spec_accepted_tokens_total += o.spec_accepted_tokens_total;
    spec_accept_length.merge(o.spec_accept_length);
    spec_verify_step.merge(o.spec_verify_step);
    auto add = [](std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
        if (a.size() < b.size()) a.resize(b.size());
        for (size_t i = 0; i < b.size(); ++i) a[i] += b[i];
    };
    add(spec_drafts_by_position, o.spec_drafts_by_position);
    add(spec_accepted_by_position, o.spec_accepted_by_position);
    ttft.merge(o.ttft);
    itl.merge(o.itl);
    e2e.merge(o.e2e);
    queue_time.merge(o.queue_time);
}

}  // namespace peregrine

