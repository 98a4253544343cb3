#pragma once
// The token vocabulary as the grammar engine sees it: each token id's bytes, which ids are special
// (never produced by a grammar) and which end the sequence (EOS: allowed once the grammar can end).
// Tokens are sorted by bytes into a trie so that masks are computed per shared prefix, not per token.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace peregrine::grammar {

class Vocabulary {
public:
    // token_bytes[id] = the token's decoded bytes (index = token id; size = the model's vocab size,
    // which fixes the bitmask width). Special ids never match grammar text; stop ids are EOS.
    Vocabulary(std::vector<std::string> token_bytes, const std::vector<int32_t>& special_ids,
               std::vector<int32_t> stop_ids);

    // Loads the text format written by tools/grammar/make_vocab.py (see docs/grammar.md).
    static std::shared_ptr<const Vocabulary> load(const std::string& path);

    int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
    int32_t mask_words() const { return (size() + 31) / 32; }
    const std::string& token_bytes(int32_t id) const { return bytes_[id]; }
    bool is_special(int32_t id) const { return special_[id]; }
    const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
    bool is_stop(int32_t id) const;

    // Trie over the non-special, non-empty tokens. Node 0 is the root (empty prefix). Tokens of a
    // node's subtree occupy sorted_[tok_begin, tok_end); those ending exactly at the node come first,
    // in [tok_begin, tok_end_here).
    struct TrieNode {
        int32_t child_begin, child_end;  // children are the nodes [child_begin, child_end)
        int32_t tok_begin, tok_end_here, tok_end;
        uint8_t byte;  // the edge byte from the parent
    };
    const std::vector<TrieNode>& trie() const { return trie_; }
    // Bytes occurring below a node (in any of its subtree's tokens after the node's prefix): lets the
    // mask precomputation accept a whole subtree at once when all of them loop in the current state.
    struct ByteSet {
        uint64_t w[4] = {0, 0, 0, 0};
        void add(uint8_t b) { w[b >> 6] |= uint64_t(1) << (b & 63); }
        bool subset_of(const ByteSet& o) const {
            return !(w[0] & ~o.w[0]) && !(w[1] & ~o.w[1]) && !(w[2] & ~o.w[2]) && !(w[3] & ~o.w[3]);
        }
    };
    const std::vector<ByteSet>& trie_below() const { return below_; }
    const std::vector<int32_t>& sorted_ids() const { return sorted_; }

private:
    std::vector<std::string> bytes_;
    std::vector<uint8_t> special_;
    std::vector<int32_t> stop_ids_;
    std::vector<int32_t> sorted_;
    std::vector<TrieNode> trie_;
    std::vector<ByteSet> below_;
};

}  // namespace peregrine::grammar
