#pragma once
// tokenizer.json "pre_tokenizer": cuts normalized text into the pieces BPE runs on.
// Supported: Sequence of Split (Regex or String pattern, every behavior, invert), Digits,
// Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer, and ByteLevel (add_prefix_space,
// use_regex with GPT-2's pattern) as the last one.
#include "tokenizer/regex.h"

#include <deque>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine {

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizer {
public:
    static PreTokenizer from_json(const nlohmann::json& j);

    // Appends the pieces of `text` (views into `text` or into `storage`) to `pieces`.
    void split(std::string_view text, std::vector<std::string_view>& pieces,
               std::deque<std::string>& storage) const;

    // Whether pieces are mapped to byte-level characters before BPE.
    bool byte_level() const { return byte_level_; }

private:
    struct SplitStep {
        std::shared_ptr<Regex> regex;
        SplitBehavior behavior;
        bool invert;
        bool prefix_space = false;  // ByteLevel(add_prefix_space) runs before this step's split
    };
    void parse_one(const nlohmann::json& j, bool last);
    void add_internal(const std::string& pattern, SplitBehavior behavior, bool invert);
    std::vector<SplitStep> steps_;
    bool byte_level_ = false;
};

}  // namespace peregrine
