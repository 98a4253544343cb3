#include "tokenizer/pre_tokenizer.h"

#include "util/error.h"

#include <nlohmann/json.hpp>

namespace peregrine {

using json = nlohmann::json;

namespace {
const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Rust's Unicode \\w (Alphabetic, marks, decimal digits, connector punctuation, joiners).
const char* kRustWord = "\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}";
const char* kPunct = "[\\p{P}\\x{21}-\\x{2F}\\x{3A}-\\x{40}\\x{5B}-\\x{60}\\x{7B}-\\x{7E}]";

SplitBehavior parse_behavior(const std::string& b) {
    if (b == "Removed") return SplitBehavior::Removed;
    if (b == "Isolated") return SplitBehavior::Isolated;
    if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
    if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
    if (b == "Contiguous") return SplitBehavior::Contiguous;
    fail("tokenizer.json: unknown Split behavior '{}'", b);
}

struct Part {
    size_t b, e;
    bool flag;  // is_match before the behavior is applied, "remove" after
};

// HF NormalizedString::split: the pattern's matches and gaps cover the piece, then the behavior
// decides how matches join their neighbours; empty results are dropped.
void apply_behavior(std::vector<Part>& parts, SplitBehavior behavior) {
    std::vector<Part> out;
    out.reserve(parts.size());
    switch (behavior) {
        case SplitBehavior::Isolated:
            for (auto& p : parts) out.push_back({p.b, p.e, false});
            break;
        case SplitBehavior::Removed:
            out = parts;
            break;
        case SplitBehavior::Contiguous: {
            bool prev = false;
            for (auto& p : parts) {
                if (p.flag == prev && !out.empty()) out.back().e = p.e;
                else out.push_back({p.b, p.e, false});
                prev = p.flag;
            }
            break;
        }
        case SplitBehavior::MergedWithPrevious: {
            bool prev = false;
            for (auto& p : parts) {
                if (p.flag && !prev && !out.empty()) out.back().e = p.e;
                else out.push_back({p.b, p.e, false});
                prev = p.flag;
            }
            break;
        }
        case SplitBehavior::MergedWithNext: {
            bool prev = false;
            for (size_t k = parts.size(); k-- > 0;) {
                auto& p = parts[k];
                if (p.flag && !prev && !out.empty()) out.back().b = p.b;
                else out.push_back({p.b, p.e, false});
                prev = p.flag;
            }
            std::reverse(out.begin(), out.end());
            break;
        }
    }
    parts.swap(out);
}
}  // namespace

void PreTokenizer::parse_one(const json& j, bool last) {
    std::string type = j.value("type", "");
    PEREGRINE_CHECK(!byte_level_, "tokenizer.json: pre-tokenizers after ByteLevel are not supported");
    if (type == "Split") {
        auto& pat = j.at("pattern");
        std::shared_ptr<Regex> re;
        if (pat.contains("Regex")) {
            re = std::make_shared<Regex>(pat["Regex"].get<std::string>());
        } else if (pat.contains("String")) {
            std::string lit = pat["String"].get<std::string>();
            // An empty literal never matches (HF returns the whole piece as one non-match).
            re = std::make_shared<Regex>(lit.empty() ? std::string("(?!)") : Regex::escape_literal(lit));
        } else {
            fail("tokenizer.json: Split pattern must be String or Regex");
        }
        steps_.push_back({re, parse_behavior(j.at("behavior").get<std::string>()), j.value("invert", false)});
    } else if (type == "ByteLevel") {
        PEREGRINE_CHECK(last, "tokenizer.json: ByteLevel must be the last pre-tokenizer");
        bool prefix = j.value("add_prefix_space", false);
        if (j.value("use_regex", true)) {
            steps_.push_back({std::make_shared<Regex>(kGpt2Pattern), SplitBehavior::Isolated, false, prefix});
        } else if (prefix) {
            steps_.push_back({nullptr, SplitBehavior::Isolated, false, true});
        }
        byte_level_ = true;
    } else if (type == "Digits") {
        // char::is_numeric per character: one piece per digit, or runs of digits.
        add_internal(j.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+", SplitBehavior::Isolated, false);
    } else if (type == "Punctuation") {
        // ASCII punctuation or general category P, one character per match.
        add_internal(kPunct, parse_behavior(j.value("behavior", std::string("Isolated"))), false);
    } else if (type == "WhitespaceSplit") {
        add_internal("\\s+", SplitBehavior::Removed, false);
    } else if (type == "Whitespace") {
        // Rust regex \w+|[^\w\s]+, keeping the matches.
        add_internal("[" + std::string(kRustWord) + "]+|[^" + kRustWord + "\\s]+", SplitBehavior::Removed, true);
    } else if (type == "BertPreTokenizer") {
        add_internal("\\s+", SplitBehavior::Removed, false);
        add_internal(kPunct, SplitBehavior::Isolated, false);
    } else {
        fail("tokenizer.json: pre_tokenizer type '{}' is not supported (supported: Sequence, Split, ByteLevel, Digits, "
             "Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer)", type);
    }
}

void PreTokenizer::add_internal(const std::string& pattern, SplitBehavior behavior, bool invert) {
    steps_.push_back({std::make_shared<Regex>(pattern), behavior, invert});
}

PreTokenizer PreTokenizer::from_json(const json& j) {
    PreTokenizer p;
    if (j.is_null()) return p;
    if (j.value("type", "") == "Sequence") {
        auto& list = j.at("pretokenizers");
        for (size_t i = 0; i < list.size(); ++i) p.parse_one(list[i], i + 1 == list.size());
    } else {
        p.parse_one(j, true);
    }
    return p;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces,
                         std::deque<std::string>& storage) const {
    if (text.empty()) return;
    std::vector<std::string_view> cur{text}, next;
    std::vector<Span> matches;
    std::vector<Part> parts;
    for (auto& st : steps_) {
        next.clear();
        for (std::string_view piece : cur) {
            if (st.prefix_space && piece.front() != ' ') {
                storage.push_back(" ");
                storage.back().append(piece);
                piece = storage.back();
            }
            if (!st.regex) {
                next.push_back(piece);
                continue;
            }
            st.regex->find_all(piece, matches);
            if (st.behavior == SplitBehavior::Isolated) {  // the common case, without copies
                size_t prev = 0;
                for (auto& m : matches) {
                    if (m.begin > prev) next.push_back(piece.substr(prev, m.begin - prev));
                    if (m.end > m.begin) next.push_back(piece.substr(m.begin, m.end - m.begin));
                    prev = m.end;
                }
                if (prev < piece.size()) next.push_back(piece.substr(prev));
                continue;
            }
            parts.clear();
            size_t prev = 0;
            for (auto& m : matches) {
                if (m.begin != prev) parts.push_back({prev, m.begin, st.invert});
                parts.push_back({m.begin, m.end, !st.invert});
                prev = m.end;
            }
            if (prev != piece.size()) parts.push_back({prev, piece.size(), st.invert});
            apply_behavior(parts, st.behavior);
            for (auto& p : parts)
                if (!p.flag && p.e > p.b) next.push_back(piece.substr(p.b, p.e - p.b));
        }
        cur.swap(next);
    }
    pieces.insert(pieces.end(), cur.begin(), cur.end());
}

}  // namespace peregrine
