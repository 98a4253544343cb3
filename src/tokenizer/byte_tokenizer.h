#pragma once
// The tokenizer of models that have none: one token per byte (id = byte value), as a byte-level BPE
// without merges. Any text round-trips; a model with a vocabulary of at least 256 ids can be served
// with text prompts (the tiny test models are byte-level in this sense).
#include "tokenizer/tokenizer.h"

namespace peregrine {

// tokenizer.json text of the 256-byte tokenizer.
std::string byte_tokenizer_json();
Tokenizer byte_tokenizer();

}  // namespace peregrine
