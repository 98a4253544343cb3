#include "server/protocol/chat_request.h"
#include "util/json_depth.h"

#include <algorithm>
#include <cctype>
#include <set>

namespace peregrine {

nlohmann::json RequestError::to_openai_json() const {
    nlohmann::json e = {{"message", what()}, {"type", "invalid_request_error"}, {"code", "invalid_request_error"}};
    e["param"] = param_.empty() ? nlohmann::json(nullptr) : nlohmann::json(param_);
    return {{"error", e}};
}

[[noreturn]] static void bad(const std::string& param, const std::string& msg) { throw RequestError(msg, param); }

std::optional<ReasoningEffort> effort_from_alias(std::string_view a) {
    // DeepSeek's mapping (deepseek-recipe 0.2.0): minimal/low -> 50, medium/high/xhigh -> 75, ultra/max -> 100.
    if (a == "minimal" || a == "low") return ReasoningEffort{50, EffortTier::low};
    if (a == "medium" || a == "high" || a == "xhigh") return ReasoningEffort{75, EffortTier::high};
    if (a == "ultra" || a == "max") return ReasoningEffort{100, EffortTier::max};
    return std::nullopt;
}

ReasoningEffort effort_from_value(int v) {
    // V4.1 takes the number as is; V4 gets the nearest of its tiers (low=50, high=75, max=100).
    EffortTier t = v < 63 ? EffortTier::low : v < 88 ? EffortTier::high : EffortTier::max;
    return {v, t};
}

std::vector<const ToolSpec*> ChatRequest::prompt_tools() const {
    std::vector<const ToolSpec*> out;
    if (tool_choice.mode == ToolChoiceMode::none) return out;
    for (const auto& t : tools)
        if (tool_choice.mode != ToolChoiceMode::named || t.name == tool_choice.name) out.push_back(&t);
    return out;
}

namespace {

std::string type_name(const ojson& v) {
    switch (v.type()) {
    case ojson::value_t::null: return "null";
    case ojson::value_t::boolean: return "boolean";
    case ojson::value_t::string: return "string";
    case ojson::value_t::array: return "array";
    case ojson::value_t::object: return "object";
    case ojson::value_t::number_float: return "number";
    default: return "integer";
    }
}

const ojson* field(const ojson& obj, const char* key) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
}

std::string get_string(const ojson& obj, const char* key, const std::string& param, bool required) {
    const ojson* v = field(obj, key);
    if (!v) {
        if (required) bad(param, "missing required parameter '" + param + "'");
        return {};
    }
    if (!v->is_string()) bad(param, "'" + param + "' must be a string, got " + type_name(*v));
    return v->get<std::string>();
}

// Text content: a string, or an array of {"type": "text", "text": ...} parts joined by blank lines.
std::optional<std::string> get_content(const ojson& msg, const std::string& param) {
    const ojson* c = field(msg, "content");
    if (!c) return std::nullopt;
    if (c->is_string()) return c->get<std::string>();
    if (!c->is_array()) bad(param, "'" + param + "' must be a string or an array of content parts");
    std::string out;
    for (size_t i = 0; i < c->size(); ++i) {
        const ojson& part = (*c)[i];
        std::string p = param + "[" + std::to_string(i) + "]";
        if (!part.is_object()) bad(p, "content part must be an object");
        std::string type = get_string(part, "type", p + ".type", true);
        if (type != "text") bad(p + ".type", "unsupported content part type '" + type + "' (only text is supported)");
        if (i) out += "\n\n";
        out += get_string(part, "text", p + ".text", true);
    }
    return out;
}

// OpenAI strict mode: every object schema closes (additionalProperties false) and requires all its properties.
void normalize_strict(ojson& s, const std::string& param) {
    if (s.is_array()) {
        for (auto& e : s) normalize_strict(e, param);
        return;
    }
    if (!s.is_object()) return;
    for (const char* k : {"items", "not", "additionalItems"})
        if (s.contains(k)) normalize_strict(s[k], param);
    for (const char* k : {"anyOf", "oneOf", "allOf", "prefixItems"})
        if (s.contains(k)) normalize_strict(s[k], param);
    for (const char* k : {"$defs", "definitions"})
        if (s.contains(k) && s[k].is_object())
            for (auto& [name, sub] : s[k].items()) normalize_strict(sub, param);
    auto type = s.find("type");
    if (type == s.end() || *type != "object") return;
    if (!s.contains("properties")) s["properties"] = ojson::object();
    for (auto& [name, sub] : s["properties"].items()) normalize_strict(sub, param);
    if (s.contains("additionalProperties")) {
        if (s["additionalProperties"] == true) bad(param, "additionalProperties should not be true");
        s.erase("additionalProperties");
    }
    ojson keys = ojson::array();
    for (auto& [name, sub] : s["properties"].items()) keys.push_back(name);
    if (s.contains("required")) {
        std::set<std::string> want, got;
        for (auto& k : keys) want.insert(k.get<std::string>());
        if (s["required"].is_array())
            for (auto& k : s["required"])
                if (k.is_string()) got.insert(k.get<std::string>());
        if (want != got) bad(param, "Required properties must match all properties in the object");
        s.erase("required");
    }
    s["additionalProperties"] = false;
    s["required"] = keys;
}

ToolSpec parse_tool(const ojson& t, const std::string& param) {
    if (!t.is_object()) bad(param, "tool must be an object");
    std::string type = get_string(t, "type", param + ".type", false);
    if (!type.empty() && type != "function") bad(param + ".type", "unsupported tool type '" + type + "'");
    const ojson* f = field(t, "function");
    if (!f || !f->is_object()) bad(param + ".function", "missing required parameter '" + param + ".function'");
    ToolSpec spec;
    spec.name = get_string(*f, "name", param + ".function.name", true);
    if (spec.name.empty()) bad(param + ".function.name", "tool name must not be empty");
    if (const ojson* d = field(*f, "description")) {
        if (!d->is_string()) bad(param + ".function.description", "description must be a string");
        spec.description = d->get<std::string>();
    }
    if (const ojson* p = field(*f, "parameters")) {
        if (!p->is_object()) bad(param + ".function.parameters", "parameters must be a JSON Schema object");
        spec.parameters = *p;
    }
    if (const ojson* s = field(*f, "strict")) {
        if (!s->is_boolean()) bad(param + ".function.strict", "strict must be a boolean");
        spec.strict = s->get<bool>();
    }
    if (spec.strict) {
        if (!spec.parameters) spec.parameters = ojson::object({{"type", "object"}});
        normalize_strict(*spec.parameters, param + ".function.parameters");
    }
    return spec;
}

ChatMessage parse_message(const ojson& m, const std::string& param) {
    if (!m.is_object()) bad(param, "message must be an object");
    std::string role = get_string(m, "role", param + ".role", true);
    ChatMessage msg;
    if (role == "system" || role == "developer") msg.role = Role::system;  // developer is OpenAI's new name
    else if (role == "user") msg.role = Role::user;
    else if (role == "assistant") msg.role = Role::assistant;
    else if (role == "tool") msg.role = Role::tool;
    else if (role == "latest_reminder") msg.role = Role::latest_reminder;
    else bad(param + ".role", "unknown role '" + role + "'");
    auto content = get_content(m, param + ".content");
    msg.content = content.value_or("");
    if (msg.role == Role::assistant) {
        if (const ojson* r = field(m, "reasoning_content")) {
            if (!r->is_string()) bad(param + ".reasoning_content", "reasoning_content must be a string");
            msg.reasoning_content = r->get<std::string>();
        }
        if (const ojson* tcs = field(m, "tool_calls")) {
            if (!tcs->is_array()) bad(param + ".tool_calls", "tool_calls must be an array");
            for (size_t i = 0; i < tcs->size(); ++i) {
                std::string p = param + ".tool_calls[" + std::to_string(i) + "]";
                const ojson& tc = (*tcs)[i];
                if (!tc.is_object()) bad(p, "tool call must be an object");
                const ojson* f = field(tc, "function");
                if (!f || !f->is_object()) bad(p + ".function", "missing required parameter '" + p + ".function'");
                ToolCallRecord rec;
                rec.id = get_string(tc, "id", p + ".id", true);
                rec.name = get_string(*f, "name", p + ".function.name", true);
                const ojson* a = field(*f, "arguments");
                if (a && a->is_string()) rec.arguments = a->get<std::string>();
                else if (a && a->is_object()) rec.arguments = a->dump();
                else if (a) bad(p + ".function.arguments", "arguments must be a string");
                msg.tool_calls.push_back(std::move(rec));
            }
        }
        if (!content && msg.tool_calls.empty())
            bad(param + ".content", "Invalid assistant message: content or tool_calls must be set");
        if (const ojson* pf = field(m, "prefix")) {
            if (!pf->is_boolean()) bad(param + ".prefix", "prefix must be a boolean");
            msg.prefix = pf->get<bool>();
        }
    } else if (!content) {
        bad(param + ".content", "missing required parameter '" + param + ".content'");
    }
    if (msg.role == Role::tool) msg.tool_call_id = get_string(m, "tool_call_id", param + ".tool_call_id", true);
    return msg;
}

// Every assistant tool call is answered by the tool messages right after it, and no tool message answers nothing.
void check_tool_results(const std::vector<ChatMessage>& msgs) {
    for (size_t i = 0; i < msgs.size(); ++i) {
        if (msgs[i].role == Role::tool) {
            bad("messages[" + std::to_string(i) + "]",
                "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'");
        }
        if (msgs[i].role != Role::assistant || msgs[i].tool_calls.empty()) continue;
        std::set<std::string> want;
        for (auto& tc : msgs[i].tool_calls) want.insert(tc.id);
        size_t j = i + 1;
        std::vector<std::string> unknown;
        std::set<std::string> got;
        for (; j < msgs.size() && msgs[j].role == Role::tool; ++j) {
            if (!want.count(msgs[j].tool_call_id)) unknown.push_back(msgs[j].tool_call_id);
            got.insert(msgs[j].tool_call_id);
        }
        std::string p = "messages[" + std::to_string(i) + "]";
        if (!unknown.empty()) {
            std::string list;
            for (auto& u : unknown) list += (list.empty() ? "" : ", ") + u;
            bad(p, "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                   "'tool_call_id', The following tool_call_ids did not have response messages: " + list);
        }
        if (got != want)
            bad(p, "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                   "'tool_call_id'. (insufficient tool messages following tool_calls message)");
        i = j - 1;
    }
}

bool mentions_json(const std::vector<ChatMessage>& msgs) {
    for (auto& m : msgs) {
        std::string lower = m.content;
        std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
        if (lower.find("json") != std::string::npos) return true;
    }
    return false;
}

}  // namespace

ChatRequest parse_chat_request_text(std::string_view text, const RequestOptions& opts) {
    if (const char* problem = json_shape_problem(text)) bad("", std::string("request body ") + problem);
    ojson body = ojson::parse(text.begin(), text.end(), nullptr, false);
    if (body.is_discarded()) bad("", "request body is not valid JSON");
    return parse_chat_request(body, opts);
}

ChatRequest parse_chat_request(const ojson& body, const RequestOptions& opts) {
    if (!body.is_object()) bad("", "request body must be a JSON object");
    ChatRequest r;
    r.model = get_string(body, "model", "model", false);

    const ojson* msgs = field(body, "messages");
    if (!msgs) bad("messages", "missing required parameter 'messages'");
    if (!msgs->is_array()) bad("messages", "'messages' must be an array");
    if (msgs->empty()) bad("messages", "Empty input messages");
    for (size_t i = 0; i < msgs->size(); ++i)
        r.messages.push_back(parse_message((*msgs)[i], "messages[" + std::to_string(i) + "]"));
    for (size_t i = 0; i + 1 < r.messages.size(); ++i)
        if (r.messages[i].prefix)
            bad("messages[" + std::to_string(i) + "].prefix", "only the last message may be a prefix");
    check_tool_results(r.messages);

    if (const ojson* tools = field(body, "tools")) {
        if (!tools->is_array()) bad("tools", "'tools' must be an array");
        std::set<std::string> names;
        for (size_t i = 0; i < tools->size(); ++i) {
            r.tools.push_back(parse_tool((*tools)[i], "tools[" + std::to_string(i) + "]"));
            if (!names.insert(r.tools.back().name).second)
                bad("tools[" + std::to_string(i) + "].function.name",
                    "duplicate tool name '" + r.tools.back().name + "'");
        }
    }

    if (r.messages.back().prefix && !r.tools.empty())
        bad("messages[" + std::to_string(r.messages.size() - 1) + "].prefix",
            "Function call should not be used with prefix");

    // Thinking: the request's thinking object, else reasoning_effort "none" turns it off, else the default.
    r.thinking = opts.default_thinking;
    const ojson* th = field(body, "thinking");
    if (th) {
        if (!th->is_object()) bad("thinking", "'thinking' must be an object like {\"type\": \"enabled\"}");
        std::string type = get_string(*th, "type", "thinking.type", true);
        if (type == "enabled" || type == "adaptive") r.thinking = true;
        else if (type == "disabled") r.thinking = false;
        else bad("thinking.type", "unknown thinking type '" + type + "' (expected enabled, adaptive or disabled)");
    }
    if (const ojson* eff = field(body, "reasoning_effort")) {
        if (eff->is_string()) {
            std::string a = eff->get<std::string>();
            if (a == "none") {
                if (!th) r.thinking = false;  // an explicit thinking object wins
            }
            else if (auto e = effort_from_alias(a)) r.effort = *e;
            else
                bad("reasoning_effort",
                    "unknown reasoning_effort '" + a +
                        "' (expected none, minimal, low, medium, high, xhigh, ultra, max or 1-100)");
        } else if (eff->is_number_integer() || eff->is_number_unsigned()) {
            int64_t v = eff->get<int64_t>();
            if (v < 1 || v > 100) bad("reasoning_effort", "numeric reasoning_effort must be within 1-100");
            r.effort = effort_from_value(static_cast<int>(v));
        } else {
            bad("reasoning_effort", "reasoning_effort must be a string or an integer 1-100");
        }
    }

    if (const ojson* tc = field(body, "tool_choice")) {
        if (tc->is_string()) {
            std::string s = tc->get<std::string>();
            if (s == "auto") r.tool_choice.mode = ToolChoiceMode::automatic;
            else if (s == "none") r.tool_choice.mode = ToolChoiceMode::none;
            else if (s == "required") r.tool_choice.mode = ToolChoiceMode::required;
            else
                bad("tool_choice",
                    "unknown tool_choice '" + s + "' (expected auto, none, required or a named function)");
        } else if (tc->is_object()) {
            const ojson* f = field(*tc, "function");
            if (!f || !f->is_object())
                bad("tool_choice.function", "named tool_choice needs {\"function\": {\"name\": ...}}");
            r.tool_choice.mode = ToolChoiceMode::named;
            r.tool_choice.name = get_string(*f, "name", "tool_choice.function.name", true);
            bool found =
                std::any_of(r.tools.begin(), r.tools.end(), [&](auto& t) { return t.name == r.tool_choice.name; });
            if (!found)
                bad("tool_choice", "Invalid value for 'tool_call': no function named '" + r.tool_choice.name +
                                       "' was specified in the 'tools' parameter.");
        } else {
            bad("tool_choice", "tool_choice must be a string or an object");
        }
    }
    bool forced = r.tool_choice.mode == ToolChoiceMode::required || r.tool_choice.mode == ToolChoiceMode::named;
    if (forced) {
        if (r.tools.empty())
            bad("tool_choice", "tool_choice '" + std::string("required") + "' needs at least one tool");
        // The prompt opens the tool-call block after </think>, so there is no room for reasoning.
        if (r.thinking) bad("tool_choice", "Thinking mode does not support this tool_choice");
        for (const ToolSpec* t : r.prompt_tools()) {
            std::string got = "null";
            if (t->parameters && t->parameters->contains("type")) got = dump_prompt_json((*t->parameters)["type"]);
            if (t->parameters && got != "\"object\"")
                bad("tools", "Invalid schema for function '" + t->name +
                                 "': schema must be a JSON Schema of 'type: \"object\"', got 'type: " + got + "'.");
        }
    }
    if (const ojson* p = field(body, "parallel_tool_calls")) {
        if (!p->is_boolean()) bad("parallel_tool_calls", "parallel_tool_calls must be a boolean");
        r.parallel_tool_calls = p->get<bool>();
    }

    if (const ojson* rf = field(body, "response_format")) {
        if (!rf->is_object()) bad("response_format", "response_format must be an object");
        std::string type = get_string(*rf, "type", "response_format.type", true);
        if (type == "text") {
            r.response_format.type = ResponseFormatType::text;
        } else if (type == "json_object") {
            r.response_format.type = ResponseFormatType::json_object;
            if (!mentions_json(r.messages))
                bad("response_format",
                    "Prompt must contain the word 'json' in some form to use 'response_format' of type 'json_object'.");
        } else if (type == "json_schema") {
            const ojson* js = field(*rf, "json_schema");
            if (!js || !js->is_object())
                bad("response_format.json_schema", "missing required parameter 'response_format.json_schema'");
            const ojson* schema = field(*js, "schema");
            r.response_format.type = ResponseFormatType::json_schema;
            r.response_format.schema = schema ? *schema : ojson::object();
        } else {
            bad("response_format.type", "unknown response_format type '" + type + "'");
        }
    }

    if (const ojson* stop = field(body, "stop")) {
        if (stop->is_string()) r.stop.push_back(stop->get<std::string>());
        else if (stop->is_array()) {
            for (auto& s : *stop) {
                if (!s.is_string()) bad("stop", "stop must be a string or an array of strings");
                r.stop.push_back(s.get<std::string>());
            }
        } else bad("stop", "stop must be a string or an array of strings");
        std::erase(r.stop, std::string());
    }

    auto get_bool = [&](const char* key, bool& out) {
        if (const ojson* v = field(body, key)) {
            if (!v->is_boolean()) bad(key, std::string("'") + key + "' must be a boolean");
            out = v->get<bool>();
        }
    };
    auto get_number = [&](const char* key, std::optional<double>& out, double lo, double hi) {
        if (const ojson* v = field(body, key)) {
            if (!v->is_number()) bad(key, std::string("'") + key + "' must be a number");
            double d = v->get<double>();
            if (d < lo || d > hi) bad(key, fmt::format("'{}' must be within [{}, {}]", key, lo, hi));
            out = d;
        }
    };
    auto get_int = [&](const char* key, std::optional<int64_t>& out, int64_t lo) {
        if (const ojson* v = field(body, key)) {
            if (!v->is_number_integer() && !v->is_number_unsigned())
                bad(key, std::string("'") + key + "' must be an integer");
            int64_t i = v->get<int64_t>();
            if (i < lo) bad(key, fmt::format("'{}' must be at least {}", key, lo));
            out = i;
        }
    };
    get_bool("stream", r.stream);
    if (const ojson* so = field(body, "stream_options")) {
        if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
        if (const ojson* iu = field(*so, "include_usage")) {
            if (!iu->is_boolean()) bad("stream_options.include_usage", "'include_usage' must be a boolean");
            r.include_usage = iu->get<bool>();
        }
    }
    get_int("max_tokens", r.max_tokens, 1);
    if (!r.max_tokens) get_int("max_completion_tokens", r.max_tokens, 1);
    get_number("temperature", r.temperature, 0.0, 2.0);
    get_number("top_p", r.top_p, 0.0, 1.0);
    get_int("seed", r.seed, INT64_MIN);
    std::optional<int64_t> n;
    get_int("n", n, 1);
    if (n) r.n = static_cast<int>(std::min<int64_t>(*n, 128));
    get_bool("logprobs", r.logprobs);
    std::optional<int64_t> tl;
    get_int("top_logprobs", tl, 0);
    if (tl) {
        if (*tl > 20) bad("top_logprobs", "'top_logprobs' must be within [0, 20]");
        r.top_logprobs = static_cast<int>(*tl);
    }
    return r;
}

}  // namespace peregrine
