#pragma once
// generation_config.json: the sampling defaults a model ships with (Hugging Face's keys). A request that does not
// set a field gets the model's value, as SGLang (--sampling-defaults model) and vLLM (--generation-config auto) do.
#include <optional>
#include <string>

namespace peregrine {

struct GenerationConfig {
    std::optional<double> temperature, top_p, min_p, repetition_penalty;
    std::optional<int> top_k;
    bool empty() const { return !temperature && !top_p && !min_p && !repetition_penalty && !top_k; }
    std::string describe() const;  // "temperature 0.8, top_p 0.95", or "none"
};

// DIR/generation_config.json when it exists (else no defaults); a key of the wrong type or out of range fails
// naming the file and the key.
GenerationConfig read_generation_config(const std::string& model_dir);

}  // namespace peregrine
