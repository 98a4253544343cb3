#pragma once
// Code points assigned after Unicode 14.0 (PCRE2 10.42's tables) for each general category, as
// Oniguruma (the engine of HF tokenizers) classifies them. See tools/gen_unicode_delta.py.
#include <string_view>

namespace peregrine {

// PCRE2 class-body text ("\x{1FA77}-\x{1FA7C}...") to append to \p{property}; "" if none.
const char* unicode_delta_ranges(std::string_view property);

}  // namespace peregrine
