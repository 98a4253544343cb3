#include "server/protocol/assistant_message.h"

#include "util/error.h"

namespace peregrine {

using json = ojson;  // keys in OpenAI's order: role, content, reasoning_content, tool_calls

json openai_delta(const ParseEvent& e) {
    switch (e.kind) {
    case ParseEvent::Kind::reasoning: return {{"reasoning_content", e.text}};
    case ParseEvent::Kind::content: return {{"content", e.text}};
    case ParseEvent::Kind::tool_call_start:
        return {{"tool_calls", json::array({{{"index", e.index}, {"id", e.id}, {"type", "function"},
                                             {"function", {{"name", e.text}, {"arguments", ""}}}}})}};
    case ParseEvent::Kind::tool_call_arguments:
        return {{"tool_calls", json::array({{{"index", e.index}, {"function", {{"arguments", e.text}}}}})}};
    case ParseEvent::Kind::warning: return nullptr;
    }
    return nullptr;
}

void AssistantMessage::add(const ParseEvent& e) {
    switch (e.kind) {
    case ParseEvent::Kind::reasoning: reasoning_ += e.text; break;
    case ParseEvent::Kind::content: content_ += e.text; break;
    case ParseEvent::Kind::tool_call_start:
        PEREGRINE_CHECK(e.index == static_cast<int>(calls_.size()), "tool call {} started out of order", e.index);
        calls_.push_back({e.id, e.text, ""});
        break;
    case ParseEvent::Kind::tool_call_arguments:
        PEREGRINE_CHECK(e.index >= 0 && e.index < static_cast<int>(calls_.size()), "arguments for unknown tool call {}",
                        e.index);
        calls_[e.index].arguments += e.text;
        break;
    case ParseEvent::Kind::warning: warnings_.push_back(e.text); break;
    }
}

json AssistantMessage::to_openai_json() const {
    json m = {{"role", "assistant"}, {"content", content_}};
    if (thinking_) m["reasoning_content"] = reasoning_;
    if (!calls_.empty()) {
        json calls = json::array();
        for (size_t i = 0; i < calls_.size(); ++i)
            calls.push_back({{"index", i}, {"id", calls_[i].id}, {"type", "function"},
                             {"function", {{"name", calls_[i].name}, {"arguments", calls_[i].arguments}}}});
        m["tool_calls"] = std::move(calls);
    }
    return m;
}

std::string AssistantMessage::finish_reason(const std::string& engine_reason, bool cut_in_block) const {
    return calls_.empty() || cut_in_block ? engine_reason : "tool_calls";
}

}  // namespace peregrine
