#pragma once
// Reading config.json: typed keys whose errors name the file, and the keys every release of the family shares.
#include "io/model_config.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace peregrine {

// Typed keys of one JSON object of config.json; a missing required key or a wrong type names the file.
struct ConfigReader {
    const nlohmann::json& j;
    const std::string& path;

    bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
    template <typename T>
    T get(const char* k) const {
        if (!has(k)) fail_missing(k);
        // The JSON library converts a number outside an integer type's range with undefined behaviour (3e24 to
        // int): such a value, or a fraction, is the file's error.
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) check_integer<T>(k, j[k]);
        if constexpr (is_integer_vector<T>::value)
            if (j[k].is_array())
                for (auto& x : j[k]) check_integer<typename T::value_type>(k, x);
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
    template <typename T>
    struct is_integer_vector : std::false_type {};
    template <typename I>
    struct is_integer_vector<std::vector<I>>
        : std::bool_constant<std::is_integral_v<I> && !std::is_same_v<I, bool>> {};
    template <typename I>
    void check_integer(const char* k, const nlohmann::json& v) const {
        static_assert(std::is_signed_v<I>);
        using lim = std::numeric_limits<I>;
        bool ok = true;
        if (v.is_number_unsigned()) ok = v.get<uint64_t>() <= static_cast<uint64_t>(lim::max());
        else if (v.is_number_integer()) ok = v.get<int64_t>() >= lim::min() && v.get<int64_t>() <= lim::max();
        else if (v.is_number_float()) {  // [min, -min): -min is the first power of two above the range
            const double d = v.get<double>(), lo = static_cast<double>(lim::min());
            ok = d >= lo && d < -lo && std::floor(d) == d;
        }
        if (!ok) fail_type(k, ("an integer in range is needed, not " + v.dump()).c_str());
    }
    [[noreturn]] void fail_missing(const char* k) const;
    [[noreturn]] void fail_type(const char* k, const char* what) const;
};

// The keys every release has (sizes, attention, RoPE/YaRN, MoE, mHC, token ids).
void read_shared_config(const ConfigReader& r, ModelConfig& c);
// Those keys as a release writes them (read_shared_config reads them back), with the fixed ones it ships
// (num_key_value_heads 1, silu, untied embeddings, YaRN rope_scaling, noaux_tc routing).
nlohmann::json shared_config_json(const ModelConfig& c);
// quantization_config: fp8 with ue8m0 scales, square weight blocks of 32 or 128.
void read_quantization_config(const nlohmann::json& q, const std::string& path, ModelConfig& c);
// Sizes and ranges every release must satisfy; fails naming the file.
void validate_shared_config(const ModelConfig& c, const std::string& path);

}  // namespace peregrine
