// peregrine bench serve: load a running server like sglang.bench_serving and report throughput/latency.
#include "commands.h"
#include "server/bench_client.h"
#include "util/file.h"

#include <cstdio>
#include <fstream>

namespace peregrine {
namespace {

RegisterCommand reg([](CLI::App& app, int& exit_code) {
    auto o = std::make_shared<BenchServeOptions>();
    auto out = std::make_shared<std::string>();
    CLI::App* bench = command_group(app, "bench", "Benchmarks");
    auto* cmd = bench->add_subcommand("serve", "Benchmark a running server (random prompts, streamed completions)");
    cmd->add_option("--url", o->url, "Server base URL");
    cmd->add_option("--model", o->model, "Model name (default: the server's)");
    cmd->add_option("--api-key", o->api_key);
    cmd->add_option("--dataset-name,--dataset", o->dataset,
                    "random (token ids drawn uniformly) or generated-shared-prefix (groups sharing a system prompt)")
        ->check(CLI::IsMember({"random", "generated-shared-prefix"}));
    cmd->add_option("--gsp-num-groups", o->gsp_num_groups)->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--gsp-prompts-per-group", o->gsp_prompts_per_group)->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--gsp-system-prompt-len", o->gsp_system_prompt_len)->check(CLI::Range(0, 1 << 24));
    cmd->add_option("--gsp-question-len", o->gsp_question_len)->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--gsp-output-len", o->gsp_output_len)->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--input-len", o->input_len)->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--output-len", o->output_len)->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--range-ratio", o->range_ratio, "Lengths uniform in [ratio*len, len]")
        ->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--num-prompts", o->num_prompts)->check(CLI::Range(1, 1 << 24));
    auto* mc = cmd->add_option("--max-concurrency", o->max_concurrency)->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--request-rate", o->request_rate, "Poisson arrivals per second (default: all at once)")
        ->check(CLI::Range(0.0, 1e9))->excludes(mc);
    cmd->add_option("--vocab", o->vocab, "Token ids below this (default: the server's vocab_size)");
    cmd->add_option("--warmup-requests", o->warmup_requests)->check(CLI::Range(0, 1 << 20));
    cmd->add_option("--seed", o->seed);
    cmd->add_option("--output-file", *out, "Write the report as JSON");
    cmd->callback([o, out, &exit_code] {
        auto rep = run_bench_serve(*o);
        std::fputs(bench_serve_table(rep).c_str(), stdout);
        if (!out->empty()) {
            const std::string text = rep.dump(2) + "\n";
            write_file(*out, text.data(), text.size());
        }
        exit_code = rep["failed"].get<int64_t>() == 0 ? 0 : 1;
    });
});

}  // namespace
}  // namespace peregrine
