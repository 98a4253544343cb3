#pragma once
// JSON Schema (and plain "any JSON object") compiled into a grammar. The generated text is always a
// JSON document that validates against the schema; where a keyword cannot be enforced exactly it is
// rejected with an error naming it rather than silently ignored. See docs/grammar.md for the subset.
#include <string>

#include <nlohmann/json.hpp>

#include "engine/grammar/grammar.h"

namespace peregrine::grammar {

struct JsonSchemaOptions {
    // Whitespace between JSON tokens: flexible (any of space, \t, \n, \r) but at most max_whitespace
    // characters per gap, so a model cannot loop on whitespace forever. When false the separators
    // below are used verbatim and no other whitespace is allowed.
    bool any_whitespace = true;
    int max_whitespace = 12;
    std::string item_separator = ", ";
    std::string key_separator = ": ";
    // Objects whose schema does not mention additionalProperties get no extra keys (the JSON Schema
    // default would allow them; omitting them keeps outputs valid and on-schema).
    bool strict = true;
};

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});
Grammar json_schema_grammar(const std::string& schema_text, const JsonSchemaOptions& options = {});
// Any JSON object (OpenAI response_format {"type": "json_object"}).
Grammar json_object_grammar(const JsonSchemaOptions& options = {});

}  // namespace peregrine::grammar
