#pragma once
// An OpenAI chat-completions request, parsed and validated. Errors carry the offending parameter so the
// server can answer with an OpenAI-shaped 400 ({"error": {"message", "type", "param", "code"}}).
#include "server/protocol/json_text.h"
#include "util/error.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine {

class RequestError : public Error {
public:
    RequestError(const std::string& message, std::string param) : Error(message), param_(std::move(param)) {}
    const std::string& param() const { return param_; }  // e.g. "messages[2].tool_call_id"; "" when none
    // {"error": {"message", "type": "invalid_request_error", "param", "code": "invalid_request_error"}}
    nlohmann::json to_openai_json() const;

private:
    std::string param_;
};

enum class Role { system, user, assistant, tool, latest_reminder };

struct ToolCallRecord {
    std::string id;
    std::string name;
    std::string arguments;  // as the client sent it: normally a JSON object in text
};

struct ChatMessage {
    Role role = Role::user;
    std::string content;                           // text parts joined by "\n\n"
    std::optional<std::string> reasoning_content;  // assistant only
    std::vector<ToolCallRecord> tool_calls;        // assistant only
    std::string tool_call_id;                      // tool only
    bool prefix = false;                           // last assistant message continued, not closed
};

struct ToolSpec {
    std::string name;
    std::optional<std::string> description;
    std::optional<ojson> parameters;  // absent when the client sent none
    bool strict = false;              // parameters already normalised for strict mode
};

enum class ToolChoiceMode { automatic, none, required, named };
struct ToolChoice {
    ToolChoiceMode mode = ToolChoiceMode::automatic;
    std::string name;  // named only
};

// Reasoning effort as both encodings need it: V4.1 writes a number 1-100, V4 knows three tiers.
enum class EffortTier { low, high, max };
struct ReasoningEffort {
    int value = 75;                    // V4.1 "Reasoning Effort: N"
    EffortTier tier = EffortTier::high;  // V4 prefix text
};

enum class ResponseFormatType { text, json_object, json_schema };
struct ResponseFormat {
    ResponseFormatType type = ResponseFormatType::text;
    ojson schema;  // json_schema only
};

struct ChatRequest {
    std::string model;
    std::vector<ChatMessage> messages;
    std::vector<ToolSpec> tools;  // as declared (tool_choice decides which reach the prompt)
    ToolChoice tool_choice;
    bool parallel_tool_calls = true;
    bool thinking = true;
    ReasoningEffort effort;  // meaningful when thinking
    ResponseFormat response_format;
    std::vector<std::string> stop;

    // Sampling and transport fields the server consumes.
    bool stream = false;
    bool include_usage = false;
    std::optional<int64_t> max_tokens;
    std::optional<double> temperature;
    std::optional<double> top_p;
    std::optional<int64_t> seed;
    int n = 1;
    bool logprobs = false;
    std::optional<int> top_logprobs;

    // The tools that the prompt lists and the parser accepts (none for tool_choice "none", one when named).
    std::vector<const ToolSpec*> prompt_tools() const;
};

struct RequestOptions {
    // A request that says nothing about thinking gets this: off, as `serve` (--enable-thinking) and `render`.
    bool default_thinking = false;
};

// Parses and validates; throws RequestError.
ChatRequest parse_chat_request(const ojson& body, const RequestOptions& opts = {});
ChatRequest parse_chat_request_text(std::string_view body_text, const RequestOptions& opts = {});

// Effort from an OpenAI/DeepSeek alias (none handled by the caller) or a number 1-100.
std::optional<ReasoningEffort> effort_from_alias(std::string_view alias);
ReasoningEffort effort_from_value(int value);

}  // namespace peregrine
