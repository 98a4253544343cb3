#pragma once
// The ranks of one expert-parallel group in this process (a thread per rank): the communicators
// (in-process loopback on the CPU, NCCL over GPUs 0..n-1 with --device cuda) and a model per rank that
// holds its share of the routed experts; rank r runs on GPU r.
#include "model/model.h"
#include "ops/comm.h"

#include <memory>
#include <string>
#include <vector>

namespace peregrine {

struct ExpertParallelOptions {
    int ranks = 1;
    int redundant_experts = 0;      // extra expert copies per rank (EPLB)
    std::string expert_load_file;   // JSON list of per-expert loads for the placement ("" = equal loads)
};

struct ParallelModels {
    std::vector<std::unique_ptr<Communicator>> comms;  // outlive the models
    std::vector<std::unique_ptr<Model>> models;

    std::vector<Model*> ranks() const;
    // opts.device and opts.gpu are the first rank's; the others use the next GPUs.
    static ParallelModels load(const std::string& dir, ModelOptions opts, const ExpertParallelOptions& ep);
};

// The placement for `n_experts` over `ep.ranks` ranks: contiguous, or balanced with redundant copies.
ExpertPlacement make_expert_placement(int n_experts, const ExpertParallelOptions& ep);

}  // namespace peregrine
