#pragma once
// A model's weights, read from its checkpoint or made up, as its variant names and lays them out.
#include "io/model_config.h"
#include "io/safetensors.h"
#include "ops/weights.h"

namespace peregrine {

// Every tensor is checked for presence, dtype and shape before use; errors name the tensor and file.
ModelWeights load_model_weights(const ModelConfig& cfg, const SafeTensors& st);
// The same tensors, made up (released formats, sane magnitudes, deterministic in seed): benchmarks at
// real dimensions without a checkpoint.
ModelWeights synthetic_model_weights(const ModelConfig& cfg, uint64_t seed);

}  // namespace peregrine
