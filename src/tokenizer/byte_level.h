#pragma once
// GPT-2's reversible byte <-> printable code point mapping used by byte-level BPE.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace peregrine {

// Code point that stands for byte b in byte-level token strings.
char32_t byte_to_char(uint8_t b);

// The byte a code point stands for, or -1 if it is not one of the 256 byte characters.
int char_to_byte(char32_t cp);

// Appends the byte-level form (UTF-8 of the mapped characters) of raw bytes.
void byte_level_encode(std::string_view raw, std::string& out);

// The ByteLevel decoder's rule for one token string: if every character is a byte character the
// token stands for those bytes; otherwise it stands for its own UTF-8 text.
std::string byte_level_decode_token(std::string_view token);

}  // namespace peregrine
