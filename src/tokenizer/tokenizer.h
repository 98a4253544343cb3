#pragma once
// A HF tokenizer.json byte-level BPE tokenizer: normalizer, pre-tokenizer, BPE model, added tokens,
// ByteLevel decoder, post-processor. Encodes exactly as HF `tokenizers` does (see README in tests).
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine {

class Tokenizer {
public:
    static Tokenizer from_file(const std::string& path);
    // Reads DIR/tokenizer.json (and DIR/tokenizer_config.json for the BOS token, when present).
    static Tokenizer from_model_dir(const std::string& dir);
    static Tokenizer from_json_text(std::string_view json_text);

    // Ids of `text`. Invalid UTF-8 is first repaired (each maximal invalid subpart -> U+FFFD).
    // parse_special=false: added/special token strings are plain text (HF with no added tokens).
    // parse_special=true: every added token in the text is recognised, as HF's encode does.
    // add_special: apply the tokenizer.json post_processor (HF add_special_tokens=True).
    std::vector<int32_t> encode(std::string_view text, bool parse_special = false, bool add_special = false) const;

    // Concatenated token_bytes of the ids (byte-exact; no replacement of partial UTF-8).
    // skip_special drops tokens marked special. Unknown ids throw.
    std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

    // The raw bytes one id stands for (ByteLevel decoder rule), e.g. for grammar engines.
    const std::string& token_bytes(int32_t id) const;
    // The id whose token text (vocabulary or added-token content) is `token_text`, or -1.
    int32_t token_id(std::string_view token_text) const;
    // The token text of an id as tokenizer.json spells it ("Ġthe", "<｜User｜>").
    const std::string& token_text(int32_t id) const;
    // One past the largest id.
    int vocab_size() const { return static_cast<int>(token_text_.size()); }
    bool is_valid(int32_t id) const { return id >= 0 && id < vocab_size() && has_id_[id]; }
    bool is_special(int32_t id) const { return is_valid(id) && is_special_[id]; }
    bool is_added(int32_t id) const { return is_valid(id) && is_added_[id]; }
    // BOS id: tokenizer_config.json "bos_token" when loaded from a model dir, else the first special
    // token the post-processor adds; nullopt when neither is known.
    std::optional<int32_t> bos_id() const { return bos_id_; }
    const std::vector<AddedToken>& added_tokens() const { return added_; }

private:
    Tokenizer() = default;
    void encode_text(std::string_view normalized, std::vector<int32_t>& out) const;

    Normalizer normalizer_;
    PreTokenizer pre_tokenizer_;
    std::unique_ptr<BpeModel> model_;
    std::vector<AddedToken> added_;
    AddedTokenMatcher raw_matcher_, normalized_matcher_;

    std::vector<std::string> token_text_, token_bytes_;
    std::vector<uint8_t> has_id_, is_special_, is_added_;
    std::unordered_map<std::string, int32_t> text_to_id_;

    // Post-processor for add_special: ids before and after the sequence (TemplateProcessing single,
    // Bert/Roberta processing); `post_supported_` false means an unsupported one was given.
    std::vector<int32_t> post_prefix_, post_suffix_;
    bool post_supported_ = true;
    std::string post_type_;
    std::string decoder_type_;
    std::optional<int32_t> bos_id_;
};

}  // namespace peregrine
