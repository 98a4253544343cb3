#pragma once
// Regular expressions (the common subset of Python `re` and ECMA-262) compiled into grammar fragments.
// Supported: literals and escapes, classes [...] / [^...], . \d \w \s \D \W \S, groups (...), (?:...),
// (?P<name>...), alternation, * + ? {m} {m,} {m,n} {,n} (lazy forms match the same language),
// ^ $ \A \Z at the start/end of top-level alternatives. Rejected with a named error: backreferences,
// lookaround, word boundaries, inline flags, possessive quantifiers.
// Class escapes are chosen so every generated string matches under both flavours: positive classes use
// their ASCII members, negated ones exclude the Unicode members too (so \D never yields a non-ASCII digit).
#include <functional>
#include <string>

#include "engine/grammar/builder.h"

namespace peregrine::grammar {

// Encodes "one code point from this set" as a byte fragment (raw UTF-8, or JSON string escaping).
using CharEncoder = std::function<Frag(GrammarBuilder&, const CodepointSet&)>;
Frag encode_utf8(GrammarBuilder& b, const CodepointSet& set);

enum class RegexMode {
    kFullMatch,  // the whole text must match (Python re.fullmatch; native `regex` constraints)
    kSearch,     // ECMA/JSON Schema `pattern`: a match anywhere unless anchored by ^ / $
};

Frag build_regex(GrammarBuilder& b, const std::string& pattern, RegexMode mode, const CharEncoder& enc);

// The grammar of a native regex constraint (full match over raw UTF-8 text).
Grammar regex_grammar(const std::string& pattern);

// Code point classes shared with the EBNF front end.
CodepointSet class_escape_set(char c);  // d D w W s S
CodepointSet dot_set();

}  // namespace peregrine::grammar
