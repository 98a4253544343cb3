#pragma once
// Anthropic Messages API on top of the DeepSeek chat protocol: a /v1/messages body becomes the equivalent
// OpenAI chat body (so the one request parser and prompt renderer serve both APIs), and parser events
// become Anthropic content blocks (thinking, text, tool_use) or the SSE events that stream them.
#include "server/protocol/output_parser.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace peregrine {

// {"type": "error", "error": {"type", "message"}}, the type named after the HTTP status.
nlohmann::json anthropic_error_json(int status, const std::string& message);
const char* anthropic_error_type(int status);

// The OpenAI chat-completions body equivalent to an Anthropic messages body. `count_only`: a
// /v1/messages/count_tokens body (no max_tokens). Throws ApiError(400) naming the parameter.
// thinking {type: enabled, budget_tokens} maps to reasoning effort: < 4096 low, < 32768 high, else max.
nlohmann::ordered_json anthropic_to_chat_body(const nlohmann::ordered_json& body, bool count_only);

// Collects parser events into Anthropic content blocks, and (when `sse` is set) writes the streaming
// events for them as they arrive.
class AnthropicBlocks {
public:
    // Appends SSE text for each event ("event: NAME\ndata: JSON\n\n") to `sse` when it is not null.
    void add(const ParseEvent& e, std::string* sse);
    // Closes the open block (streaming).
    void close(std::string* sse);
    // The message's content array (tool_use inputs parsed into objects).
    nlohmann::ordered_json content() const;
    bool has_tool_use() const;

private:
    enum class Kind { none, thinking, text, tool_use };
    struct Block {
        Kind kind;
        std::string text;  // thinking / text, or tool_use input JSON text
        std::string id, name;
    };
    void open(Kind k, std::string* sse, const std::string& id = {}, const std::string& name = {});
    std::vector<Block> blocks_;
    bool open_ = false;
};

std::string sse_event(const std::string& name, const nlohmann::ordered_json& data);

}  // namespace peregrine
