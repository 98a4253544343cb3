#pragma once
// UTF-8 helpers: code point iteration, repair of invalid input, and completeness of a byte tail.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace peregrine {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if the bytes there are not one.
size_t utf8_valid_len(std::string_view s, size_t i);

// Decodes the code point at s[i] of a valid UTF-8 string; returns its byte length.
inline size_t utf8_decode(std::string_view s, size_t i, char32_t& cp) {
    auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) { cp = b; return 1; }
    if (b < 0xE0) { cp = ((b & 0x1F) << 6) | (s[i + 1] & 0x3F); return 2; }
    if (b < 0xF0) {
        cp = ((b & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
        return 3;
    }
    cp = ((b & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
    return 4;
}

void utf8_append(std::string& out, char32_t cp);

bool utf8_is_valid(std::string_view s);

// Replaces every maximal invalid subpart by U+FFFD, exactly as Python's
// bytes.decode("utf-8", errors="replace") and Rust's String::from_utf8_lossy do.
std::string utf8_repair(std::string_view s);

// Length of the longest prefix of `s` that ends on a code point boundary, holding back only a
// trailing sequence that is a valid but incomplete start of a code point (at most 3 bytes).
size_t utf8_complete_prefix(std::string_view s);

}  // namespace peregrine
