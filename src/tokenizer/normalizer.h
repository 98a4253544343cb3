#pragma once
// tokenizer.json "normalizer": the HF normalizers whose output a byte-level BPE tokenizer can use.
// Supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace, Prepend.
#include "tokenizer/regex.h"

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace peregrine {

class Normalizer {
public:
    Normalizer() = default;
    // Accepts null, an object, or a Sequence (nested sequences are flattened). Unknown types fail.
    static Normalizer from_json(const nlohmann::json& j);

    void add_nfkc() { steps_.push_back(make_step(Kind::NFKC)); }
    void add_nfd() { steps_.push_back(make_step(Kind::NFD)); }
    void add_strip_accents() { steps_.push_back(make_step(Kind::StripAccents)); }
    void add_lowercase() { steps_.push_back(make_step(Kind::Lowercase)); }
    void add_strip(bool left, bool right);
    void add_replace_regex(std::string_view pattern, std::string content);
    void add_replace_string(std::string_view literal, std::string content);

    bool identity() const { return steps_.empty(); }
    std::string apply(std::string_view s) const;

private:
    enum class Kind { NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace, Prepend };
    struct Step {
        Kind kind;
        bool left = false, right = false;
        std::shared_ptr<Regex> regex;
        std::string content;
    };
    static Step make_step(Kind k) {
        Step s;
        s.kind = k;
        return s;
    }
    static void parse_into(const nlohmann::json& j, Normalizer& n);
    std::vector<Step> steps_;
};

// Rust's char::is_whitespace (the Unicode White_Space property).
bool is_unicode_whitespace(char32_t cp);

}  // namespace peregrine
