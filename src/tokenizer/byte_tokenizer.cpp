#include "tokenizer/byte_tokenizer.h"
#include "tokenizer/byte_level.h"

#include <nlohmann/json.hpp>

namespace peregrine {

std::string byte_tokenizer_json() {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) {
        std::string text;
        byte_level_encode(std::string(1, static_cast<char>(b)), text);
        vocab[text] = b;
    }
    nlohmann::json j = {
        {"version", "1.0"},
        {"added_tokens", nlohmann::json::array()},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
        {"post_processor", nullptr},
        {"decoder",
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
    };
    return j.dump();
}

Tokenizer byte_tokenizer() { return Tokenizer::from_json_text(byte_tokenizer_json()); }

}  // namespace peregrine
