#include "tokenizer/added_tokens.h"

#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

#include <utf8proc.h>

namespace peregrine {

namespace {
// Rust regex's Unicode \w: alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t cp) {
    if (cp == 0x200C || cp == 0x200D) return true;
    switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
        case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
        case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
        case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
        case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
            return true;
        default:
            return false;
    }
}

// Start of the code point that ends at `end` (end > 0).
size_t prev_cp_start(std::string_view s, size_t end) {
    size_t k = end - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    return k;
}

bool ends_with_word(std::string_view s, size_t end) {
    if (end == 0) return false;
    char32_t cp;
    utf8_decode(s, prev_cp_start(s, end), cp);
    return is_word_char(cp);
}

bool starts_with_word(std::string_view s, size_t begin) {
    if (begin >= s.size()) return false;
    char32_t cp;
    utf8_decode(s, begin, cp);
    return is_word_char(cp);
}
}  // namespace

void AddedTokenMatcher::build(std::vector<const AddedToken*> tokens, std::vector<std::string> patterns) {
    tokens_ = std::move(tokens);
    nodes_.assign(1, Node{});
    root_.fill(-1);
    for (size_t t = 0; t < tokens_.size(); ++t) {
        const std::string& p = patterns[t];
        if (p.empty()) continue;
        int32_t cur = 0;
        for (size_t i = 0; i < p.size(); ++i) {
            auto b = static_cast<uint8_t>(p[i]);
            int32_t nxt = -1;
            if (cur == 0) {
                nxt = root_[b];
            } else {
                for (auto& [c, n] : nodes_[cur].next)
                    if (c == b) nxt = n;
            }
            if (nxt < 0) {
                nxt = static_cast<int32_t>(nodes_.size());
                nodes_.push_back(Node{});
                if (cur == 0) root_[b] = nxt;
                else nodes_[cur].next.push_back({b, nxt});
            }
            cur = nxt;
        }
        if (nodes_[cur].terminal < 0) nodes_[cur].terminal = static_cast<int32_t>(t);  // first one wins
    }
}

int AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t& len) const {
    int32_t cur = root_[static_cast<uint8_t>(text[pos])];
    int best = -1;
    size_t i = pos + 1;
    while (cur >= 0) {
        if (nodes_[cur].terminal >= 0) {
            best = nodes_[cur].terminal;
            len = i - pos;
        }
        if (i >= text.size()) break;
        auto b = static_cast<uint8_t>(text[i]);
        int32_t nxt = -1;
        for (auto& [c, n] : nodes_[cur].next)
            if (c == b) { nxt = n; break; }
        cur = nxt;
        ++i;
    }
    return best;
}

void AddedTokenMatcher::find(std::string_view text, std::vector<TextSegment>& out) const {
    out.clear();
    size_t start_offset = 0;
    size_t pos = 0;
    while (!tokens_.empty() && pos < text.size()) {
        size_t len = 0;
        int t = root_[static_cast<uint8_t>(text[pos])] >= 0 ? longest_at(text, pos, len) : -1;
        if (t < 0) {
            ++pos;
            continue;
        }
        const AddedToken& tok = *tokens_[t];
        size_t start = pos, stop = pos + len;
        pos = stop;  // the scan resumes after the match even when the rules below reject it
        if (tok.single_word) {
            bool start_space = start == 0 || !ends_with_word(text, start);
            bool stop_space = stop == text.size() || !starts_with_word(text, stop);
            if (!start_space || !stop_space) continue;
        }
        if (tok.lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t k = prev_cp_start(text, ns);
                char32_t cp;
                utf8_decode(text, k, cp);
                if (!is_unicode_whitespace(cp)) break;
                ns = k;
            }
            start = std::max(ns, start_offset);
        }
        if (tok.rstrip) {
            while (stop < text.size()) {
                char32_t cp;
                size_t n = utf8_decode(text, stop, cp);
                if (!is_unicode_whitespace(cp)) break;
                stop += n;
            }
        }
        if (start_offset < start) out.push_back({start_offset, start, -1});
        out.push_back({start, stop, tok.id});
        start_offset = stop;
    }
    if (start_offset < text.size() || out.empty()) out.push_back({start_offset, text.size(), -1});
}

}  // namespace peregrine
