#include "server/route_requests.h"
#include "server/anthropic_api.h"
#include "util/json_depth.h"

#include <fmt/format.h>

namespace peregrine {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

namespace {

bool valid_utf8(const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!n || i + static_cast<size_t>(n) > s.size()) return false;
        uint32_t cp = n == 1 ? c : c & (0x7f >> n);
        for (int k = 1; k < n; ++k) {
            unsigned char d = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
            if ((d & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (d & 0x3f);
        }
        if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += static_cast<size_t>(n);
    }
    return true;
}

// OpenAI response_format on /v1/completions (chat reads it through the protocol library).
std::optional<grammar::ConstraintSpec> response_format_spec(const ojson& body) {
    auto it = body.find("response_format");
    if (it == body.end() || it->is_null()) return std::nullopt;
    std::optional<grammar::ConstraintSpec> spec;
    try {
        spec = grammar::constraint_from_response_format(json::parse(it->dump()));
    } catch (const Error& e) {
        throw ApiError(400, e.what(), "response_format");
    }
    // Keep the schema's own key order (properties are generated in schema order).
    if (spec && spec->kind == grammar::ConstraintKind::kJsonSchema)
        spec->text = (*it)["json_schema"]["schema"].dump();
    return spec;
}

}  // namespace

ojson parse_body(const std::string& body) {
    if (!valid_utf8(body)) throw ApiError(400, "the request body is not valid UTF-8");
    if (const char* problem = json_shape_problem(body)) throw ApiError(400, std::string("the request body ") + problem);
    ojson j = ojson::parse(body, nullptr, false);
    if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
    if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
    return j;
}

void check_model(const ojson& body, const std::string& served_model_name) {
    auto it = body.find("model");
    if (it == body.end() || it->is_null()) return;
    if (!it->is_string()) throw ApiError(400, "'model' must be a string", "model");
    const auto name = it->get<std::string>();
    if (!name.empty() && name != served_model_name)
        throw ApiError(400,
                       fmt::format("the model '{}' does not exist (this server serves '{}')", name, served_model_name),
                       "model", "invalid_request_error", "model_not_found");
}

CompletionsRequest parse_completions_request(const std::string& text, const RouteOptions& o) {
    ojson body = parse_body(text);
    check_model(body, o.served_model_name);
    CompletionsRequest r;
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) throw ApiError(400, "'prompt' is required", "prompt");
    auto add_prompt = [&](const ojson& p) {
        if (p.is_string()) {
            if (p.get<std::string>().empty()) throw ApiError(400, "'prompt' must not be empty", "prompt");
            r.prompts.push_back({p.get<std::string>(), {}});
        } else if (p.is_array() && !p.empty() && p[0].is_number()) {
            std::vector<int32_t> ids;
            for (auto& x : p) {
                if (!x.is_number_integer()) throw ApiError(400, "token id prompts must hold integers", "prompt");
                int64_t v = x.get<int64_t>();
                if (v < 0 || v >= o.limits.vocab)
                    throw ApiError(
                        400, fmt::format("prompt token id {} is outside the vocabulary (0..{})", v, o.limits.vocab - 1),
                        "prompt");
                ids.push_back(static_cast<int32_t>(v));
            }
            r.prompts.push_back({{}, std::move(ids)});
        } else {
            throw ApiError(400, "'prompt' must be a string, an array of strings or an array of token ids", "prompt");
        }
    };
    if (it->is_array() && !it->empty() && !(*it)[0].is_number()) {
        for (auto& p : *it) add_prompt(p);
    } else {
        add_prompt(*it);
    }
    if (r.prompts.empty()) throw ApiError(400, "'prompt' must not be empty", "prompt");
    r.params = read_generation_params(body, o.limits);
    if (!body.contains("max_tokens") && !body.contains("max_completion_tokens"))
        r.params.max_new_tokens = std::min<int64_t>(r.params.max_new_tokens, 16);
    r.n = static_cast<int>(get_int(body, "n", 1, 128).value_or(1));
    if (auto lp = get_int(body, "logprobs", 0, 20)) {
        r.params.logprobs = true;
        r.params.top_logprobs = static_cast<int>(*lp);
    }
    if (get_bool(body, "echo").value_or(false)) throw ApiError(400, "'echo' is not supported", "echo");
    r.constraint = response_format_spec(body);
    r.stream = get_bool(body, "stream").value_or(false);
    const ojson* so =
        body.contains("stream_options") && !body["stream_options"].is_null() ? &body["stream_options"] : nullptr;
    if (so && !so->is_object()) throw ApiError(400, "'stream_options' must be an object", "stream_options");
    r.include_usage = r.stream && so && get_bool(*so, "include_usage", "stream_options.").value_or(false);
    return r;
}

ChatRouteRequest parse_chat_route_request(const std::string& text, const RouteOptions& o) {
    ojson body = parse_body(text);
    check_model(body, o.served_model_name);
    // Thinking is off by default; chat_template_kwargs.thinking (SGLang) or a reasoning_effort other
    // than "none" turns it on, unless the request's own thinking object says otherwise.
    if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
        if (!it->is_object()) throw ApiError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs");
        for (const char* key : {"thinking", "enable_thinking"}) {
            auto t = it->find(key);
            if (t == it->end() || t->is_null()) continue;
            if (!t->is_boolean())
                throw ApiError(400, fmt::format("'chat_template_kwargs.{}' must be a boolean", key),
                               fmt::format("chat_template_kwargs.{}", key));
            if (!body.contains("thinking")) body["thinking"] = {{"type", t->get<bool>() ? "enabled" : "disabled"}};
        }
    }
    if (auto it = body.find("reasoning_effort"); it != body.end() && !body.contains("thinking") &&
                                                 !(it->is_string() && it->get<std::string>() == "none") &&
                                                 !it->is_null())
        body["thinking"] = {{"type", "enabled"}};
    RequestOptions ropts;
    ropts.default_thinking = o.default_thinking;
    ChatRouteRequest r;
    r.req = parse_chat_request(body, ropts);
    r.prompt = render_prompt(r.req, o.chat_format);
    r.params = read_generation_params(body, o.limits);
    r.params.logprobs = r.req.logprobs;
    r.params.top_logprobs = r.req.top_logprobs.value_or(0);
    r.n = static_cast<int>(get_int(body, "n", 1, 128).value_or(1));
    if (r.req.response_format.type == ResponseFormatType::json_object)
        r.constraint = grammar::ConstraintSpec{grammar::ConstraintKind::kJsonObject, ""};
    if (r.req.response_format.type == ResponseFormatType::json_schema)
        r.constraint =
            grammar::ConstraintSpec{grammar::ConstraintKind::kJsonSchema, r.req.response_format.schema.dump()};
    // The grammar constrains the whole output, so it cannot follow a reasoning block: a constrained
    // request must turn thinking off.
    if (r.constraint && r.req.thinking)
        throw ApiError(400,
                       "response_format cannot be combined with thinking: turn thinking off (thinking: {type: "
                       "disabled})",
                       "response_format");
    return r;
}

MessagesRequest parse_messages_request(const std::string& text, const RouteOptions& o, bool count_only) {
    ojson body = parse_body(text);
    MessagesRequest r;
    r.chat_body = anthropic_to_chat_body(body, count_only);
    check_model(r.chat_body, o.served_model_name);
    RequestOptions ropts;
    ropts.default_thinking = o.default_thinking;
    r.req = parse_chat_request(r.chat_body, ropts);
    r.prompt = render_prompt(r.req, o.chat_format);
    if (!count_only) r.params = read_generation_params(r.chat_body, o.limits);
    return r;
}

GenerateRequest parse_generate_request(const std::string& text, const RouteOptions& o) {
    ojson body = parse_body(text);
    GenerateRequest r;
    if (body.contains("input_ids") && !body["input_ids"].is_null()) {
        const auto& a = body["input_ids"];
        if (!a.is_array() || a.empty())
            throw ApiError(400, "'input_ids' must be a non-empty array of token ids", "input_ids");
        for (auto& x : a) {
            if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= o.limits.vocab)
                throw ApiError(400, fmt::format("'input_ids' must hold token ids below {}", o.limits.vocab),
                               "input_ids");
            r.prompt.ids.push_back(x.get<int32_t>());
        }
    } else if (body.contains("text") && body["text"].is_string()) {
        if (body["text"].get<std::string>().empty()) throw ApiError(400, "'text' must not be empty", "text");
        r.prompt.text = body["text"].get<std::string>();
    } else {
        throw ApiError(400, "give 'text' (a string) or 'input_ids'", "text");
    }
    ojson sp = body.contains("sampling_params") ? body["sampling_params"] : ojson::object();
    if (sp.is_null()) sp = ojson::object();
    if (!sp.is_object()) throw ApiError(400, "'sampling_params' must be an object", "sampling_params");
    r.params = read_generation_params(sp, o.limits, "sampling_params.", "max_new_tokens");
    if (!sp.contains("max_new_tokens")) r.params.max_new_tokens = std::min<int64_t>(r.params.max_new_tokens, 128);
    r.params.logprobs = get_bool(body, "return_logprob").value_or(false);
    r.params.top_logprobs = static_cast<int>(get_int(body, "top_logprobs_num", 0, 20).value_or(0));
    try {
        r.constraint = grammar::constraint_from_sampling_params(json::parse(sp.dump()));
    } catch (const Error& e) {
        throw ApiError(400, e.what(), "sampling_params");
    }
    r.constraint_param = "sampling_params";
    if (r.constraint) {
        r.constraint_param += std::string(".") + grammar::constraint_kind_name(r.constraint->kind);
        if (r.constraint->kind == grammar::ConstraintKind::kJsonSchema && sp["json_schema"].is_object())
            r.constraint->text = sp["json_schema"].dump();
    }
    r.stream = get_bool(body, "stream").value_or(false);
    if (body.contains("rid") && body["rid"].is_string()) r.rid = body["rid"].get<std::string>();
    return r;
}

}  // namespace peregrine
