#include "engine/text_stream.h"

#include <algorithm>

namespace peregrine {

TextStream::TextStream(const Tokenizer* tok, std::vector<std::string> stop, bool skip_special)
    : stop_(std::move(stop)) {
    if (tok) dec_.emplace(*tok, skip_special);
    stop_.erase(std::remove(stop_.begin(), stop_.end(), std::string()), stop_.end());
}

std::string TextStream::push(int32_t id) {
    if (!dec_ || stopped_) return {};
    held_ += dec_->push(id);
    return release();
}

std::string TextStream::flush() {
    if (!dec_ || stopped_) return {};
    held_ += dec_->flush();
    std::string out = release();
    if (stopped_) return out;
    out += held_;
    held_.clear();
    return out;
}

std::string TextStream::release() {
    // The earliest complete stop string ends the text.
    size_t best = std::string::npos;
    for (const auto& s : stop_) {
        size_t at = held_.find(s);
        if (at != std::string::npos && (best == std::string::npos || at < best)) {
            best = at;
            matched_ = s;
        }
    }
    if (best != std::string::npos) {
        stopped_ = true;
        std::string out = held_.substr(0, best);
        held_.clear();
        return out;
    }
    // Hold back the longest tail that is a proper prefix of some stop string.
    size_t keep = 0;
    for (const auto& s : stop_) {
        for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
            if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
                keep = k;
                break;
            }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

}  // namespace peregrine
