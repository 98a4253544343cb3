#include "server/bench_client.h"
#include "util/error.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

namespace peregrine {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Outcome {
    bool ok = false;
    std::string error;
    int64_t prompt_len = 0, output_tokens = 0;
    int64_t cached = 0, cached_host = 0, cached_storage = 0;  // prompt tokens from each tier of the cache
    double ttft = 0, latency = 0;
    std::vector<double> itl;
};

struct Url {
    std::string host;
    int port = 80;
};

Url parse_url(const std::string& url) {
    std::string s = url;
    if (s.rfind("http://", 0) == 0) s = s.substr(7);
    else if (s.find("://") != std::string::npos) fail("bench serve: only http:// URLs are supported ({})", url);
    if (auto slash = s.find('/'); slash != std::string::npos) s = s.substr(0, slash);
    Url u;
    auto colon = s.rfind(':');
    u.host = colon == std::string::npos ? s : s.substr(0, colon);
    if (colon != std::string::npos) u.port = std::stoi(s.substr(colon + 1));
    return u;
}

std::unique_ptr<httplib::Client> client(const Url& u, const std::string& key) {
    auto c = std::make_unique<httplib::Client>(u.host, u.port);
    c->set_tcp_nodelay(true);
    c->set_read_timeout(3600, 0);
    c->set_write_timeout(600, 0);
    c->set_connection_timeout(30, 0);
    if (!key.empty()) c->set_bearer_token_auth(key);
    return c;
}

Outcome one_request(const Url& u, const BenchServeOptions& o, const std::string& model,
                    const std::vector<int32_t>& prompt, int out_len) {
    Outcome r;
    r.prompt_len = static_cast<int64_t>(prompt.size());
    json body = {{"model", model}, {"prompt", prompt}, {"max_tokens", out_len}, {"temperature", 0.0},
                 {"ignore_eos", true}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
    auto c = client(u, o.api_key);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.headers = {{"Content-Type", "application/json"}};
    req.body = body.dump();
    std::string buf;
    const auto t0 = Clock::now();
    auto last = t0;
    bool first = true;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        buf.append(data, n);
        size_t end;
        while ((end = buf.find("\n\n")) != std::string::npos) {
            std::string ev = buf.substr(0, end);
            buf.erase(0, end + 2);
            if (ev.rfind("data: ", 0) != 0) continue;
            std::string payload = ev.substr(6);
            if (payload == "[DONE]") continue;
            json j = json::parse(payload, nullptr, false);
            if (j.is_discarded()) continue;
            if (j.contains("error")) {
                r.error = j["error"].value("message", "error");
                continue;
            }
            if (j.contains("usage") && j["usage"].is_object()) {
                const json& us = j["usage"];
                r.output_tokens = us.value("completion_tokens", 0);
                const json details = us.value("prompt_tokens_details", json::object());
                r.cached = details.value("cached_tokens", int64_t{0});
                const json tiers = details.value("cached_tokens_details", json::object());
                r.cached_host = tiers.value("host", int64_t{0});
                r.cached_storage = tiers.value("storage", int64_t{0});
            }
            if (j.contains("choices") && !j["choices"].empty()) {
                const auto now = Clock::now();
                if (first) {
                    r.ttft = std::chrono::duration<double>(now - t0).count();
                    first = false;
                } else {
                    r.itl.push_back(std::chrono::duration<double>(now - last).count());
                }
                last = now;
            }
        }
        return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    bool sent = c->send(req, res, err);
    r.latency = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!sent) r.error = "connection failed: " + httplib::to_string(err);
    else if (res.status != 200) r.error = "HTTP " + std::to_string(res.status) + ": " + res.body;
    r.ok = r.error.empty() && !first;
    return r;
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    double k = (static_cast<double>(v.size()) - 1) * p / 100.0;
    size_t lo = static_cast<size_t>(std::floor(k)), hi = static_cast<size_t>(std::ceil(k));
    return v[lo] + (v[hi] - v[lo]) * (k - static_cast<double>(lo));
}

json summary_ms(const std::vector<double>& secs, bool extra) {
    double mean = 0, sd = 0;
    for (double x : secs) mean += x;
    mean = secs.empty() ? 0 : mean / static_cast<double>(secs.size());
    for (double x : secs) sd += (x - mean) * (x - mean);
    sd = secs.empty() ? 0 : std::sqrt(sd / static_cast<double>(secs.size()));
    json j = {{"mean", mean * 1e3},
              {"median", percentile(secs, 50) * 1e3},
              {"std", sd * 1e3},
              {"p99", percentile(secs, 99) * 1e3}};
    if (extra) {
        j["p95"] = percentile(secs, 95) * 1e3;
        j["max"] = secs.empty() ? 0.0 : *std::max_element(secs.begin(), secs.end()) * 1e3;
    }
    return j;
}

}  // namespace

// The server's verify steps so far and the tokens they gave (sums over ranks of /metrics' spec_accept_length);
// zeros where it does not speculate or has no /metrics.
std::pair<double, double> spec_accept_totals(httplib::Client& c) {
    auto m = c.Get("/metrics");
    double sum = 0, count = 0;
    if (!m || m->status != 200) return {0, 0};
    std::istringstream in(m->body);
    for (std::string line; std::getline(in, line);) {
        const bool is_sum = line.starts_with("peregrine:spec_accept_length_sum{");
        if (!is_sum && !line.starts_with("peregrine:spec_accept_length_count{")) continue;
        const double v = std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
        (is_sum ? sum : count) += v;
    }
    return {sum, count};
}

json run_bench_serve(const BenchServeOptions& o) {
    const Url u = parse_url(o.url);
    auto c = client(u, o.api_key);
    auto models = c->Get("/v1/models");
    if (!models || models->status != 200) fail("bench serve: GET {}/v1/models failed", o.url);
    json mj = json::parse(models->body, nullptr, false);
    PEREGRINE_CHECK(mj.is_object() && mj.contains("data") && !mj["data"].empty(), "bench serve: {} lists no model",
                    o.url);
    const std::string model = o.model.empty() ? mj["data"][0].value("id", "") : o.model;
    int vocab = o.vocab > 0 ? o.vocab : mj["data"][0].value("vocab_size", 256);
    PEREGRINE_CHECK(o.num_prompts > 0 && o.input_len > 0 && o.output_len > 0,
                    "bench serve: lengths and prompt count must be positive");

    std::mt19937_64 rng(o.seed);
    auto len = [&](int full) {
        int lo = std::max(1, static_cast<int>(std::floor(full * o.range_ratio)));
        return std::uniform_int_distribution<int>(lo, full)(rng);
    };
    auto random_ids = [&](size_t n) {
        std::vector<int32_t> v(n);
        for (auto& t : v) t = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
        return v;
    };
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int> out_lens;
    if (o.dataset == "generated-shared-prefix") {
        PEREGRINE_CHECK(o.gsp_num_groups > 0 && o.gsp_prompts_per_group > 0 && o.gsp_system_prompt_len >= 0 &&
                            o.gsp_question_len > 0 && o.gsp_output_len > 0,
                        "bench serve: --gsp-* counts and lengths must be positive");
        for (int g = 0; g < o.gsp_num_groups; ++g) {
            const auto system = random_ids(static_cast<size_t>(o.gsp_system_prompt_len));
            for (int q = 0; q < o.gsp_prompts_per_group; ++q) {
                prompts.push_back(system);
                for (int32_t t : random_ids(static_cast<size_t>(o.gsp_question_len))) prompts.back().push_back(t);
                out_lens.push_back(o.gsp_output_len);
            }
        }
        std::vector<size_t> order(prompts.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<std::vector<int32_t>> shuffled;
        for (size_t i : order) shuffled.push_back(std::move(prompts[i]));
        prompts = std::move(shuffled);
    } else {
        PEREGRINE_CHECK(o.dataset == "random", "bench serve: unknown dataset {}", o.dataset);
        for (int i = 0; i < o.num_prompts; ++i) {
            prompts.push_back(random_ids(static_cast<size_t>(len(o.input_len))));
            out_lens.push_back(len(o.output_len));
        }
    }
    for (int w = 0; w < o.warmup_requests; ++w) {
        auto r = one_request(u, o, model, prompts[0], std::min(o.output_len, 16));
        if (!r.ok) fail("bench serve: warm-up request failed: {}", r.error);
    }

    const auto spec0 = spec_accept_totals(*c);
    std::vector<Outcome> results(prompts.size());
    std::mutex mu;
    std::condition_variable cv;
    int in_flight = 0;
    std::vector<std::thread> threads;
    std::exponential_distribution<double> gap(o.request_rate > 0 ? o.request_rate : 1.0);
    const auto start = Clock::now();
    auto next_time = start;
    for (size_t i = 0; i < prompts.size(); ++i) {
        if (o.request_rate > 0) {
            std::this_thread::sleep_until(next_time);
            next_time += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
        }
        if (o.max_concurrency > 0) {
            std::unique_lock lk(mu);
            cv.wait(lk, [&] { return in_flight < o.max_concurrency; });
        }
        {
            std::lock_guard lk(mu);
            ++in_flight;
        }
        threads.emplace_back([&, i] {
            results[i] = one_request(u, o, model, prompts[i], out_lens[i]);
            {
                std::lock_guard lk(mu);
                --in_flight;
            }
            cv.notify_all();
        });
    }
    for (auto& t : threads) t.join();
    const double duration = std::chrono::duration<double>(Clock::now() - start).count();

    int64_t done = 0, in_tok = 0, out_tok = 0, cached = 0, cached_host = 0, cached_storage = 0;
    std::vector<double> ttft, tpot, itl, e2e;
    std::string first_error;
    for (auto& r : results) {
        if (!r.ok) {
            if (first_error.empty()) first_error = r.error;
            continue;
        }
        ++done;
        in_tok += r.prompt_len;
        out_tok += r.output_tokens;
        cached += r.cached, cached_host += r.cached_host, cached_storage += r.cached_storage;
        ttft.push_back(r.ttft);
        e2e.push_back(r.latency);
        if (r.output_tokens > 1) tpot.push_back((r.latency - r.ttft) / static_cast<double>(r.output_tokens - 1));
        itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    }
    double total_latency = 0;
    for (double x : e2e) total_latency += x;
    const double in_d = std::max<double>(1.0, static_cast<double>(in_tok));
    json rep = {{"backend", "peregrine-oai"},
                {"dataset_name", o.dataset},
                {"url", o.url},
                {"model", model},
                {"request_rate", o.request_rate > 0 ? json(o.request_rate) : json("inf")},
                {"max_concurrency", o.max_concurrency > 0 ? json(o.max_concurrency) : json(nullptr)},
                {"random_input_len", o.input_len},
                {"random_output_len", o.output_len},
                {"random_range_ratio", o.range_ratio},
                {"num_prompts", static_cast<int64_t>(prompts.size())},
                {"completed", done},
                {"failed", static_cast<int64_t>(results.size()) - done},
                {"duration", duration},
                {"total_input_tokens", in_tok},
                {"total_output_tokens", out_tok},
                {"request_throughput", static_cast<double>(done) / duration},
                {"input_throughput", static_cast<double>(in_tok) / duration},
                {"output_throughput", static_cast<double>(out_tok) / duration},
                {"total_throughput", static_cast<double>(in_tok + out_tok) / duration},
                {"concurrency", total_latency / duration},
                {"cache_hit_rate", static_cast<double>(cached) / in_d},
                {"device_hit_rate", static_cast<double>(cached - cached_host - cached_storage) / in_d},
                {"host_hit_rate", static_cast<double>(cached_host) / in_d},
                {"storage_hit_rate", static_cast<double>(cached_storage) / in_d},
                {"e2e_latency_ms", summary_ms(e2e, false)},
                {"ttft_ms", summary_ms(ttft, false)},
                {"tpot_ms", summary_ms(tpot, false)},
                {"itl_ms", summary_ms(itl, true)}};
    const auto spec1 = spec_accept_totals(*c);
    if (spec1.second > spec0.second)  // SGLang's accept_length: tokens per verify step over the run
        rep["accept_length"] = (spec1.first - spec0.first) / (spec1.second - spec0.second);
    if (!first_error.empty()) rep["first_error"] = first_error;
    return rep;
}

std::string bench_serve_table(const json& r) {
    std::string t;
    auto line = [&](const std::string& k, const std::string& v) { t += fmt::format("{:<40}{:>16}\n", k, v); };
    auto num = [](double v) { return fmt::format("{:.2f}", v); };
    auto head = [&](const std::string& h) { t += fmt::format("{:-^56}\n", h); };
    head(" Serving Benchmark Result ");
    line("Backend:", r["backend"].get<std::string>());
    line("Traffic request rate:", r["request_rate"].is_string() ? "inf" : num(r["request_rate"].get<double>()));
    line("Max request concurrency:",
         r["max_concurrency"].is_null() ? "not set" : std::to_string(r["max_concurrency"].get<int>()));
    line("Successful requests:", std::to_string(r["completed"].get<int64_t>()));
    line("Failed requests:", std::to_string(r["failed"].get<int64_t>()));
    line("Benchmark duration (s):", num(r["duration"]));
    line("Total input tokens:", std::to_string(r["total_input_tokens"].get<int64_t>()));
    line("Total generated tokens:", std::to_string(r["total_output_tokens"].get<int64_t>()));
    line("Request throughput (req/s):", num(r["request_throughput"]));
    line("Input token throughput (tok/s):", num(r["input_throughput"]));
    line("Output token throughput (tok/s):", num(r["output_throughput"]));
    line("Total token throughput (tok/s):", num(r["total_throughput"]));
    line("Concurrency:", num(r["concurrency"]));
    if (r.contains("accept_length")) line("Accept length:", num(r["accept_length"]));
    auto pct = [](double v) { return fmt::format("{:.2f}%", 100 * v); };
    line("Cache hit rate:", pct(r["cache_hit_rate"]));
    line("  device / host / storage:", pct(r["device_hit_rate"]) + " / " + pct(r["host_hit_rate"]) + " / " +
                                           pct(r["storage_hit_rate"]));
    auto block = [&](const std::string& title, const std::string& key, const std::string& abbr, bool extra) {
        head(" " + title + " ");
        const auto& s = r[key];
        line("Mean " + abbr + " (ms):", num(s["mean"]));
        line("Median " + abbr + " (ms):", num(s["median"]));
        line("P99 " + abbr + " (ms):", num(s["p99"]));
        if (extra) {
            line("P95 " + abbr + " (ms):", num(s["p95"]));
            line("Max " + abbr + " (ms):", num(s["max"]));
        }
    };
    block("End-to-End Latency", "e2e_latency_ms", "E2E Latency", false);
    block("Time to First Token", "ttft_ms", "TTFT", false);
    block("Time per Output Token (excl. 1st token)", "tpot_ms", "TPOT", false);
    block("Inter-Token Latency", "itl_ms", "ITL", true);
    t += std::string(56, '=') + "\n";
    if (r.contains("first_error")) t += "first error: " + r["first_error"].get<std::string>() + "\n";
    return t;
}

}  // namespace peregrine
