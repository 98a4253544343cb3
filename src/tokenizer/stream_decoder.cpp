#include "tokenizer/stream_decoder.h"

#include "tokenizer/utf8.h"

namespace peregrine {

std::string StreamDecoder::push(int32_t id) {
    // A generated id the tokenizer has no bytes for (a model vocabulary padded beyond the tokenizer's) adds no text.
    if (!tok_->is_valid(id) || (skip_special_ && tok_->is_special(id))) return {};
    pending_ += tok_->token_bytes(id);
    size_t n = utf8_complete_prefix(pending_);
    std::string out = pending_.substr(0, n);
    pending_.erase(0, n);
    return out;
}

std::string StreamDecoder::flush() {
    std::string out;
    out.swap(pending_);
    return out;
}

}  // namespace peregrine
