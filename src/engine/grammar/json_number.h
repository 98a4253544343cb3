#pragma once
// Regular expressions for JSON numbers within bounds (digit-by-digit range construction).
#include <optional>
#include <string>

namespace peregrine::grammar {

struct NumberBounds {
    std::optional<double> min, max;
    bool min_exclusive = false, max_exclusive = false;
};

// Integers in the bounds, written without leading zeros, at most 15 digits.
std::string integer_regex(const NumberBounds& b);
// Numbers in the bounds: integers plus fractions where every fraction of that integer part stays in
// bounds; an exponent only when unbounded.
std::string number_regex(const NumberBounds& b);

}  // namespace peregrine::grammar
