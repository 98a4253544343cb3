#pragma once
// Expert parallelism: the routed experts of every MoE layer are spread over the ranks of a group (one rank
// per GPU), each rank keeps its own requests and KV (attention data-parallel), and a MoE layer sends each
// (token, slot) pair to a rank holding its expert and the results back (dispatch and combine, in the
// spirit of DeepEP). The combine sums in the reference's order, so outputs equal a single rank's.
#include "ops/backend.h"
#include "ops/comm.h"

#include <cstdint>
#include <vector>

namespace peregrine {

// Which ranks hold which routed experts. Every expert has at least one copy; redundant copies of the most
// loaded experts (EPLB) share its pairs.
struct ExpertPlacement {
    int n_experts = 0, n_ranks = 0;
    std::vector<std::vector<int>> replicas;  // expert -> ranks holding a copy, ascending

    // Rank r holds experts [r*E/n, (r+1)*E/n).
    static ExpertPlacement contiguous(int n_experts, int n_ranks);
    // E/n experts plus `redundant` extra copies per rank: the extra copies go to the experts with the most
    // load per copy, then every copy (heaviest first) to the least loaded rank with room that lacks it.
    static ExpertPlacement balanced(const std::vector<double>& load, int n_ranks, int redundant);

    bool holds(int rank, int expert) const;
    // The rank that computes pair `key` of `expert`: its copies in turn.
    int serving_rank(int expert, uint64_t key) const;
    // Expected load per rank when each expert's load is split evenly over its copies.
    std::vector<double> rank_loads(const std::vector<double>& load) const;
};

class ExpertParallel {
public:
    ExpertParallel(Communicator& comm, ExpertPlacement placement);
    Communicator& comm() { return comm_; }
    const ExpertPlacement& placement() const { return placement_; }

    // Drops the experts this rank does not hold (their weights are never read or uploaded here).
    void keep_local(MoEWeight& w) const;
    // Backend::moe over the group: every rank calls it together for the same layer, with its own rows
    // (possibly none: x may have 0 rows, and then an empty result comes back).
    Tensor moe(Backend& be, const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids);

private:
    Communicator& comm_;
    ExpertPlacement placement_;
};

}  // namespace peregrine
