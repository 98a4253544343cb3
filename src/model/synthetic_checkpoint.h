#pragma once
// A synthetic model (Model::synthetic's weights, same seed, same values) written as a released checkpoint:
// safetensors shards named as the releases name them, model.safetensors.index.json, config.json and
// generation_config.json. Tensors are made and written one at a time (the next made while one is written), so a
// checkpoint of any size is written in the memory of two tensors; loading it (Model::load) gives the synthetic
// model bit for bit.
#include "io/model_config.h"
#include "model/weight_loader.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace peregrine {

struct SyntheticCheckpointPlan {
    struct Shard {
        std::string file;  // model-00001-of-00009.safetensors
        std::vector<SyntheticTensor> tensors;
        size_t bytes = 0;  // tensor bytes (the file adds its header)
    };
    std::vector<Shard> shards;
    size_t total_bytes = 0;  // every tensor's bytes: the index's metadata.total_size
    size_t n_tensors = 0;
};

// Shards of at most shard_bytes of tensors (a larger tensor gets one of its own), in the weights' order.
SyntheticCheckpointPlan plan_synthetic_checkpoint(const ModelConfig& cfg, uint64_t seed, size_t shard_bytes);

struct CheckpointWriteProgress {
    size_t bytes_done = 0, bytes_total = 0;
    int shards_done = 0, shards_total = 0;
    double seconds = 0;
};

// Writes the plan's shards, then the index and the configs (a directory cut short has no index, so it never
// loads as a checkpoint). `dir` must exist; files of those names in it are replaced. `progress` is called after
// every tensor.
void write_synthetic_checkpoint(const ModelConfig& cfg, const SyntheticCheckpointPlan& plan, const std::string& dir,
                                const std::function<void(const CheckpointWriteProgress&)>& progress = {});

}  // namespace peregrine
