#pragma once
// Added tokens of tokenizer.json and how HF tokenizers finds them in text: a leftmost-longest
// match over all contents, then the single_word / lstrip / rstrip rules of each token.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine {

struct AddedToken {
    int32_t id;
    std::string content;
    bool special = false, normalized = true, lstrip = false, rstrip = false, single_word = false;
};

// A part of a text: either plain text or one added token (token >= 0).
struct TextSegment {
    size_t begin, end;
    int32_t token = -1;
};

class AddedTokenMatcher {
public:
    // `patterns[i]` is what token `tokens[i]` matches (its content, normalized for normalized tokens).
    void build(std::vector<const AddedToken*> tokens, std::vector<std::string> patterns);
    bool empty() const { return tokens_.empty(); }
    // Segments covering `text` in order (HF AddedVocabulary::find_matches).
    void find(std::string_view text, std::vector<TextSegment>& out) const;

private:
    // Longest pattern starting at text[pos]: index into tokens_, or -1.
    int longest_at(std::string_view text, size_t pos, size_t& len) const;

    struct Node {
        std::vector<std::pair<uint8_t, int32_t>> next;
        int32_t terminal = -1;
    };
    std::vector<Node> nodes_;
    std::array<int32_t, 256> root_{};
    std::vector<const AddedToken*> tokens_;
};

}  // namespace peregrine
