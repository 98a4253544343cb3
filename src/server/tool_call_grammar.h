#pragma once
// tool_choice "required" / a named function: the prompt already ends inside the DSML calls block, and this
// grammar makes the model write one or more DSML invokes of the allowed tools whose parameters are JSON
// values valid under the tool's parameter schema (string="false", so the parser reads them as JSON), then
// close the block. The protocol's OutputParser turns the text into tool_calls.
#include "engine/grammar/grammar.h"
#include "server/protocol/chat_format.h"
#include "server/protocol/chat_request.h"

#include <string>

namespace peregrine {

// Throws ApiError(400, param "tools") when a tool's parameters are not an object schema with properties
// (or absent), and peregrine::Error naming unsupported schema features.
std::string tool_call_grammar_key(const ChatRequest& req, ChatFormat fmt);
grammar::Grammar tool_call_grammar(const ChatRequest& req, ChatFormat fmt);

}  // namespace peregrine
