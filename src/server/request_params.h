#pragma once
// Generation parameters from OpenAI (and SGLang sampling_params) JSON, validated: a wrong type or an
// out-of-range value throws ApiError(400) naming the parameter.
#include "engine/request.h"
#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace peregrine {

struct ParamLimits {
    int vocab = 0;               // logit_bias / stop_token_ids ids must be below it
    int64_t context_length = 0;  // max_tokens above it can never be met
    int64_t default_max_tokens = 0;
    SamplingParams sampling_defaults;  // what a request that does not set a field gets (the model's defaults)
};

// Reads the OpenAI fields (temperature, top_p, top_k, min_p, presence/frequency/repetition penalties,
// logit_bias, stop, stop_token_ids, max_tokens / max_completion_tokens, min_tokens, ignore_eos, seed).
// `prefix` names nested objects in error params (e.g. "sampling_params.").
GenerationParams read_generation_params(const nlohmann::ordered_json& body, const ParamLimits& lim,
                                        const std::string& prefix = {}, const char* max_tokens_key = "max_tokens");

// Typed optional field readers that throw ApiError(400, param) on a wrong type or range.
std::optional<double> get_number(const nlohmann::ordered_json& o, const std::string& key, double lo, double hi,
                                 const std::string& prefix = {});
std::optional<int64_t> get_int(const nlohmann::ordered_json& o, const std::string& key, int64_t lo, int64_t hi,
                               const std::string& prefix = {});
std::optional<bool> get_bool(const nlohmann::ordered_json& o, const std::string& key, const std::string& prefix = {});

}  // namespace peregrine
