#pragma once
// Turns parser events into OpenAI shapes: per-event chunk deltas for streaming, and the final assistant
// message for non-streaming. The final message is by construction the sum of the deltas.
#include "server/protocol/json_text.h"
#include "server/protocol/output_parser.h"

#include <string>
#include <vector>

namespace peregrine {

// The "delta" object of a chat.completion.chunk for one event; null for warnings (the server logs them).
ojson openai_delta(const ParseEvent& e);

class AssistantMessage {
public:
    // `with_reasoning`: whether the message carries reasoning_content (see reports_reasoning()).
    explicit AssistantMessage(bool with_reasoning) : thinking_(with_reasoning) {}
    void add(const ParseEvent& e);
    void add(const std::vector<ParseEvent>& events) {
        for (auto& e : events) add(e);
    }

    // {"role": "assistant", "content": "...", ["reasoning_content": "..."], ["tool_calls": [...]]}
    // (content is "" rather than null when only tool calls came back, as DeepSeek's API does).
    ojson to_openai_json() const;
    // "tool_calls" when the model called tools, else what the engine reported ("stop", "length"); also the
    // engine's when the output was cut inside the tool-call block (OutputParser::cut_in_block).
    std::string finish_reason(const std::string& engine_reason, bool cut_in_block = false) const;

    const std::string& content() const { return content_; }
    const std::string& reasoning() const { return reasoning_; }
    struct Call {
        std::string id, name, arguments;
    };
    const std::vector<Call>& tool_calls() const { return calls_; }
    const std::vector<std::string>& warnings() const { return warnings_; }

private:
    bool thinking_;
    std::string content_, reasoning_;
    std::vector<Call> calls_;
    std::vector<std::string> warnings_;
};

}  // namespace peregrine
