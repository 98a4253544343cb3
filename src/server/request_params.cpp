#include "server/request_params.h"

#include <fmt/format.h>

#include <cmath>

namespace peregrine {

using ojson = nlohmann::ordered_json;

nlohmann::json error_json(const std::string& message, const std::string& type, const std::string& param,
                          const std::string& code) {
    nlohmann::json e = {{"message", message}, {"type", type}};
    e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
    e["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
    return {{"error", e}};
}

nlohmann::json ApiError::to_json() const { return error_json(what(), type_, param_, code_); }

namespace {
[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }
const ojson* field(const ojson& o, const std::string& key) {
    auto it = o.find(key);
    return it == o.end() || it->is_null() ? nullptr : &*it;
}
}  // namespace

std::optional<double> get_number(const ojson& o, const std::string& key, double lo, double hi,
                                 const std::string& prefix) {
    const ojson* v = field(o, key);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad(prefix + key, fmt::format("'{}' must be a number", key));
    double d = v->get<double>();
    if (!(d >= lo && d <= hi)) bad(prefix + key, fmt::format("'{}' must be within [{}, {}], got {}", key, lo, hi, d));
    return d;
}

std::optional<int64_t> get_int(const ojson& o, const std::string& key, int64_t lo, int64_t hi,
                               const std::string& prefix) {
    const ojson* v = field(o, key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer() && !(v->is_number_float() && std::floor(v->get<double>()) == v->get<double>()))
        bad(prefix + key, fmt::format("'{}' must be an integer", key));
    int64_t i = 0;
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        i = INT64_MAX;
    } else if (v->is_number_integer()) {
        i = v->get<int64_t>();
    } else {  // a whole double beyond int64 (2e125) would convert with undefined behaviour: clamped, then refused
        const double d = v->get<double>();
        i = d >= 0x1p63 ? INT64_MAX : d < -0x1p63 ? INT64_MIN : static_cast<int64_t>(d);
    }
    if (i < lo || i > hi) bad(prefix + key, fmt::format("'{}' must be within [{}, {}], got {}", key, lo, hi, i));
    return i;
}

std::optional<bool> get_bool(const ojson& o, const std::string& key, const std::string& prefix) {
    const ojson* v = field(o, key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad(prefix + key, fmt::format("'{}' must be a boolean", key));
    return v->get<bool>();
}

GenerationParams read_generation_params(const ojson& body, const ParamLimits& lim, const std::string& prefix,
                                        const char* max_tokens_key) {
    GenerationParams g;
    auto& s = g.sampling;
    s = lim.sampling_defaults;
    if (auto v = get_number(body, "temperature", 0.0, 2.0, prefix)) s.temperature = static_cast<float>(*v);
    if (auto v = get_number(body, "top_p", 0.0, 1.0, prefix)) {
        if (*v <= 0.0) bad(prefix + "top_p", "'top_p' must be greater than 0");
        s.top_p = static_cast<float>(*v);
    }
    if (auto v = get_int(body, "top_k", -1, 1 << 30, prefix)) s.top_k = static_cast<int>(*v);
    if (auto v = get_number(body, "min_p", 0.0, 1.0, prefix)) s.min_p = static_cast<float>(*v);
    if (auto v = get_number(body, "presence_penalty", -2.0, 2.0, prefix)) s.presence_penalty = static_cast<float>(*v);
    if (auto v = get_number(body, "frequency_penalty", -2.0, 2.0, prefix)) s.frequency_penalty = static_cast<float>(*v);
    if (auto v = get_number(body, "repetition_penalty", 0.0, 2.0, prefix)) {
        if (*v <= 0.0) bad(prefix + "repetition_penalty", "'repetition_penalty' must be greater than 0");
        s.repetition_penalty = static_cast<float>(*v);
    }
    if (auto v = get_int(body, "seed", INT64_MIN, INT64_MAX, prefix))
        s.seed = *v < 0 ? static_cast<int64_t>(static_cast<uint64_t>(*v) >> 1) : *v;
    if (const ojson* lb = field(body, "logit_bias")) {
        if (!lb->is_object()) bad(prefix + "logit_bias", "'logit_bias' must be an object of token id -> bias");
        for (auto& [k, v] : lb->items()) {
            char* end = nullptr;
            long id = std::strtol(k.c_str(), &end, 10);
            if (k.empty() || *end || id < 0 || id >= lim.vocab)
                bad(prefix + "logit_bias", fmt::format("logit_bias key '{}' is not a token id below {}", k, lim.vocab));
            if (!v.is_number() || v.get<double>() < -100.0 || v.get<double>() > 100.0)
                bad(prefix + "logit_bias", "logit_bias values must be numbers within [-100, 100]");
            s.logit_bias.emplace_back(static_cast<int32_t>(id), v.get<float>());
        }
    }
    if (const ojson* st = field(body, "stop")) {
        if (st->is_string()) g.stop.push_back(st->get<std::string>());
        else if (st->is_array()) {
            for (auto& x : *st) {
                if (!x.is_string()) bad(prefix + "stop", "'stop' must be a string or an array of strings");
                g.stop.push_back(x.get<std::string>());
            }
        } else bad(prefix + "stop", "'stop' must be a string or an array of strings");
        for (auto& x : g.stop)
            if (x.empty()) bad(prefix + "stop", "stop strings must not be empty");
    }
    if (const ojson* st = field(body, "stop_token_ids")) {
        if (!st->is_array()) bad(prefix + "stop_token_ids", "'stop_token_ids' must be an array of token ids");
        for (auto& x : *st) {
            if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= lim.vocab)
                bad(prefix + "stop_token_ids", fmt::format("stop_token_ids must be token ids below {}", lim.vocab));
            g.stop_token_ids.push_back(x.get<int32_t>());
        }
    }
    std::optional<int64_t> mt = get_int(body, max_tokens_key, INT64_MIN, INT64_MAX, prefix);
    std::string mt_key = max_tokens_key;
    if (!mt && std::string(max_tokens_key) == "max_tokens") {
        mt = get_int(body, "max_completion_tokens", INT64_MIN, INT64_MAX, prefix);
        mt_key = "max_completion_tokens";
    }
    if (mt) {
        if (*mt <= 0) bad(prefix + mt_key, fmt::format("'{}' must be at least 1, got {}", mt_key, *mt));
        if (*mt > lim.context_length)
            bad(prefix + mt_key,
                fmt::format("'{}' is {} but the context length is {}", mt_key, *mt, lim.context_length));
        g.max_new_tokens = *mt;
    } else {
        g.max_new_tokens = lim.default_max_tokens > 0 ? lim.default_max_tokens : lim.context_length;
    }
    if (auto v = get_int(body, "min_tokens", 0, lim.context_length, prefix)) g.min_new_tokens = *v;
    if (auto v = get_int(body, "min_new_tokens", 0, lim.context_length, prefix)) g.min_new_tokens = *v;
    if (auto v = get_bool(body, "ignore_eos", prefix)) g.ignore_eos = *v;
    if (auto v = get_bool(body, "skip_special_tokens", prefix)) g.skip_special_tokens = *v;
    return g;
}

}  // namespace peregrine
