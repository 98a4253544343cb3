#include "server/anthropic_api.h"

#include "server/api_error.h"
#include "util/json_depth.h"

#include <fmt/format.h>

namespace peregrine {

using ojson = nlohmann::ordered_json;

namespace {

[[noreturn]] void bad(const std::string& msg) { throw ApiError(400, msg); }

const ojson* field(const ojson& o, const char* key) {
    auto it = o.find(key);
    return it == o.end() || it->is_null() ? nullptr : &*it;
}

// A block's string / boolean field: absent gives the fallback, another type a 400 naming it (not a 500).
std::string text_field(const ojson& b, const char* key, const std::string& where) {
    const ojson* v = b.is_object() ? field(b, key) : nullptr;
    if (!v) return "";
    if (!v->is_string()) bad(where + "." + key + ": must be a string");
    return v->get<std::string>();
}
bool bool_field(const ojson& b, const char* key, const std::string& where) {
    const ojson* v = b.is_object() ? field(b, key) : nullptr;
    if (!v) return false;
    if (!v->is_boolean()) bad(where + "." + key + ": must be a boolean");
    return v->get<bool>();
}

// Text of a string or an array of {"type": "text", "text"} blocks (joined by blank lines).
std::string text_of(const ojson& c, const std::string& where) {
    if (c.is_string()) return c.get<std::string>();
    if (!c.is_array()) bad(where + ": content must be a string or an array of content blocks");
    std::string out;
    for (auto& b : c) {
        if (text_field(b, "type", where) != "text" || !b.contains("text") || !b["text"].is_string())
            bad(where + ": only text blocks are supported here");
        if (!out.empty()) out += "\n\n";
        out += b["text"].get<std::string>();
    }
    return out;
}

void convert_message(const ojson& m, size_t i, ojson& out) {
    const std::string where = fmt::format("messages.{}", i);
    if (!m.is_object()) bad(where + ": each message must be an object");
    const ojson* role = field(m, "role");
    if (!role || !role->is_string()) bad(where + ".role: required (user or assistant)");
    const ojson* content = field(m, "content");
    if (!content) bad(where + ".content: Field required");
    const std::string r = role->get<std::string>();
    if (r != "user" && r != "assistant") bad(where + ".role: must be 'user' or 'assistant', got '" + r + "'");
    if (content->is_string()) {
        out.push_back({{"role", r}, {"content", content->get<std::string>()}});
        return;
    }
    if (!content->is_array()) bad(where + ".content: must be a string or an array of content blocks");
    if (r == "assistant") {
        std::string text, thinking;
        bool has_thinking = false;
        ojson calls = ojson::array();
        for (size_t k = 0; k < content->size(); ++k) {
            const ojson& b = (*content)[k];
            const std::string bw = fmt::format("{}.content.{}", where, k);
            const std::string type = text_field(b, "type", bw);
            if (type == "text") {
                if (!text.empty()) text += "\n\n";
                text += text_field(b, "text", bw);
            } else if (type == "thinking") {
                thinking += text_field(b, "thinking", bw);
                has_thinking = true;
            } else if (type == "redacted_thinking") {
                continue;
            } else if (type == "tool_use") {
                if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") || !b["name"].is_string())
                    bad(bw + ": tool_use needs 'id' and 'name'");
                const ojson input = b.contains("input") ? b["input"] : ojson::object();
                if (!input.is_object()) bad(bw + ".input: must be an object");
                calls.push_back({{"id", b["id"]}, {"type", "function"},
                                 {"function", {{"name", b["name"]}, {"arguments", input.dump()}}}});
            } else {
                bad(bw + ": unsupported content block type '" + type + "' in an assistant message");
            }
        }
        ojson msg = {{"role", "assistant"}, {"content", text}};
        if (has_thinking) msg["reasoning_content"] = thinking;
        if (!calls.empty()) msg["tool_calls"] = calls;
        out.push_back(std::move(msg));
        return;
    }
    // User turn: tool results become tool messages (they answer the previous assistant turn's calls),
    // the rest one user message after them.
    std::string text;
    bool has_text = false;
    for (size_t k = 0; k < content->size(); ++k) {
        const ojson& b = (*content)[k];
        const std::string bw = fmt::format("{}.content.{}", where, k);
        const std::string type = text_field(b, "type", bw);
        if (type == "text") {
            if (has_text) text += "\n\n";
            text += text_field(b, "text", bw);
            has_text = true;
        } else if (type == "tool_result") {
            if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string()) bad(bw + ".tool_use_id: Field required");
            std::string result;
            if (const ojson* c = field(b, "content")) result = text_of(*c, bw + ".content");
            if (bool_field(b, "is_error", bw)) result = "Error: " + result;
            out.push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
        } else {
            bad(bw + ": unsupported content block type '" + type + "' (text and tool_result are supported)");
        }
    }
    if (has_text) out.push_back({{"role", "user"}, {"content", text}});
}

}  // namespace

const char* anthropic_error_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 529: return "overloaded_error";
    default: return "api_error";
    }
}

nlohmann::json anthropic_error_json(int status, const std::string& message) {
    return {{"type", "error"}, {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}};
}

ojson anthropic_to_chat_body(const ojson& body, bool count_only) {
    ojson out = ojson::object();
    if (const ojson* m = field(body, "model")) out["model"] = *m;
    ojson msgs = ojson::array();
    if (const ojson* sys = field(body, "system"))
        msgs.push_back({{"role", "system"}, {"content", text_of(*sys, "system")}});
    const ojson* ms = field(body, "messages");
    if (!ms) bad("messages: Field required");
    if (!ms->is_array() || ms->empty()) bad("messages: must be a non-empty array");
    for (size_t i = 0; i < ms->size(); ++i) convert_message((*ms)[i], i, msgs);
    out["messages"] = std::move(msgs);

    if (const ojson* tools = field(body, "tools")) {
        if (!tools->is_array()) bad("tools: must be an array");
        ojson ts = ojson::array();
        for (size_t i = 0; i < tools->size(); ++i) {
            const ojson& t = (*tools)[i];
            if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
                bad(fmt::format("tools.{}.name: Field required", i));
            const ojson* schema = field(t, "input_schema");
            if (!schema) bad(fmt::format("tools.{}.input_schema: Field required", i));
            ojson f = {{"name", t["name"]}};
            if (const ojson* d = field(t, "description")) f["description"] = *d;
            f["parameters"] = *schema;
            ts.push_back({{"type", "function"}, {"function", f}});
        }
        out["tools"] = std::move(ts);
    }
    if (const ojson* tc = field(body, "tool_choice")) {
        if (!tc->is_object() || !tc->contains("type") || !(*tc)["type"].is_string())
            bad("tool_choice: must be an object with a 'type' (auto, any, tool or none)");
        const std::string type = (*tc)["type"].get<std::string>();
        if (type == "auto") out["tool_choice"] = "auto";
        else if (type == "any") out["tool_choice"] = "required";
        else if (type == "none") out["tool_choice"] = "none";
        else if (type == "tool") {
            if (!tc->contains("name") || !(*tc)["name"].is_string()) bad("tool_choice.name: Field required");
            out["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*tc)["name"]}}}};
        } else bad("tool_choice.type: unknown tool_choice type '" + type + "'");
        if (tc->value("disable_parallel_tool_use", false)) out["parallel_tool_calls"] = false;
    }
    if (const ojson* th = field(body, "thinking")) {
        if (!th->is_object() || !th->contains("type") || !(*th)["type"].is_string())
            bad("thinking: must be an object with a 'type'");
        const std::string type = (*th)["type"].get<std::string>();
        if (type == "enabled") {
            const ojson* b = field(*th, "budget_tokens");
            if (!b || !b->is_number_integer()) bad("thinking.budget_tokens: Field required (an integer)");
            const int64_t budget = b->get<int64_t>();
            if (budget < 1024) bad("thinking.budget_tokens: Input should be greater than or equal to 1024");
            if (!count_only) {
                const ojson* mt = field(body, "max_tokens");
                if (mt && mt->is_number_integer() && budget >= mt->get<int64_t>())
                    bad("`max_tokens` must be greater than `thinking.budget_tokens`");
            }
            out["thinking"] = {{"type", "enabled"}};
            out["reasoning_effort"] = budget < 4096 ? "low" : budget < 32768 ? "high" : "max";
        } else if (type == "disabled") {
            out["thinking"] = {{"type", "disabled"}};
        } else if (type == "adaptive") {
            out["thinking"] = {{"type", "enabled"}};
        } else {
            bad("thinking.type: unknown thinking type '" + type + "' (expected enabled or disabled)");
        }
    }
    if (count_only) return out;

    const ojson* mt = field(body, "max_tokens");
    if (!mt) bad("max_tokens: Field required");
    if (!mt->is_number_integer() || mt->get<int64_t>() < 1) bad("max_tokens: must be an integer of at least 1");
    out["max_tokens"] = *mt;
    if (const ojson* ss = field(body, "stop_sequences")) {
        if (!ss->is_array()) bad("stop_sequences: must be an array of strings");
        for (auto& s : *ss)
            if (!s.is_string() || s.get<std::string>().empty()) bad("stop_sequences: must hold non-empty strings");
        if (!ss->empty()) out["stop"] = *ss;
    }
    if (const ojson* t = field(body, "temperature")) {
        if (!t->is_number() || t->get<double>() < 0.0 || t->get<double>() > 1.0)
            bad("temperature: must be a number within [0, 1]");
        out["temperature"] = *t;
    }
    for (const char* key : {"top_p", "top_k", "stream"})
        if (const ojson* v = field(body, key)) out[key] = *v;
    return out;
}

std::string sse_event(const std::string& name, const ojson& data) {
    return "event: " + name + "\ndata: " + data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

void AnthropicBlocks::open(Kind k, std::string* sse, const std::string& id, const std::string& name) {
    close(sse);
    blocks_.push_back({k, "", id, name});
    open_ = true;
    if (!sse) return;
    ojson cb;
    if (k == Kind::thinking) cb = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
    else if (k == Kind::text) cb = {{"type", "text"}, {"text", ""}};
    else cb = {{"type", "tool_use"}, {"id", id}, {"name", name}, {"input", ojson::object()}};
    *sse += sse_event("content_block_start",
                      {{"type", "content_block_start"}, {"index", blocks_.size() - 1}, {"content_block", cb}});
}

void AnthropicBlocks::close(std::string* sse) {
    if (!open_) return;
    open_ = false;
    if (sse) *sse += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", blocks_.size() - 1}});
}

void AnthropicBlocks::add(const ParseEvent& e, std::string* sse) {
    auto delta = [&](const ojson& d) {
        if (sse)
            *sse += sse_event("content_block_delta",
                              {{"type", "content_block_delta"}, {"index", blocks_.size() - 1}, {"delta", d}});
    };
    switch (e.kind) {
    case ParseEvent::Kind::reasoning:
    case ParseEvent::Kind::content: {
        if (e.text.empty()) return;
        const Kind k = e.kind == ParseEvent::Kind::reasoning ? Kind::thinking : Kind::text;
        if (!open_ || blocks_.back().kind != k) open(k, sse);
        blocks_.back().text += e.text;
        if (k == Kind::thinking) delta({{"type", "thinking_delta"}, {"thinking", e.text}});
        else delta({{"type", "text_delta"}, {"text", e.text}});
        return;
    }
    case ParseEvent::Kind::tool_call_start: open(Kind::tool_use, sse, e.id, e.text); return;
    case ParseEvent::Kind::tool_call_arguments:
        if (!open_ || blocks_.back().kind != Kind::tool_use || e.text.empty()) return;
        blocks_.back().text += e.text;
        delta({{"type", "input_json_delta"}, {"partial_json", e.text}});
        return;
    case ParseEvent::Kind::warning: return;
    }
}

bool AnthropicBlocks::has_tool_use() const {
    for (auto& b : blocks_)
        if (b.kind == Kind::tool_use) return true;
    return false;
}

ojson AnthropicBlocks::content() const {
    ojson out = ojson::array();
    for (auto& b : blocks_) {
        if (b.kind == Kind::thinking) out.push_back({{"type", "thinking"}, {"thinking", b.text}, {"signature", ""}});
        else if (b.kind == Kind::text) out.push_back({{"type", "text"}, {"text", b.text}});
        else {
            ojson input = b.text.empty() || json_shape_problem(b.text) ? ojson::object()
                                                                       : ojson::parse(b.text, nullptr, false);
            if (input.is_discarded() || !input.is_object()) input = ojson::object();
            out.push_back({{"type", "tool_use"}, {"id", b.id}, {"name", b.name}, {"input", input}});
        }
    }
    return out;
}

}  // namespace peregrine
