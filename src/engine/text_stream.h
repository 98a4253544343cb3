#pragma once
// Turns a request's sampled ids into released text: incremental UTF-8 decoding, and stop strings that
// may be split across tokens (text that could still turn into a stop string is held back).
#include "tokenizer/stream_decoder.h"

#include <optional>
#include <string>
#include <vector>

namespace peregrine {

class TextStream {
public:
    // Without a tokenizer there is no text (ids only); stop strings then never match.
    TextStream(const Tokenizer* tok, std::vector<std::string> stop, bool skip_special);

    // Text released by this token. Sets stopped() (and matched()) when a stop string completed; the
    // text up to the match is released and nothing after it.
    std::string push(int32_t id);
    // Whatever is still held back (at the end of a request that did not stop on a string).
    std::string flush();

    bool stopped() const { return stopped_; }
    const std::string& matched() const { return matched_; }

private:
    std::string release();

    std::optional<StreamDecoder> dec_;
    std::vector<std::string> stop_;
    std::string held_;
    bool stopped_ = false;
    std::string matched_;
};

}  // namespace peregrine
