#include "io/generation_config.h"

#include "util/error.h"
#include "util/file.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>

namespace peregrine {

std::string GenerationConfig::describe() const {
    std::string s;
    auto add = [&](const char* k, auto v) {
        if (v) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", k, *v);
    };
    add("temperature", temperature);
    add("top_p", top_p);
    add("top_k", top_k);
    add("min_p", min_p);
    add("repetition_penalty", repetition_penalty);
    return s.empty() ? "none" : s;
}

GenerationConfig read_generation_config(const std::string& model_dir) {
    GenerationConfig g;
    const std::string path = model_dir + "/generation_config.json";
    if (!std::filesystem::exists(path)) return g;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(read_file(path));
    } catch (const nlohmann::json::exception& e) {
        fail("'{}' is not valid JSON: {}", path, e.what());
    }
    if (!j.is_object()) fail("'{}' must hold a JSON object", path);
    // The ranges the API accepts for the same fields (server/request_params.cpp).
    auto number = [&](const char* k, double lo, double hi, bool open_lo) -> std::optional<double> {
        if (!j.contains(k) || j[k].is_null()) return std::nullopt;
        if (!j[k].is_number()) fail("'{}': key '{}' must be a number", path, k);
        const double v = j[k].get<double>();
        if (v < lo || v > hi || (open_lo && v == lo))
            fail("'{}': key '{}' is {}, outside {}{}, {}]", path, k, v, open_lo ? "(" : "[", lo, hi);
        return v;
    };
    g.temperature = number("temperature", 0.0, 2.0, false);
    g.top_p = number("top_p", 0.0, 1.0, true);
    g.min_p = number("min_p", 0.0, 1.0, false);
    g.repetition_penalty = number("repetition_penalty", 0.0, 2.0, true);
    if (auto k = number("top_k", -1.0, 1 << 30, false)) {
        if (*k != static_cast<double>(static_cast<int>(*k))) fail("'{}': key 'top_k' must be an integer", path);
        g.top_k = static_cast<int>(*k);
    }
    return g;
}

}  // namespace peregrine
