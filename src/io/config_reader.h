#pragma once
// Reading config.json: typed keys whose errors name the file, and the keys every release of the family shares.
#include "io/model_config.h"

#include <nlohmann/json.hpp>

#include <string>

namespace peregrine {

// Typed keys of one JSON object of config.json; a missing required key or a wrong type names the file.
struct ConfigReader {
    const nlohmann::json& j;
    const std::string& path;

    bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
    template <typename T>
    T get(const char* k) const {
        if (!has(k)) fail_missing(k);
        try {
            return j[k].get<T>();
        } catch (const nlohmann::json::exception& e) {
            fail_type(k, e.what());
        }
    }
    template <typename T>
    T get(const char* k, T fallback) const {
        return has(k) ? get<T>(k) : fallback;
    }

private:
    [[noreturn]] void fail_missing(const char* k) const;
    [[noreturn]] void fail_type(const char* k, const char* what) const;
};

// The keys every release has (sizes, attention, RoPE/YaRN, MoE, mHC, token ids).
void read_shared_config(const ConfigReader& r, ModelConfig& c);
// quantization_config: fp8 with ue8m0 scales, square weight blocks of 32 or 128.
void read_quantization_config(const nlohmann::json& q, const std::string& path, ModelConfig& c);
// Sizes and ranges every release must satisfy; fails naming the file.
void validate_shared_config(const ModelConfig& c, const std::string& path);

}  // namespace peregrine
