#pragma once
// Serving benchmark client (the measurements of sglang.bench_serving): random prompts of given token
// lengths sent to /v1/completions as token ids, streamed, at a fixed concurrency or a Poisson rate.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace peregrine {

struct BenchServeOptions {
    std::string url = "http://127.0.0.1:30000";
    std::string model;          // default: the server's first model
    std::string api_key;
    int input_len = 1024, output_len = 128;
    double range_ratio = 1.0;   // lengths uniform in [ratio * len, len]
    int num_prompts = 100;
    int max_concurrency = 0;    // 0: unbounded
    double request_rate = 0.0;  // requests/s, Poisson arrivals; 0: all at once
    int vocab = 0;              // token ids drawn below it; 0: the server's vocab_size (or 256)
    int warmup_requests = 1;
    uint64_t seed = 1;
};

// Runs the benchmark; returns the report (the same fields sglang.bench_serving writes).
nlohmann::json run_bench_serve(const BenchServeOptions& o);
// The report as an aligned text table.
std::string bench_serve_table(const nlohmann::json& report);

}  // namespace peregrine
