#pragma once
// peregrine bench engine --ep N: the forward-step benchmark over N GPUs of this host, each a rank with its
// own sequences (data-parallel attention) and 1/N of the routed experts (expert parallelism over NCCL).
#include <cstdint>
#include <string>

namespace peregrine {

struct EpBenchArgs {
    int ranks = 2, layers = 4, experts = 384, steps = 3;
    bool balanced = true;
    std::string decode_batches, contexts, prefill_tokens, json;  // batches and prefill tokens per GPU
    int64_t prefill_context = 131072;
};

int run_bench_engine_ep(const EpBenchArgs& a);

}  // namespace peregrine
