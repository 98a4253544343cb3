#pragma once
// Renders a chat request into the exact prompt text DeepSeek's encoder produces (V4.1 or V4), with the
// byte ranges that are special tokens: text between them is encoded without the added vocabulary, so a
// user who types "<｜User｜>" gets plain text, never a role token.
#include "server/protocol/chat_format.h"
#include "server/protocol/chat_request.h"

#include <string>
#include <utility>
#include <vector>

namespace peregrine {

struct RenderedPrompt {
    std::string text;
    std::vector<std::pair<size_t, size_t>> special_ranges;  // [begin, end) byte offsets, ascending
};

RenderedPrompt render_prompt(const ChatRequest& req, ChatFormat fmt);

// The DSML block of one assistant turn's tool calls, as the model wrote (or would have written) it,
// starting at "\n\n<｜DSML｜...". Used to re-encode history so agent loops hit the prefix cache.
std::string render_tool_calls(const std::vector<ToolCallRecord>& calls, ChatFormat fmt);

}  // namespace peregrine
