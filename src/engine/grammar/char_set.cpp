#include "engine/grammar/char_set.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace peregrine::grammar {

void CodepointSet::add(uint32_t lo, uint32_t hi) {
    if (lo > hi) return;
    // Fast paths: appending in increasing order (the common way sets are built).
    if (ranges_.empty() || lo > ranges_.back().second + 1) {
        if (ranges_.empty() || lo > ranges_.back().second) {
            ranges_.push_back({lo, hi});
            return;
        }
    }
    if (lo >= ranges_.back().first) {
        ranges_.back().second = std::max(ranges_.back().second, hi);
        return;
    }
    std::vector<std::pair<uint32_t, uint32_t>> out;
    out.reserve(ranges_.size() + 1);
    bool placed = false;
    for (auto [a, b] : ranges_) {
        if (b + 1 < lo) {
            out.push_back({a, b});
        } else if (hi + 1 < a) {
            if (!placed) out.push_back({lo, hi}), placed = true;
            out.push_back({a, b});
        } else {
            lo = std::min(lo, a);
            hi = std::max(hi, b);
        }
    }
    if (!placed) out.push_back({lo, hi});
    std::sort(out.begin(), out.end());
    ranges_ = std::move(out);
}

CodepointSet CodepointSet::complement() const { return any().minus(*this); }

CodepointSet CodepointSet::minus(const CodepointSet& o) const {
    CodepointSet r;
    for (auto [a, b] : ranges_) {
        uint32_t cur = a;
        bool done = false;
        for (auto [c, d] : o.ranges_) {
            if (d < cur) continue;
            if (c > b) break;
            if (c > cur) r.add(cur, c - 1);
            if (d >= b) { done = true; break; }
            cur = d + 1;
        }
        if (!done && cur <= b) r.add(cur, b);
    }
    return r;
}

bool CodepointSet::contains(uint32_t c) const {
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), std::make_pair(c, UINT32_MAX));
    if (it == ranges_.begin()) return false;
    --it;
    return c >= it->first && c <= it->second;
}

void append_utf8(std::string& out, uint32_t c) {
    if (c < 0x80) {
        out += char(c);
    } else if (c < 0x800) {
        out += char(0xC0 | (c >> 6));
        out += char(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        out += char(0xE0 | (c >> 12));
        out += char(0x80 | ((c >> 6) & 0x3F));
        out += char(0x80 | (c & 0x3F));
    } else {
        out += char(0xF0 | (c >> 18));
        out += char(0x80 | ((c >> 12) & 0x3F));
        out += char(0x80 | ((c >> 6) & 0x3F));
        out += char(0x80 | (c & 0x3F));
    }
}

uint32_t decode_utf8(const std::string& s, size_t& i) {
    auto b = [&](size_t k) -> uint32_t { return static_cast<uint8_t>(s[k]); };
    uint32_t c = b(i);
    int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    PEREGRINE_CHECK(n >= 0, "malformed UTF-8 in pattern at byte {}", i);
    if (n == 0) { ++i; return c; }
    PEREGRINE_CHECK(i + n < s.size(), "truncated UTF-8 in pattern at byte {}", i);
    c &= (0x3F >> n);
    for (int k = 1; k <= n; ++k) {
        PEREGRINE_CHECK((b(i + k) & 0xC0) == 0x80, "malformed UTF-8 in pattern at byte {}", i);
        c = (c << 6) | (b(i + k) & 0x3F);
    }
    i += n + 1;
    return c;
}

// Splits [lo, hi] until each piece has one encoding length and shares all but a suffix of full
// continuation ranges, the classic construction used by regex engines for UTF-8 automata.
static void split_utf8(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out) {
    static const uint32_t kMaxForLen[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (int n = 0; n < 3; ++n) {
        if (lo <= kMaxForLen[n] && hi > kMaxForLen[n]) {
            split_utf8(lo, kMaxForLen[n], out);
            split_utf8(kMaxForLen[n] + 1, hi, out);
            return;
        }
    }
    if (hi < 0x80) {
        out.push_back({{uint8_t(lo), uint8_t(hi)}});
        return;
    }
    for (int k = 1; k < 4; ++k) {
        uint32_t m = (1u << (6 * k)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                split_utf8(lo, lo | m, out);
                split_utf8((lo | m) + 1, hi, out);
                return;
            }
            if ((hi & m) != m) {
                split_utf8(lo, (hi & ~m) - 1, out);
                split_utf8(hi & ~m, hi, out);
                return;
            }
        }
    }
    std::string a, b;
    append_utf8(a, lo);
    append_utf8(b, hi);
    ByteRangeSeq seq;
    for (size_t i = 0; i < a.size(); ++i) seq.push_back({uint8_t(a[i]), uint8_t(b[i])});
    out.push_back(seq);
}

std::vector<ByteRangeSeq> utf8_sequences(uint32_t lo, uint32_t hi) {
    std::vector<ByteRangeSeq> out;
    if (lo <= hi) split_utf8(lo, hi, out);
    return out;
}

}  // namespace peregrine::grammar
