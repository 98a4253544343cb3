#include "model/parallel_models.h"
#include "util/error.h"
#include "util/file.h"

#include <nlohmann/json.hpp>

namespace peregrine {

std::vector<Model*> ParallelModels::ranks() const {
    std::vector<Model*> out;
    for (auto& m : models) out.push_back(m.get());
    return out;
}

ExpertPlacement make_expert_placement(int n_experts, const ExpertParallelOptions& ep) {
    if (ep.redundant_experts == 0 && ep.expert_load_file.empty())
        return ExpertPlacement::contiguous(n_experts, ep.ranks);
    std::vector<double> load(static_cast<size_t>(n_experts), 1.0);
    if (!ep.expert_load_file.empty()) {
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(read_file(ep.expert_load_file));
        } catch (const nlohmann::json::exception& e) {
            fail("{}: not JSON ({})", ep.expert_load_file, e.what());
        }
        PEREGRINE_CHECK(j.is_array() && static_cast<int>(j.size()) == n_experts,
                        "{}: expected a list of {} per-expert loads", ep.expert_load_file, n_experts);
        for (int e = 0; e < n_experts; ++e) {
            PEREGRINE_CHECK(j[static_cast<size_t>(e)].is_number() && j[static_cast<size_t>(e)].get<double>() >= 0.0,
                            "{}: load {} is not a non-negative number", ep.expert_load_file, e);
            load[static_cast<size_t>(e)] = j[static_cast<size_t>(e)].get<double>();
        }
    }
    return ExpertPlacement::balanced(load, ep.ranks, ep.redundant_experts);
}

ParallelModels ParallelModels::load(const std::string& dir, ModelOptions opts, const ExpertParallelOptions& ep) {
    PEREGRINE_CHECK(ep.ranks >= 1, "expert parallelism needs at least one rank");
    ParallelModels p;
    if (ep.ranks == 1) {
        p.models.push_back(Model::load(dir, opts));
        return p;
    }
    PEREGRINE_CHECK(opts.device != "cuda" || opts.gpu == 0, "a GPU group starts at GPU 0");
    p.comms = opts.device == "cuda" ? make_nccl_group(ep.ranks) : make_loopback_group(ep.ranks);
    for (int r = 0; r < ep.ranks; ++r) {
        ModelOptions o = opts;
        o.gpu = r;
        auto m = Model::load(dir, o);
        const ExpertPlacement placement = make_expert_placement(m->config().n_routed_experts, ep);
        m->set_expert_parallel(std::make_shared<ExpertParallel>(*p.comms[static_cast<size_t>(r)], placement));
        p.models.push_back(std::move(m));
    }
    return p;
}

}  // namespace peregrine
