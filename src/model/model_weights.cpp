#include "model/model_weights.h"
#include "model/variant.h"
#include "model/weight_loader.h"

namespace peregrine {

ModelWeights load_model_weights(const ModelConfig& cfg, const SafeTensors& st) {
    WeightLoader L(cfg, st);
    return model_variant(cfg).load_weights(L);
}

ModelWeights synthetic_model_weights(const ModelConfig& cfg, uint64_t seed) {
    WeightLoader L(cfg, seed);
    return model_variant(cfg).load_weights(L);
}

std::vector<SyntheticTensor> synthetic_inventory(const ModelConfig& cfg, uint64_t seed) {
    std::vector<SyntheticTensor> out;
    WeightLoader L(cfg, seed, &out);
    model_variant(cfg).load_weights(L);
    return out;
}

}  // namespace peregrine
