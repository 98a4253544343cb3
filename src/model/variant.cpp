#include "model/variant.h"
#include "util/error.h"
#include "util/file.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace peregrine {

const ModelVariant& deepseek_v41_variant();  // deepseek_v41.cpp
const ModelVariant& deepseek_v4_variant();   // deepseek_v4.cpp

namespace {
const std::vector<const ModelVariant*>& variants() {
    static const std::vector<const ModelVariant*> v = {&deepseek_v41_variant(), &deepseek_v4_variant()};
    return v;
}
}  // namespace

const ModelVariant& model_variant(const ModelConfig& c) {
    for (const ModelVariant* v : variants())
        if (v->arch() == c.arch) return *v;
    fail("no model variant for this configuration");
}

const ModelVariant* find_model_variant(const std::string& model_type) {
    for (const ModelVariant* v : variants())
        if (model_type == v->model_type()) return v;
    return nullptr;
}

ModelConfig parse_model_config(const std::string& text, const std::string& path) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        fail("'{}' is not valid JSON: {}", path, e.what());
    }
    if (!j.is_object()) fail("'{}' is not a JSON object", path);
    const nlohmann::json type = j.value("model_type", nlohmann::json(""));
    const std::string model_type = type.is_string() ? type.get<std::string>() : type.dump();
    if (const ModelVariant* v = find_model_variant(model_type)) return v->read_config(j, path);
    std::string archs;
    if (j.contains("architectures") && j["architectures"].is_array())
        for (auto& a : j["architectures"])
            archs += (archs.empty() ? "" : ",") + (a.is_string() ? a.get<std::string>() : a.dump());
    fail("'{}': unsupported architecture (model_type '{}', architectures '{}'); Peregrine serves deepseek_v41 "
         "(DeepseekV41ForCausalLM) and deepseek_v4 (DeepseekV4ForCausalLM)",
         path, model_type, archs);
}

ModelConfig load_model_config(const std::string& model_dir) {
    std::string path = model_dir + "/config.json";
    if (!file_exists(path)) fail("no config.json in '{}'", model_dir);
    return parse_model_config(read_file(path), path);
}

std::string model_config_json(const ModelConfig& c) {
    const ModelVariant& v = model_variant(c);
    const std::string text = v.config_json(c).dump(2) + "\n";
    if (!(parse_model_config(text) == c))
        fail("this {} configuration has a field its config.json cannot express: it would not read back the same",
             v.name());
    return text;
}

std::string describe_model(const ModelConfig& c) {
    const ModelVariant& v = model_variant(c);
    return fmt::format("{} ({}): {} layers + {} {}, hidden {}, {} heads x {}, {} experts top-{}, vocab {}", v.name(),
                       c.model_type, c.n_layers, c.n_mtp_layers, v.draft_name(), c.dim, c.n_heads, c.head_dim,
                       c.n_routed_experts, c.n_activated_experts, c.vocab_size);
}

}  // namespace peregrine
