#pragma once
// Token ids of a rendered prompt, as DeepSeek's encoder makes them: each special range is its token, the
// text between is encoded without the added vocabulary (so "<｜User｜>" typed by a user stays plain text).
#include "server/protocol/prompt_render.h"
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <vector>

namespace peregrine {

std::vector<int32_t> prompt_token_ids(const RenderedPrompt& p, const Tokenizer& tk);

}  // namespace peregrine
