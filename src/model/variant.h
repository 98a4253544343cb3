#pragma once
// A release of the DeepSeek-V4 family, each supplied by its own file (deepseek_v41.cpp, deepseek_v4.cpp): how its
// config.json reads, which attention role each layer plays, what each layer keeps per sequence, where its weights
// are, and the parameters the ops take where the releases compute differently. Everything else is shared.
#include "io/model_config.h"
#include "kv/state_layout.h"
#include "ops/backend.h"
#include "ops/model_format.h"
#include "ops/weights.h"

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace peregrine {

class WeightLoader;

class ModelVariant {
public:
    virtual ~ModelVariant() = default;
    virtual ModelArch arch() const = 0;
    virtual const char* model_type() const = 0;  // config.json's model_type
    virtual const char* name() const = 0;        // as users know it ("DeepSeek-V4.1")
    virtual const char* draft_name() const = 0;  // what its draft layers are called ("DSpark stages")

    // Its config.json (the shared keys through read_shared_config, its own keys and defaults), checked.
    virtual ModelConfig read_config(const nlohmann::json& root, const std::string& path) const = 0;
    // config.json as the release lays it out, for c (read_config reads it back as c).
    virtual nlohmann::json config_json(const ModelConfig& c) const = 0;
    virtual ModelFormat format(const ModelConfig& c) const = 0;
    virtual std::vector<AttentionLayerInfo> layer_roles(const ModelConfig& c) const = 0;
    // What each layer (then each draft stage that keeps a window) keeps per sequence.
    virtual StateSpec state_spec(const ModelConfig& c) const = 0;
    virtual ModelWeights load_weights(WeightLoader& L) const = 0;
};

// The variant of a configuration, or of a model_type (null: none).
const ModelVariant& model_variant(const ModelConfig& c);
const ModelVariant* find_model_variant(const std::string& model_type);

// config.json read by the variant its model_type names; unknown architectures are refused with the known ones.
ModelConfig parse_model_config(const std::string& json_text, const std::string& path = "config.json");
ModelConfig load_model_config(const std::string& model_dir);
// The text of c's config.json; fails unless it reads back as exactly c (a field its release has no key for).
std::string model_config_json(const ModelConfig& c);
// One line: release, layers, sizes.
std::string describe_model(const ModelConfig& c);

// Shorthands for the variant's answers.
inline ModelFormat model_format(const ModelConfig& c) { return model_variant(c).format(c); }
inline std::vector<AttentionLayerInfo> attention_layer_infos(const ModelConfig& c) {
    return model_variant(c).layer_roles(c);
}
inline StateSpec state_spec(const ModelConfig& c) { return model_variant(c).state_spec(c); }
inline StateLayout make_state_layout(const ModelConfig& c, int page_tokens) {
    return make_state_layout(state_spec(c), page_tokens);
}

}  // namespace peregrine
