#pragma once
// Sets of Unicode code points as sorted, disjoint, inclusive ranges (regex/EBNF character classes).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace peregrine::grammar {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;

class CodepointSet {
public:
    CodepointSet() = default;
    static CodepointSet of(uint32_t lo, uint32_t hi) { CodepointSet s; s.add(lo, hi); return s; }
    static CodepointSet any() { return of(0, kMaxCodepoint).minus(of(0xD800, 0xDFFF)); }

    void add(uint32_t lo, uint32_t hi);
    void add(uint32_t c) { add(c, c); }
    void add(const CodepointSet& o) { for (auto [a, b] : o.ranges_) add(a, b); }
    // Every scalar value (surrogates excluded) not in this set.
    CodepointSet complement() const;
    CodepointSet minus(const CodepointSet& o) const;
    bool contains(uint32_t c) const;
    bool empty() const { return ranges_.empty(); }
    const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }

private:
    std::vector<std::pair<uint32_t, uint32_t>> ranges_;  // sorted, non-overlapping, non-adjacent
};

// Appends the UTF-8 encoding of c.
void append_utf8(std::string& out, uint32_t c);
// Decodes one code point at s[i], advancing i; fails on malformed UTF-8.
uint32_t decode_utf8(const std::string& s, size_t& i);

// A code point range as UTF-8 byte sequences: each entry is a list of per-byte [lo, hi] ranges; the
// concatenation of all sequences' languages is exactly the UTF-8 encodings of the range.
using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;
std::vector<ByteRangeSeq> utf8_sequences(uint32_t lo, uint32_t hi);

}  // namespace peregrine::grammar
