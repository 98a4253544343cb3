#include "engine/grammar/json_number.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "util/error.h"

namespace peregrine::grammar {

namespace {

constexpr int64_t kCap = 999999999999999;  // 15 digits: exact in a double, plenty for generation

bool all_of(const std::string& s, size_t from, char c) {
    for (size_t i = from; i < s.size(); ++i)
        if (s[i] != c) return false;
    return true;
}

// Numbers of the same length between a and b (decimal strings, no leading zeros except "0"). Only one
// bound is refined per level, so the pattern grows linearly with the length.
std::string same_length(const std::string& a, const std::string& b) {
    if (a == b) return a;
    size_t rest = a.size() - 1;
    auto any_digits = [&](char lo, char hi) {
        std::string r = "[" + std::string(1, lo) + "-" + std::string(1, hi) + "]";
        return rest ? r + "[0-9]{" + std::to_string(rest) + "}" : r;
    };
    bool low_full = all_of(a, 1, '0'), high_full = all_of(b, 1, '9');
    if (low_full && high_full) return any_digits(a[0], b[0]);
    if (a[0] == b[0]) return a.substr(0, 1) + "(" + same_length(a.substr(1), b.substr(1)) + ")";
    std::vector<std::string> alts;
    char mid_lo = a[0], mid_hi = b[0];
    if (!low_full) {
        alts.push_back(a.substr(0, 1) + "(" + same_length(a.substr(1), std::string(rest, '9')) + ")");
        ++mid_lo;
    }
    if (!high_full) --mid_hi;
    if (mid_lo <= mid_hi) alts.push_back(any_digits(mid_lo, mid_hi));
    if (!high_full) alts.push_back(b.substr(0, 1) + "(" + same_length(std::string(rest, '0'), b.substr(1)) + ")");
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? "|" : "") + alts[i];
    return out;
}

// Non-negative integers in [lo, hi], as a regex (empty string if the range is empty).
std::string range(int64_t lo, int64_t hi) {
    if (lo > hi) return "";
    std::vector<std::string> alts;
    int64_t p = 1;
    for (int len = 1; len <= 16; ++len, p *= 10) {
        int64_t a = std::max(lo, len == 1 ? int64_t(0) : p), b = std::min(hi, p * 10 - 1);
        if (a > b) continue;
        alts.push_back("(" + same_length(std::to_string(a), std::to_string(b)) + ")");
        if (p * 10 - 1 >= hi) break;
    }
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? "|" : "") + alts[i];
    return out;
}

int64_t clamp_floor(double x) { return x >= kCap ? kCap : x <= -kCap ? -kCap : static_cast<int64_t>(std::floor(x)); }
int64_t clamp_ceil(double x) { return x >= kCap ? kCap : x <= -kCap ? -kCap : static_cast<int64_t>(std::ceil(x)); }

// Smallest / largest integer inside the bounds.
int64_t int_lo(const NumberBounds& b) {
    if (!b.min) return -kCap;
    int64_t v = clamp_ceil(*b.min);
    if (b.min_exclusive && static_cast<double>(v) == *b.min) ++v;
    return v;
}
int64_t int_hi(const NumberBounds& b) {
    if (!b.max) return kCap;
    int64_t v = clamp_floor(*b.max);
    if (b.max_exclusive && static_cast<double>(v) == *b.max) --v;
    return v;
}

std::string signed_range(int64_t lo, int64_t hi) {
    std::vector<std::string> alts;
    if (hi >= 0 && lo <= hi) alts.push_back(range(std::max<int64_t>(lo, 0), hi));
    if (lo < 0 && lo <= hi) alts.push_back("-(" + range(std::max<int64_t>(1, -hi), -lo) + ")");
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? "|" : "") + alts[i];
    return out;
}

}  // namespace

std::string integer_regex(const NumberBounds& b) {
    if (!b.min && !b.max) return "-?(0|[1-9][0-9]{0,14})";
    int64_t lo = int_lo(b), hi = int_hi(b);
    PEREGRINE_CHECK(lo <= hi, "no integer satisfies the schema's minimum/maximum");
    return signed_range(lo, hi);
}

std::string number_regex(const NumberBounds& b) {
    const std::string frac = "\\.[0-9]{1,15}";
    if (!b.min && !b.max) return "-?(0|[1-9][0-9]{0,14})(" + frac + ")?([eE][+-]?[0-9]{1,2})?";
    std::vector<std::string> alts;
    int64_t lo = int_lo(b), hi = int_hi(b);
    if (lo <= hi) alts.push_back("(" + signed_range(lo, hi) + ")");
    // k.f with k >= 0 lies in [k, k+1): allowed when k is in bounds and k + 1 <= max.
    int64_t k_lo = std::max<int64_t>(0, lo);
    int64_t k_hi = b.max ? clamp_floor(*b.max - 1) : kCap;
    if (k_lo <= k_hi) alts.push_back("(" + range(k_lo, k_hi) + ")" + frac);
    // -m.f lies in (-(m+1), -m]: allowed when -(m+1) >= min and -m is in bounds (m >= 0).
    int64_t m_hi = b.min ? clamp_floor(-*b.min - 1) : kCap;
    int64_t m_lo = 0;
    if (b.max) {
        m_lo = std::max<int64_t>(0, clamp_ceil(-*b.max));
        if (b.max_exclusive && static_cast<double>(-m_lo) == *b.max) ++m_lo;
    }
    if (m_lo <= m_hi) alts.push_back("-(" + range(m_lo, m_hi) + ")" + frac);
    PEREGRINE_CHECK(!alts.empty(), "no number with at most 15 fraction digits satisfies the schema's bounds");
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? "|" : "") + alts[i];
    return out;
}

}  // namespace peregrine::grammar
