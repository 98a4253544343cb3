#pragma once
// Serving benchmark client (the measurements of sglang.bench_serving): prompts of token ids sent to
// /v1/completions, streamed, at a fixed concurrency or a Poisson rate. Datasets: `random` (lengths uniform
// below the given ones) and `generated-shared-prefix` (groups of prompts sharing a system prompt, in shuffled
// order, as sglang.bench_serving's --gsp-* options make them: prefix-cache and hierarchical-cache traffic).
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace peregrine {

struct BenchServeOptions {
    std::string url = "http://127.0.0.1:30000";
    std::string model;          // default: the server's first model
    std::string api_key;
    std::string dataset = "random";  // or "generated-shared-prefix"
    int gsp_num_groups = 64, gsp_prompts_per_group = 16, gsp_system_prompt_len = 2048, gsp_question_len = 128,
        gsp_output_len = 256;
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
