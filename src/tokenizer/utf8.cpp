#include "tokenizer/utf8.h"

namespace peregrine {

namespace {
// Allowed range of the second byte for a lead byte (the Unicode "well-formed" table); 0 = bad lead.
struct LeadInfo {
    int len;
    unsigned char lo, hi;
};
inline LeadInfo lead_info(unsigned char b) {
    if (b < 0x80) return {1, 0, 0};
    if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
    if (b == 0xE0) return {3, 0xA0, 0xBF};
    if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
    if (b == 0xED) return {3, 0x80, 0x9F};
    if (b == 0xF0) return {4, 0x90, 0xBF};
    if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
    if (b == 0xF4) return {4, 0x80, 0x8F};
    return {0, 0, 0};
}

// Number of bytes at s[i] that form a valid (possibly incomplete) prefix of a sequence: the maximal
// subpart. `complete` says whether it is a whole code point.
inline size_t maximal_subpart(std::string_view s, size_t i, bool& complete) {
    auto b = static_cast<unsigned char>(s[i]);
    LeadInfo li = lead_info(b);
    complete = false;
    if (li.len == 0) return 1;
    if (li.len == 1) { complete = true; return 1; }
    size_t k = 1;
    for (; k < static_cast<size_t>(li.len); ++k) {
        if (i + k >= s.size()) return k;
        auto c = static_cast<unsigned char>(s[i + k]);
        unsigned char lo = k == 1 ? li.lo : 0x80, hi = k == 1 ? li.hi : 0xBF;
        if (c < lo || c > hi) return k;
    }
    complete = true;
    return k;
}
}  // namespace

size_t utf8_valid_len(std::string_view s, size_t i) {
    bool complete;
    size_t n = maximal_subpart(s, i, complete);
    return complete ? n : 0;
}

void utf8_append(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

bool utf8_is_valid(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        if (static_cast<unsigned char>(s[i]) < 0x80) { ++i; continue; }
        size_t n = utf8_valid_len(s, i);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

std::string utf8_repair(std::string_view s) {
    std::string out;
    out.reserve(s.size() + 8);
    size_t i = 0;
    while (i < s.size()) {
        bool complete;
        size_t n = maximal_subpart(s, i, complete);
        if (complete) out.append(s.data() + i, n);
        else out.append("\xEF\xBF\xBD");
        i += n;
    }
    return out;
}

size_t utf8_complete_prefix(std::string_view s) {
    // Only the last 3 bytes can be an incomplete start of a sequence.
    size_t start = s.size() > 3 ? s.size() - 3 : 0;
    for (size_t i = start; i < s.size(); ++i) {
        auto b = static_cast<unsigned char>(s[i]);
        if ((b & 0xC0) == 0x80) continue;  // continuation: belongs to an earlier lead
        bool complete;
        size_t n = maximal_subpart(s, i, complete);
        if (!complete && i + n == s.size() && lead_info(b).len > 1) return i;
    }
    return s.size();
}

}  // namespace peregrine
