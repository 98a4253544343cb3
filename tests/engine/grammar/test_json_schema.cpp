// JSON Schema compiler: documents it must accept and reject, options, and named rejections.
#include <gtest/gtest.h>

#include "engine/grammar/json_schema.h"
#include "grammar_test_util.h"
#include "util/error.h"

using namespace peregrine;
using namespace peregrine::grammar;
using namespace peregrine::grammar::test;

namespace {

std::shared_ptr<const CompiledGrammar> schema(const char* text, JsonSchemaOptions o = {}) {
    return compile_bytes(json_schema_grammar(std::string(text), o));
}

}  // namespace

TEST(JsonSchema, ObjectsPropertiesRequiredAndOrder) {
    auto cg = schema(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
                         "c":{"type":"boolean"}},"required":["b"]})");
    for (auto* s : {R"({"b":"x"})", R"({"a":1,"b":""})", R"({ "a" : -3 , "b" : "q", "c" : true })",
                    "{\n  \"b\": \"\\n\\u00e9\\\"\",\n  \"c\": false\n}"})
        EXPECT_TRUE(accepts(cg, s)) << s;
    for (auto* s : {R"({})", R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x","d":1})", R"({"b":"x",})",
                    R"({"b":'x'})", R"({"b":"\ud800"})", "{\"b\":\"\x01\"}"})
        EXPECT_FALSE(accepts(cg, s)) << s;
}

TEST(JsonSchema, WhitespaceIsBounded) {
    JsonSchemaOptions o;
    o.max_whitespace = 3;
    auto cg = schema(R"({"type":"array","items":{"type":"integer"}})", o);
    EXPECT_TRUE(accepts(cg, "[1,   2]"));
    EXPECT_FALSE(accepts(cg, "[1,    2]"));
    JsonSchemaOptions compact;
    compact.any_whitespace = false;
    auto cc = schema(R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}}})", compact);
    EXPECT_TRUE(accepts(cc, R"({"a": [1, 2]})"));
    EXPECT_FALSE(accepts(cc, R"({"a":[1,2]})"));
}

TEST(JsonSchema, AdditionalPropertiesNeverRepeatListedKeys) {
    auto cg =
        schema(R"({"type":"object","properties":{"id":{"type":"integer"}},"additionalProperties":{"type":"string"}})");
    EXPECT_TRUE(accepts(cg, R"({"id":1,"idx":"a","i":"b"})"));
    EXPECT_TRUE(accepts(cg, R"({"other":"a"})"));
    EXPECT_FALSE(accepts(cg, R"({"id":1,"id":"a"})"));
    EXPECT_FALSE(accepts(cg, R"({"x":1})"));
    JsonSchemaOptions lax;
    lax.strict = false;
    auto open = schema(R"({"type":"object","properties":{"id":{"type":"integer"}}})", lax);
    EXPECT_TRUE(accepts(open, R"({"id":1,"more":[1,{"a":null}]})"));
    EXPECT_FALSE(accepts(schema(R"({"type":"object","properties":{"id":{"type":"integer"}}})"), R"({"id":1,"x":1})"));
    auto bare = schema(R"({"type":"object"})");
    EXPECT_TRUE(accepts(bare, R"({"k":[1,"x"],"j":{}})"));
    EXPECT_TRUE(accepts(bare, "{}"));
}

TEST(JsonSchema, ArraysEnumsConstsAndUnions) {
    auto arr = schema(R"({"type":"array","items":{"enum":["a",2,null,{"k":[true]}]},"minItems":1,"maxItems":3})");
    EXPECT_TRUE(accepts(arr, R"(["a",2])"));
    EXPECT_TRUE(accepts(arr, R"([{"k":[true]}])"));
    EXPECT_FALSE(accepts(arr, R"([])"));
    EXPECT_FALSE(accepts(arr, R"(["a","a","a","a"])"));
    EXPECT_FALSE(accepts(arr, R"(["b"])"));
    auto tup =
        schema(R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"items":false,"minItems":1})");
    EXPECT_TRUE(accepts(tup, R"([1])"));
    EXPECT_TRUE(accepts(tup, R"([1,"x"])"));
    EXPECT_FALSE(accepts(tup, R"([1,"x",2])"));
    EXPECT_FALSE(accepts(tup, R"(["x"])"));
    auto uni = schema(R"({"anyOf":[{"type":"integer","minimum":10},{"const":"none"},{"type":"null"}]})");
    EXPECT_TRUE(accepts(uni, "12"));
    EXPECT_TRUE(accepts(uni, R"("none")"));
    EXPECT_TRUE(accepts(uni, "null"));
    EXPECT_FALSE(accepts(uni, "9"));
    auto typed = schema(R"({"type":["string","null"],"maxLength":2})");
    EXPECT_TRUE(accepts(typed, R"("ab")"));
    EXPECT_TRUE(accepts(typed, "null"));
    EXPECT_FALSE(accepts(typed, R"("abc")"));
    EXPECT_TRUE(accepts(typed, R"("\u00e9\n")"));
}

TEST(JsonSchema, OneOfKeepsOnlyProvablyExclusiveAlternatives) {
    // Discriminated objects: both stay.
    auto disc = schema(
        R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}},"required":["kind"]},
                                    {"type":"object","properties":{"kind":{"const":"b"}},"required":["kind"]}]})");
    EXPECT_TRUE(accepts(disc, R"({"kind":"a","x":1})"));
    EXPECT_TRUE(accepts(disc, R"({"kind":"b"})"));
    // string / integer / number: integers would match both numeric alternatives, so only strings remain.
    auto mixed = schema(R"({"oneOf":[{"type":"string"},{"type":"integer"},{"type":"number"}]})");
    EXPECT_TRUE(accepts(mixed, R"("s")"));
    EXPECT_FALSE(accepts(mixed, "1"));
    EXPECT_FALSE(accepts(mixed, "1.5"));
    // Enums against enums and types; required keys one side never writes.
    auto en = schema(R"({"oneOf":[{"enum":["x","y"]},{"enum":["y","z"]},{"type":"boolean"}]})");
    EXPECT_FALSE(accepts(en, R"("y")"));
    EXPECT_TRUE(accepts(en, R"("x")"));
    EXPECT_TRUE(accepts(en, R"("z")"));
    EXPECT_TRUE(accepts(en, "true"));
    auto req = schema(R"({"oneOf":[{"properties":{"a":{"type":"integer"}},"required":["a"]},
                                   {"properties":{"b":{"type":"integer"}},"required":["b"]}]})");
    EXPECT_TRUE(accepts(req, R"({"a":1})"));
    EXPECT_TRUE(accepts(req, R"({"b":1})"));
    // Nothing provably exclusive: generated like anyOf.
    auto fallback = schema(R"({"oneOf":[{"type":"integer"},{"type":"number"}]})");
    EXPECT_TRUE(accepts(fallback, "1"));
}

TEST(JsonSchema, StringsPatternsAndFormats) {
    auto pat = schema(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})");
    EXPECT_TRUE(accepts(pat, R"("AB-123")"));
    EXPECT_FALSE(accepts(pat, R"("AB-1234")"));
    auto search = schema(R"({"type":"string","pattern":"ab"})");  // ECMA semantics: unanchored
    EXPECT_TRUE(accepts(search, R"("xxaby\"")"));
    EXPECT_FALSE(accepts(search, R"("a b")"));
    auto quote = schema(R"({"type":"string","pattern":"^a\"b$"})");
    EXPECT_TRUE(accepts(quote, R"("a\"b")"));
    auto date = schema(R"({"type":"string","format":"date"})");
    EXPECT_TRUE(accepts(date, R"("2024-02-28")"));
    EXPECT_FALSE(accepts(date, R"("2024-02-30")"));
    EXPECT_FALSE(accepts(date, R"("2024-13-01")"));
    auto uuid = schema(R"({"type":"string","format":"uuid"})");
    EXPECT_TRUE(accepts(uuid, R"("123e4567-e89b-12d3-a456-426614174000")"));
    auto ip = schema(R"({"type":"string","format":"ipv4"})");
    EXPECT_TRUE(accepts(ip, R"("192.168.0.255")"));
    EXPECT_FALSE(accepts(ip, R"("256.1.1.1")"));
    EXPECT_FALSE(accepts(ip, R"("01.1.1.1")"));
}

TEST(JsonSchema, FormatsUnderLengthBounds) {
    auto email = schema(R"({"type":"string","format":"email","maxLength":12})");
    EXPECT_TRUE(accepts(email, R"("ab@cd.com")"));
    EXPECT_FALSE(accepts(email, R"("abcd@efgh.com")"));  // 13 characters
    auto date = schema(R"({"type":"string","format":"date","maxLength":10})");
    EXPECT_TRUE(accepts(date, R"("2024-01-31")"));
    EXPECT_THROW(schema(R"({"type":"string","format":"date","maxLength":8})"), Error);
    EXPECT_THROW(schema(R"({"type":"string","format":"email","pattern":"x"})"), Error);
}

TEST(JsonSchema, RefsIncludingRecursion) {
    auto cg = schema(R"({"$defs":{"t":{"type":"object","properties":{"v":{"type":"integer"},
        "kids":{"type":"array","items":{"$ref":"#/$defs/t"}}},"required":["v"]}},
        "type":"object","properties":{"root":{"$ref":"#/$defs/t"}},"required":["root"]})");
    EXPECT_TRUE(accepts(cg, R"({"root":{"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]}})"));
    EXPECT_FALSE(accepts(cg, R"({"root":{"v":1,"kids":[{"kids":[]}]}})"));
    auto whole = schema(R"({"type":"object","properties":{"next":{"$ref":"#"}}})");
    EXPECT_TRUE(accepts(whole, R"({"next":{"next":{}}})"));
}

TEST(JsonSchema, TupleItemsRefSiblingsAndNullable) {
    auto tup = schema(
        R"({"type":"array","items":[{"type":"integer"},{"type":"boolean"}],"additionalItems":{"type":"string"}})");
    EXPECT_TRUE(accepts(tup, R"([1,true,"x","y"])"));
    EXPECT_FALSE(accepts(tup, R"([1,true,2])"));
    auto closed = schema(R"({"type":"array","items":[{"type":"integer"}],"additionalItems":false})");
    EXPECT_TRUE(accepts(closed, "[1]"));
    EXPECT_FALSE(accepts(closed, "[1,2]"));
    auto sib = schema(R"({"$defs":{"p":{"type":"object","properties":{"a":{"type":"integer"}}}},
                          "$ref":"#/$defs/p","required":["a"],"description":"x"})");
    EXPECT_TRUE(accepts(sib, R"({"a":1})"));
    EXPECT_FALSE(accepts(sib, "{}"));
    auto nul = schema(R"({"type":"string","nullable":true,"maxLength":2})");
    EXPECT_TRUE(accepts(nul, R"("ab")"));
}

TEST(JsonSchema, AllOfMergesCompatibleParts) {
    auto cg = schema(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                                  {"properties":{"b":{"type":"string"}},"required":["b"]}]})");
    EXPECT_TRUE(accepts(cg, R"({"a":1,"b":"x"})"));
    EXPECT_FALSE(accepts(cg, R"({"a":1})"));
}

TEST(JsonSchema, UnsupportedFeaturesAreNamed) {
    const char* cases[][2] = {
        {R"({"type":"object","patternProperties":{"x":{}}})", "patternProperties"},
        {R"({"not":{"type":"string"}})", "not"},
        {R"({"type":"array","uniqueItems":true})", "uniqueItems"},
        {R"({"if":{"type":"string"},"then":{"minLength":1}})", "if"},
        {R"({"type":"integer","multipleOf":3})", "multipleOf"},
        {R"({"type":"object","minProperties":1})", "minProperties"},
        {R"({"$ref":"http://example.com/s.json"})", "only local references"},
        {R"({"type":"string","pattern":"(a)\\1"})", "backreference"},
        {R"({"type":"object","properties":{"a":{"type":"array","contains":{"type":"integer"}}}})", "contains"},
        {R"({"allOf":[{"type":"string"},{"type":"integer"}]})", "allOf"},
    };
    for (auto& c : cases) {
        try {
            json_schema_grammar(std::string(c[0]));
            ADD_FAILURE() << c[0] << " compiled";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(c[1]), std::string::npos) << c[0] << ": " << e.what();
        }
    }
    EXPECT_THROW(json_schema_grammar(std::string("{not json")), Error);
    EXPECT_THROW(json_schema_grammar(std::string(R"({"type":"integer","minimum":5,"maximum":4})")), Error);
}

TEST(JsonSchema, AnyJsonObject) {
    auto cg = compile_bytes(json_object_grammar());
    for (auto* s : {"{}", R"({"a":[1,2.5e3,{"b":null}],"c":"\u1234"})", "{ \"x\" : { } }"})
        EXPECT_TRUE(accepts(cg, s)) << s;
    for (auto* s : {"[]", "1", R"({"a"})", R"({"a":01})", R"({"a":[1,]})"}) EXPECT_FALSE(accepts(cg, s)) << s;
}

// Inputs that recursed without bound: each is an error naming the cause, never a crash.
TEST(JsonSchema, DeepNestingAndSelfReferencesAreErrors) {
    auto error_of = [](const std::string& text) -> std::string {
        try {
            json_schema_grammar(text);
        } catch (const Error& e) {
            return e.what();
        }
        return "compiled";
    };
    // A $ref whose sibling keywords merge back into itself.
    for (const char* s : {R"({"$ref": "#", "minLength": 1})",
                          R"({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#"}}, "type": "string"})",
                          R"({"allOf": [{"$ref": "#"}], "maxLength": 3})"})
        EXPECT_NE(error_of(s).find("levels"), std::string::npos) << s << ": " << error_of(s);
    // 10,000 levels of items: refused before anything walks it.
    std::string deep;
    for (int i = 0; i < 10000; ++i) deep += R"({"type": "array", "items": )";
    deep += R"({"type": "string"})" + std::string(10000, '}');
    EXPECT_NE(error_of(deep).find("deeper than"), std::string::npos);
    // Within the bounds, nesting still compiles.
    std::string ok;
    for (int i = 0; i < 8; ++i) ok += R"({"type": "array", "items": )";
    ok += R"({"type": "string"})" + std::string(8, '}');
    EXPECT_EQ(error_of(ok), "compiled");
}

// Keywords of the wrong JSON type are the request's error naming the keyword (a 400), not an exception of the JSON
// library (a 500); found by tests/fuzz/fuzz_json_schema.
TEST(JsonSchema, WrongKeywordTypesAreNamed) {
    const std::pair<const char*, const char*> cases[] = {
        {R"({"type": 5})", "'type'"},
        {R"({"type": "string", "minLength": "x"})", "'minLength'"},
        {R"({"type": "string", "maxLength": -1})", "'maxLength'"},
        {R"({"type": "object", "properties": []})", "'properties'"},
        {R"({"type": "object", "properties": {"a": {}}, "required": [1]})", "'required'"},
        {R"({"$ref": 5})", "'$ref'"},
        {R"({"allOf": [{"pattern": 1}]})", "'pattern'"},
        {R"({"allOf": [5]})", "allOf"},
        {R"({"anyOf": [{"type": "integer", "minimum": "0"}]})", "'minimum'"},
        {R"({"$ref": "#/$defs/a/99999999999999999999", "$defs": {"a": [1]}})", "does not resolve"},
        // Read by the oneOf analysis before the alternative is compiled: directly, in a property, through a $ref.
        {R"({"oneOf": [{"const": {"a": [1, 2]}}, {"type": [{"type": "integer"}], "items": false}]})", "'type'"},
        {R"({"oneOf": [{"type": "object", "required": ["k"], "properties": {"k": {"const": 1}}},
                       {"type": "object", "required": ["k"], "properties": {"k": {"type": [1]}}}]})",
         "'type'"},
        {R"({"oneOf": [{"const": 1}, {"$ref": "#/$defs/a"}], "$defs": {"a": {"type": [{}]}}})", "'type'"},
    };
    for (auto [text, named] : cases) {
        try {
            json_schema_grammar(std::string(text));
            ADD_FAILURE() << text << " compiled";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << text << ": " << e.what();
        }
    }
    // Integral floats are counts too.
    EXPECT_NO_THROW(json_schema_grammar(std::string(R"({"type": "string", "maxLength": 3.0})")));
}
