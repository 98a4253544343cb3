#pragma once
// What each POST route reads from its JSON body before any tokenizer, grammar compiler or engine work: the
// body parsed within its bounds, every field validated (ApiError 400 naming the field), the chat prompt
// rendered. api_server.cpp encodes, compiles and submits what these return; tests/fuzz calls them directly.
#include "engine/grammar/constraint.h"
#include "engine/request.h"
#include "server/protocol/chat_format.h"
#include "server/protocol/chat_request.h"
#include "server/protocol/prompt_render.h"
#include "server/request_params.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace peregrine {

struct RouteOptions {
    std::string served_model_name;
    ChatFormat chat_format = ChatFormat::deepseek_v41;
    bool default_thinking = false;
    ParamLimits limits;
};

// A JSON object body; invalid UTF-8, nesting or width past util/json_depth.h's bounds, malformed JSON and
// non-objects are 400s.
nlohmann::ordered_json parse_body(const std::string& body);

// 'model', when given and not empty, must name the served model.
void check_model(const nlohmann::ordered_json& body, const std::string& served_model_name);

// A prompt as given: text still to encode, or token ids (already checked against the vocabulary).
struct PromptInput {
    std::string text;
    std::vector<int32_t> ids;
    bool is_text() const { return ids.empty(); }
};

// POST /v1/completions
struct CompletionsRequest {
    std::vector<PromptInput> prompts;
    GenerationParams params;
    int n = 1;
    std::optional<grammar::ConstraintSpec> constraint;  // response_format
    bool stream = false, include_usage = false;
};
CompletionsRequest parse_completions_request(const std::string& body, const RouteOptions& o);

// POST /v1/chat/completions
struct ChatRouteRequest {
    ChatRequest req;
    RenderedPrompt prompt;
    GenerationParams params;
    int n = 1;
    std::optional<grammar::ConstraintSpec> constraint;  // response_format
};
ChatRouteRequest parse_chat_route_request(const std::string& body, const RouteOptions& o);

// POST /v1/messages (and /count_tokens with `count_only`, which reads no generation parameters)
struct MessagesRequest {
    ChatRequest req;
    RenderedPrompt prompt;
    nlohmann::ordered_json chat_body;  // the equivalent OpenAI chat body
    GenerationParams params;
};
MessagesRequest parse_messages_request(const std::string& body, const RouteOptions& o, bool count_only);

// POST /generate (SGLang's native shape)
struct GenerateRequest {
    PromptInput prompt;
    GenerationParams params;
    std::optional<grammar::ConstraintSpec> constraint;
    std::string constraint_param;  // "sampling_params[.regex|.ebnf|.json_schema]" for compile errors
    bool stream = false;
    std::optional<std::string> rid;
};
GenerateRequest parse_generate_request(const std::string& body, const RouteOptions& o);

}  // namespace peregrine
