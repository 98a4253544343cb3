#pragma once
// Incremental detokenization: feed ids one at a time, get back only whole UTF-8 characters.
// The concatenation of every push() and the final flush() equals Tokenizer::decode of all ids.
#include "tokenizer/tokenizer.h"

namespace peregrine {

class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false) : tok_(&tok), skip_special_(skip_special) {}
    // Text completed by this id; an incomplete trailing character is held back until it completes
    // (bytes that can never complete are released at once). An id outside the tokenizer's vocabulary adds nothing.
    std::string push(int32_t id);
    // Whatever is still held back (an incomplete character at the end of the stream).
    std::string flush();

private:
    const Tokenizer* tok_;
    bool skip_special_;
    std::string pending_;
};

}  // namespace peregrine
