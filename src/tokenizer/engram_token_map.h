#pragma once
// Engram's compressed token map (DeepSeek-V4.1 spec §6.1): ids whose decoded text normalizes to the
// same key share one class; classes are numbered in first-seen id order.
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace peregrine {

struct EngramTokenMap {
    std::vector<int32_t> id_to_class;  // indexed by token id, [0, vocab_size)
    int32_t num_classes = 0;
};

// The key of one id: its decoded text normalized by NFKC, NFD, StripAccents, Lowercase, whitespace
// runs to " ", then Strip (a lone " " survives); the raw token text when decoding yields U+FFFD.
std::string engram_token_key(const Tokenizer& tok, int32_t id);

EngramTokenMap build_engram_token_map(const Tokenizer& tok);

}  // namespace peregrine
