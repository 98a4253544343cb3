#pragma once
// EBNF constraints in a GBNF-style dialect (the one llama.cpp and xgrammar accept); see docs/grammar.md.
//   root ::= "{" ws pair (ws "," ws pair)* ws "}"     # rules: name ::= alternatives
//   pair ::= [a-z]+ ws ":" ws ("true" | "false")      # strings, [classes], [^negated], . (any char)
//   ws   ::= [ \t\n]{0,4}                             # * + ? {m} {m,} {m,n}, ( groups ), | alternation
// The start rule is `root`. Non-recursive rules are inlined into their callers (so the mask cache sees
// whole regular stretches); recursive ones become pushdown calls. Left recursion is rejected.
#include <string>

#include "engine/grammar/grammar.h"

namespace peregrine::grammar {

Grammar ebnf_grammar(const std::string& text, const std::string& root_rule = "root");

}  // namespace peregrine::grammar
