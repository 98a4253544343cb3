#pragma once
// EBNF constraints in a GBNF-style dialect (the one llama.cpp and xgrammar accept); see docs/grammar.md.
//   root ::= "{" ws pair (ws "," ws pair)* ws "}"     # rules: name ::= alternatives
//   pair ::= [a-z]+ ws ":" ws ("true" | "false")      # strings, [classes], [^negated], . (any char)
//   ws   ::= [ \t\n]{0,4}                             # * + ? {m} {m,} {m,n}, ( groups ), | alternation
// The start rule is `root`. Non-recursive rules are inlined into their callers (so the mask cache sees
// whole regular stretches); recursive ones become pushdown calls. Left recursion is rejected.
#include <map>
#include <string>

#include "engine/grammar/grammar.h"
#include "engine/grammar/json_schema.h"

namespace peregrine::grammar {

// schema_rules: extra rules given as JSON Schemas (name -> schema text); a reference to one matches a JSON
// value valid under it, e.g. tool-call arguments inside a DSML tool-call grammar:
//   root ::= "<｜DSML｜ invoke name=\"get_weather\">" args "</｜DSML｜ invoke>"   with args -> {schema}
Grammar ebnf_grammar(const std::string& text, const std::string& root_rule = "root",
                     const std::map<std::string, std::string>& schema_rules = {},
                     const JsonSchemaOptions& schema_options = {});

}  // namespace peregrine::grammar
