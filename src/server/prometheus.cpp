#include "server/api_server.h"

#include <fmt/format.h>

#include <utility>
#include <vector>

namespace peregrine {

namespace {
void metric(std::string& out, const char* name, const char* type, const char* help, const std::string& labels,
            double v) {
    out += fmt::format("# HELP peregrine:{} {}\n# TYPE peregrine:{} {}\nperegrine:{}{{{}}} {}\n", name, help, name,
                       type, name, labels, v);
}
// One metric with a sample per label set.
void labelled(std::string& out, const char* name, const char* type, const char* help,
              const std::vector<std::pair<std::string, double>>& samples) {
    out += fmt::format("# HELP peregrine:{} {}\n# TYPE peregrine:{} {}\n", name, help, name, type);
    for (const auto& [labels, v] : samples) out += fmt::format("peregrine:{}{{{}}} {}\n", name, labels, v);
}
void histogram(std::string& out, const char* name, const char* help, const std::string& labels, const Histogram& h) {
    out += fmt::format("# HELP peregrine:{} {}\n# TYPE peregrine:{} histogram\n", name, help, name);
    uint64_t acc = 0;
    for (size_t i = 0; i < h.counts.size(); ++i) {
        acc += h.counts[i];
        std::string le = i < h.bounds.size() ? fmt::format("{}", h.bounds[i]) : "+Inf";
        out += fmt::format("peregrine:{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, le, acc);
    }
    out += fmt::format("peregrine:{}_sum{{{}}} {}\nperegrine:{}_count{{{}}} {}\n", name, labels, h.sum, name, labels,
                       h.count);
}
}  // namespace

std::string prometheus_text(const EngineStats& s, const std::string& model_name) {
    const std::string l = fmt::format("model_name=\"{}\"", model_name);
    std::string o;
    metric(o, "prompt_tokens_total", "counter", "Prompt tokens processed.", l,
           static_cast<double>(s.prompt_tokens_total));
    metric(o, "generation_tokens_total", "counter", "Tokens generated.", l,
           static_cast<double>(s.generation_tokens_total));
    metric(o, "cached_tokens_total", "counter", "Prompt tokens served from the prefix cache.", l,
           static_cast<double>(s.cached_tokens_total));
    const auto d = [](uint64_t v) { return static_cast<double>(v); };
    const auto tier = [&](const char* t) { return fmt::format("{},tier=\"{}\"", l, t); };
    labelled(o, "cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache, by tier.",
             {{tier("device"), d(s.cached_tokens_total - s.cached_tokens_host_total - s.cached_tokens_storage_total)},
              {tier("host"), d(s.cached_tokens_host_total)},
              {tier("storage"), d(s.cached_tokens_storage_total)}});
    labelled(o, "cache_transfer_bytes_total", "counter",
             "Bytes of state moved between the device and the hierarchical cache's tiers.",
             {{tier("host") + ",direction=\"out\"", d(s.bytes_to_host_total)},
              {tier("host") + ",direction=\"in\"", d(s.bytes_from_host_total)},
              {tier("storage") + ",direction=\"out\"", d(s.bytes_to_storage_total)},
              {tier("storage") + ",direction=\"in\"", d(s.bytes_from_storage_total)}});
    labelled(o, "cache_evicted_pages_total", "counter",
             "Cached rows evicted: from the device (to host memory where it is on), host copies dropped.",
             {{tier("device"), d(s.evicted_pages_total)}, {tier("host"), d(s.host_evicted_pages_total)}});
    labelled(o, "cache_storage_writes_total", "counter", "Storage entries written, and dropped (store full or gone).",
             {{l + ",result=\"written\"", d(s.storage_writes_total)},
              {l + ",result=\"dropped\"", d(s.storage_writes_dropped_total)}});
    metric(o, "cache_storage_corrupt_total", "counter", "Storage entries read as truncated, corrupt or foreign.", l,
           d(s.storage_corrupt_total));
    metric(o, "num_host_cached_pages", "gauge", "Rows with a copy in host memory (hierarchical cache).", l,
           static_cast<double>(s.host_pages_cached));
    metric(o, "max_host_pages", "gauge", "Rows the hierarchical cache's host memory holds.", l,
           static_cast<double>(s.host_pages_total));
    metric(o, "num_requests_total", "counter", "Requests accepted.", l, static_cast<double>(s.requests_total));
    metric(o, "num_finished_requests_total", "counter", "Requests finished.", l,
           static_cast<double>(s.requests_finished));
    metric(o, "num_aborted_requests_total", "counter", "Requests aborted (client gone).", l,
           static_cast<double>(s.requests_aborted));
    metric(o, "num_rejected_requests_total", "counter", "Requests refused with a full queue.", l,
           static_cast<double>(s.requests_rejected));
    metric(o, "num_preemptions_total", "counter", "Running requests preempted for memory.", l,
           static_cast<double>(s.preemptions_total));
    metric(o, "num_overlapped_steps_total", "counter",
           "Forward steps enqueued while the previous one ran (overlapped schedule).", l,
           static_cast<double>(s.steps_overlapped));
    metric(o, "num_running_reqs", "gauge", "Requests running.", l, static_cast<double>(s.running));
    metric(o, "num_queue_reqs", "gauge", "Requests waiting.", l, static_cast<double>(s.queued));
    metric(o, "num_used_tokens", "gauge", "Tokens of state held by live requests.", l,
           static_cast<double>((s.pages_used - s.pages_evictable) * s.page_tokens));
    metric(o, "max_total_num_tokens", "gauge", "Tokens of state the page pool holds.", l,
           static_cast<double>(s.pages_total * s.page_tokens));
    metric(o, "num_used_pages", "gauge", "State pages in use (live requests and prefix cache).", l,
           static_cast<double>(s.pages_used));
    metric(o, "num_cached_pages", "gauge", "State pages owned by the prefix cache.", l,
           static_cast<double>(s.pages_cached));
    metric(o, "token_usage", "gauge", "Fraction of state pages held by live requests.", l, s.token_usage);
    metric(o, "num_used_window_pages", "gauge", "Sliding-window pages in use (live requests and prefix cache).", l,
           static_cast<double>(s.window_pages_used));
    metric(o, "num_cached_window_pages", "gauge", "Sliding-window pages owned by the prefix cache.", l,
           static_cast<double>(s.window_pages_cached));
    metric(o, "swa_token_usage", "gauge", "Fraction of sliding-window pages held by live requests.", l,
           s.window_pages_total ? static_cast<double>(s.window_pages_used - s.window_pages_evictable) /
                                      static_cast<double>(s.window_pages_total)
                                : 0.0);
    metric(o, "cache_hit_rate", "gauge", "Prompt tokens served from the prefix cache / prompt tokens.", l,
           s.cache_hit_rate);
    metric(o, "gen_throughput", "gauge", "Generated tokens per second (recent).", l, s.gen_throughput);
    histogram(o, "time_to_first_token_seconds", "Time to first token.", l, s.ttft);
    histogram(o, "inter_token_latency_seconds", "Time between consecutive tokens of a request.", l, s.itl);
    histogram(o, "e2e_request_latency_seconds", "Arrival to finish.", l, s.e2e);
    histogram(o, "queue_time_seconds", "Arrival to first admission.", l, s.queue_time);
    metric(o, "spec_verify_total", "counter", "Speculative verify steps (per request).", l,
           static_cast<double>(s.spec_verify_total));
    metric(o, "spec_draft_tokens_total", "counter", "Draft tokens verified.", l,
           static_cast<double>(s.spec_draft_tokens_total));
    metric(o, "spec_accepted_tokens_total", "counter", "Draft tokens the target accepted.", l,
           static_cast<double>(s.spec_accepted_tokens_total));
    histogram(o, "spec_accept_length", "Tokens a verify step gives a request (accepted drafts + 1).", l,
              s.spec_accept_length);
    auto by_position = [&](const std::vector<uint64_t>& v) {
        std::vector<std::pair<std::string, double>> out;
        for (size_t i = 0; i < v.size(); ++i)
            out.emplace_back(l + ",position=\"" + std::to_string(i) + "\"", static_cast<double>(v[i]));
        return out;
    };
    labelled(o, "spec_num_draft_tokens_per_pos", "counter", "Drafts verified at each draft position (0: first).",
             by_position(s.spec_drafts_by_position));
    labelled(o, "spec_num_accepted_tokens_per_pos", "counter", "Drafts accepted at each draft position (0: first).",
             by_position(s.spec_accepted_by_position));
    histogram(o, "spec_verify_step_seconds", "Forward steps that verify drafts, with the choice of their tokens.", l,
              s.spec_verify_step);
    return o;
}

}  // namespace peregrine
