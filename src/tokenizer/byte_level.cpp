#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"


namespace peregrine {

namespace {
struct Tables {
    std::array<char32_t, 256> to_char{};
    std::array<int16_t, 0x144> to_byte;  // the mapped code points are all below U+0144
    Tables() {
        // Printable bytes keep their code point; the other 68 are shifted to 256, 257, ... in order.
        to_byte.fill(-1);
        char32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            to_char[b] = printable ? static_cast<char32_t>(b) : next++;
            to_byte[to_char[b]] = static_cast<int16_t>(b);
        }
    }
};
const Tables& tables() {
    static const Tables t;
    return t;
}
}  // namespace

char32_t byte_to_char(uint8_t b) { return tables().to_char[b]; }

int char_to_byte(char32_t cp) {
    return cp < 0x144 ? tables().to_byte[cp] : -1;
}

void byte_level_encode(std::string_view raw, std::string& out) {
    for (unsigned char b : raw) utf8_append(out, byte_to_char(b));
}

std::string byte_level_decode_token(std::string_view token) {
    std::string bytes;
    if (!utf8_is_valid(token)) return std::string(token);
    size_t i = 0;
    while (i < token.size()) {
        char32_t cp;
        i += utf8_decode(token, i, cp);
        int b = char_to_byte(cp);
        if (b < 0) return std::string(token);
        bytes.push_back(static_cast<char>(b));
    }
    return bytes;
}

}  // namespace peregrine
