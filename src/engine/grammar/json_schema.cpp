#include "engine/grammar/json_schema.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include "engine/grammar/budget.h"
#include "engine/grammar/builder.h"
#include "engine/grammar/json_number.h"
#include "engine/grammar/regex.h"
#include "util/error.h"
#include "util/json_depth.h"

namespace peregrine::grammar {

using ojson = nlohmann::ordered_json;

namespace {

// Keywords that never constrain the instance.
const std::set<std::string> kAnnotations = {
    "$schema", "$id", "$comment", "$anchor", "$vocabulary", "title", "description", "default", "examples",
    "deprecated", "readOnly", "writeOnly", "contentEncoding", "contentMediaType", "contentSchema", "$defs",
    "definitions", "example", "nullable", "discriminator", "xml", "externalDocs", "strict", "name"};
// Keywords whose constraint cannot be enforced by this compiler: rejected by name.
const std::set<std::string> kUnsupported = {
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "patternProperties",
    "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains",
    "minProperties", "maxProperties", "$dynamicRef", "$recursiveRef"};

[[noreturn]] void unsupported(const std::string& what, const std::string& where) {
    fail("unsupported JSON Schema feature: {} (at {})", what, where.empty() ? "#" : where);
}

// The JSON types of the keywords this compiler reads: a schema giving another type is refused naming the keyword
// (a 400), rather than ending in an exception of the JSON library.
void check_keyword_types(const ojson& s, const std::string& where) {
    auto all_strings = [](const ojson& v) {
        return v.is_array() && std::all_of(v.begin(), v.end(), [](const ojson& x) { return x.is_string(); });
    };
    auto schema = [](const ojson& v) { return v.is_object() || v.is_boolean(); };
    auto count = [](const ojson& v) {  // 5.0 is an integer too
        return v.is_number_unsigned() ||
               (v.is_number_float() && v.get<double>() >= 0 && v.get<double>() < 1e15 &&
                std::floor(v.get<double>()) == v.get<double>());
    };
    for (auto& [k, v] : s.items()) {
        const char* want = nullptr;
        if (k == "$ref" || k == "pattern" || k == "format") {
            if (!v.is_string()) want = "a string";
        } else if (k == "type") {
            if (!v.is_string() && !all_strings(v)) want = "a string or an array of strings";
        } else if (k == "required") {
            if (!all_strings(v)) want = "an array of strings";
        } else if (k == "properties" || k == "$defs" || k == "definitions") {
            if (!v.is_object()) want = "an object";
        } else if (k == "enum" || k == "allOf" || k == "anyOf" || k == "oneOf" || k == "prefixItems") {
            if (!v.is_array()) want = "an array";
        } else if (k == "minLength" || k == "maxLength" || k == "minItems" || k == "maxItems") {
            if (!count(v)) want = "a non-negative integer";
        } else if (k == "minimum" || k == "maximum" || k == "multipleOf") {
            if (!v.is_number()) want = "a number";
        } else if (k == "exclusiveMinimum" || k == "exclusiveMaximum") {
            if (!v.is_number() && !v.is_boolean()) want = "a number";
        } else if (k == "items") {
            if (!schema(v) && !v.is_array()) want = "a schema or an array of schemas";
        } else if (k == "additionalProperties" || k == "additionalItems") {
            if (!schema(v)) want = "a schema";
        } else if (k == "uniqueItems") {
            if (!v.is_boolean()) want = "a boolean";
        }
        if (want) fail("JSON Schema '{}' must be {} (at {})", k, want, where.empty() ? "#" : where);
    }
}

// check_keyword_types over every subschema, before anything reads one: the oneOf analysis looks into alternatives,
// their properties and what their $refs name before those are compiled (and checked there). The text's nesting is
// bounded (json_shape_problem), and so is this walk.
void check_schema_tree(const ojson& s, const std::string& where) {
    if (!s.is_object()) return;
    check_keyword_types(s, where);
    static const std::set<std::string> kMaps = {"properties", "$defs", "definitions", "patternProperties",
                                                "dependentSchemas"};
    static const std::set<std::string> kLists = {"anyOf", "oneOf", "allOf", "prefixItems", "items"};
    static const std::set<std::string> kOne = {"items", "additionalProperties", "additionalItems", "not", "contains",
                                               "if", "then", "else", "propertyNames", "unevaluatedItems",
                                               "unevaluatedProperties", "contentSchema"};
    for (auto& [k, v] : s.items()) {
        const std::string at = where + "/" + k;
        if (kMaps.count(k) && v.is_object()) {
            for (auto& [name, sub] : v.items()) check_schema_tree(sub, at + "/" + name);
        } else if (kLists.count(k) && v.is_array()) {
            for (size_t i = 0; i < v.size(); ++i) check_schema_tree(v[i], at + "/" + std::to_string(i));
        } else if (kOne.count(k)) {
            check_schema_tree(v, at);
        }
    }
}

// JSON string content: one character as JSON text would carry it (escaping what must be escaped).
Frag encode_json_chars(GrammarBuilder& b, const CodepointSet& set) {
    CodepointSet plain = set.minus(CodepointSet::of(0, 0x1F));
    CodepointSet special;
    special.add('"');
    special.add('\\');
    plain = plain.minus(special);
    std::vector<Frag> alts;
    if (!plain.empty()) alts.push_back(b.codepoints(plain));
    if (set.contains('"')) alts.push_back(b.literal("\\\""));
    if (set.contains('\\')) alts.push_back(b.literal("\\\\"));
    for (uint32_t c = 0; c < 0x20; ++c) {
        if (!set.contains(c)) continue;
        std::string esc;
        switch (c) {
            case '\b': esc = "\\b"; break;
            case '\f': esc = "\\f"; break;
            case '\n': esc = "\\n"; break;
            case '\r': esc = "\\r"; break;
            case '\t': esc = "\\t"; break;
            default: esc = fmt::format("\\u{:04x}", c);
        }
        alts.push_back(b.literal(esc));
    }
    PEREGRINE_CHECK(!alts.empty(), "empty character set in string pattern");
    return b.alt(alts);
}

class SchemaCompiler {
public:
    SchemaCompiler(const ojson& root, const JsonSchemaOptions& o) : root_(root), o_(o), b_(own_) {}
    SchemaCompiler(const ojson& root, const JsonSchemaOptions& o, GrammarBuilder& b) : root_(root), o_(o), b_(b) {}

    // The schema's value as a fragment of the caller's builder (rules it needs are added there).
    Frag fragment() {
        check_schema_tree(root_, "#");
        Frag f = value(root_, "#");
        finish_rules();
        return f;
    }

    Grammar build_schema() {
        check_schema_tree(root_, "#");
        int32_t r = b_.declare_rule("root");
        b_.set_body(r, b_.seq({ws(), value(root_, "#"), ws()}));
        finish_rules();
        return b_.build(r);
    }

    Grammar build_any_object() {
        int32_t r = b_.declare_rule("root");
        b_.set_body(r, b_.seq({ws(), generic_object(), ws()}));
        finish_rules();
        return b_.build(r);
    }

private:
    // ---- whitespace and small pieces ----
    Frag ws() {
        if (!o_.any_whitespace || o_.max_whitespace <= 0) return b_.empty();
        CodepointSet s;
        for (uint32_t c : {9u, 10u, 13u, 32u}) s.add(c);
        return b_.repeat(b_.codepoints(s), 0, o_.max_whitespace);
    }
    Frag item_sep() {
        return o_.any_whitespace ? b_.seq({ws(), b_.literal(","), ws()}) : b_.literal(o_.item_separator);
    }
    Frag key_sep() { return o_.any_whitespace ? b_.seq({ws(), b_.literal(":"), ws()}) : b_.literal(o_.key_separator); }
    Frag open(const char* c) { return b_.seq(b_.literal(c), ws()); }
    Frag close(const char* c) { return b_.seq(ws(), b_.literal(c)); }

    Frag json_char() {
        // Any character, escapes allowed; \u escapes exclude surrogates (lone ones are not text).
        std::vector<Frag> alts;
        alts.push_back(encode_json_chars(b_, CodepointSet::any()));
        for (const char* e : {"\\/"}) alts.push_back(b_.literal(e));
        CodepointSet hex = CodepointSet::of('0', '9');
        hex.add('a', 'f');
        hex.add('A', 'F');
        CodepointSet hex_no_d = hex.minus(CodepointSet::of('d', 'd')).minus(CodepointSet::of('D', 'D'));
        CodepointSet lo8;
        lo8.add('0', '7');
        alts.push_back(b_.seq({b_.literal("\\u"), b_.codepoints(hex_no_d), b_.codepoints(hex), b_.codepoints(hex),
                               b_.codepoints(hex)}));
        alts.push_back(b_.seq({b_.literal("\\u"), b_.codepoints(CodepointSet::of('d', 'd')), b_.codepoints(lo8),
                               b_.codepoints(hex), b_.codepoints(hex)}));
        alts.push_back(b_.seq({b_.literal("\\u"), b_.codepoints(CodepointSet::of('D', 'D')), b_.codepoints(lo8),
                               b_.codepoints(hex), b_.codepoints(hex)}));
        return b_.alt(alts);
    }

    Frag quoted(Frag content) { return b_.seq({b_.literal("\""), content, b_.literal("\"")}); }
    Frag regex(const std::string& re) { return build_regex(b_, re, RegexMode::kFullMatch, encode_utf8); }

    // ---- generic JSON (schema `true` / `{}`): one recursive rule ----
    int32_t any_rule() {
        if (any_rule_ >= 0) return any_rule_;
        any_rule_ = b_.declare_rule(b_.fresh_rule_name("json_value"));
        pending_any_ = true;
        return any_rule_;
    }
    Frag any_value() { return b_.call(any_rule()); }
    Frag generic_string() { return quoted(b_.star(json_char())); }
    Frag generic_object() {
        Frag member = b_.seq({generic_string(), key_sep(), any_value()});
        Frag more = b_.star(b_.seq(item_sep(), b_.seq({generic_string(), key_sep(), any_value()})));
        Frag members = b_.optional(b_.seq({member, more, ws()}));
        return b_.seq({open("{"), members, b_.literal("}")});
    }
    Frag generic_array() {
        Frag items = b_.optional(b_.seq({any_value(), b_.star(b_.seq(item_sep(), any_value())), ws()}));
        return b_.seq({open("["), items, b_.literal("]")});
    }
    Frag generic_value() {
        return b_.alt({generic_object(), generic_array(), generic_string(), regex(number_regex({})), b_.literal("true"),
                       b_.literal("false"), b_.literal("null")});
    }

    // ---- $ref ----
    const ojson& resolve(const std::string& ref, const std::string& where) {
        if (ref == "#") return root_;
        if (ref.rfind("#/", 0) != 0) unsupported("$ref '" + ref + "' (only local references)", where);
        const ojson* cur = &root_;
        size_t pos = 2;
        while (pos <= ref.size()) {
            size_t next = ref.find('/', pos);
            if (next == std::string::npos) next = ref.size();
            std::string tok = ref.substr(pos, next - pos);
            for (size_t i; (i = tok.find("~1")) != std::string::npos;) tok.replace(i, 2, "/");
            for (size_t i; (i = tok.find("~0")) != std::string::npos;) tok.replace(i, 2, "~");
            for (size_t i; (i = tok.find("%25")) != std::string::npos;) tok.replace(i, 3, "%");
            if (cur->is_object() && cur->contains(tok)) cur = &(*cur)[tok];
            else if (cur->is_array() && !tok.empty() && tok.size() < 10 &&
                     std::all_of(tok.begin(), tok.end(), ::isdigit) && std::stoul(tok) < cur->size())
                cur = &(*cur)[std::stoul(tok)];
            else fail("JSON Schema $ref '{}' does not resolve (at {})", ref, where);
            pos = next + 1;
        }
        return *cur;
    }

    Frag ref_value(const std::string& ref, const std::string& where) {
        auto it = ref_rules_.find(ref);
        if (it != ref_rules_.end()) return b_.call(it->second);
        if (expanding_.count(ref)) {
            // Recursive reference: becomes a pushdown rule, its body emitted after the current pass.
            std::string name = "ref";
            for (char c : ref.substr(1)) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
            int32_t id = b_.declare_rule(b_.fresh_rule_name(name));
            ref_rules_[ref] = id;
            pending_refs_.push_back(ref);
            return b_.call(id);
        }
        expanding_.insert(ref);
        Frag f = value(resolve(ref, where), ref);
        expanding_.erase(ref);
        return f;
    }

    void finish_rules() {
        while (!pending_refs_.empty() || pending_any_) {
            if (pending_any_) {
                pending_any_ = false;
                b_.set_body(any_rule_, generic_value());
            }
            while (!pending_refs_.empty()) {
                std::string ref = pending_refs_.back();
                pending_refs_.pop_back();
                expanding_.insert(ref);
                b_.set_body(ref_rules_[ref], value(resolve(ref, ref), ref));
                expanding_.erase(ref);
            }
        }
    }

    // ---- schema composition ----
    static bool is_type(const ojson& v, const std::string& t) {
        if (t == "string") return v.is_string();
        if (t == "integer")
            return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
        if (t == "number") return v.is_number();
        if (t == "boolean") return v.is_boolean();
        if (t == "null") return v.is_null();
        if (t == "object") return v.is_object();
        if (t == "array") return v.is_array();
        return false;
    }

    // Merges allOf parts into one schema when they do not constrain the same keyword differently.
    ojson merge_all_of(const ojson& s, const std::string& where) {
        NestingLevel level(depth_, [&] {
            fail("JSON Schema allOf nests deeper than {} levels (at {})", kMaxNesting, where.substr(0, 200));
        });
        ojson out = s;
        out.erase("allOf");
        for (const ojson& part_in : s["allOf"]) {
            if (part_in.is_object()) check_keyword_types(part_in, where);
            ojson part = part_in;
            if (part.is_object() && part.contains("$ref")) part = resolve(part["$ref"].get<std::string>(), where);
            if (!part.is_object() && !part.is_boolean()) fail("JSON Schema allOf part is not a schema (at {})", where);
            if (part.is_object()) check_keyword_types(part, where);
            if (part.is_boolean()) {
                if (!part.get<bool>()) fail("JSON Schema allOf contains false: no value is valid (at {})", where);
                continue;
            }
            if (part.contains("allOf")) part = merge_all_of(part, where);
            for (auto& [k, v] : part.items()) {
                if (kAnnotations.count(k)) continue;
                if (k == "properties" && out.contains("properties")) {
                    for (auto& [pk, pv] : v.items()) {
                        if (out["properties"].contains(pk) && out["properties"][pk] != pv)
                            unsupported("allOf with conflicting definitions of property '" + pk + "'", where);
                        out["properties"][pk] = pv;
                    }
                } else if (k == "required" && out.contains("required")) {
                    for (auto& r : v)
                        if (std::find(out["required"].begin(), out["required"].end(), r) == out["required"].end())
                            out["required"].push_back(r);
                } else if (out.contains(k) && out[k] != v) {
                    unsupported("allOf combining different '" + k + "' constraints", where);
                } else {
                    out[k] = v;
                }
            }
        }
        return out;
    }

    Frag value(const ojson& schema_in, const std::string& where) {
        // Deep schemas, and a $ref whose sibling keywords lead back to itself ({"$ref": "#", "minLength": 1}),
        // end here rather than in the stack.
        NestingLevel level(depth_, [&] {
            fail("JSON Schema nests deeper than {} levels, or a $ref leads back to itself (at {})", kMaxNesting,
                 where.substr(0, 200));
        });
        poll_budget();
        if (schema_in.is_boolean()) {
            if (!schema_in.get<bool>()) fail("JSON Schema 'false' admits no value (at {})", where);
            return any_value();
        }
        if (!schema_in.is_object()) fail("JSON Schema at {} is not an object or boolean", where);
        check_keyword_types(schema_in, where);
        ojson schema = schema_in;
        if (schema.contains("allOf")) schema = merge_all_of(schema, where);
        for (auto& [k, v] : schema.items()) {
            if (kUnsupported.count(k)) unsupported(k, where);
            if (k == "uniqueItems" && v.is_boolean() && v.get<bool>()) unsupported("uniqueItems", where);
            if (k == "multipleOf" && !(v.is_number() && v.get<double>() == 1.0))
                unsupported("multipleOf (other than 1)", where);
        }
        if (schema.contains("$ref")) {
            ojson siblings = ojson::object();
            for (auto& [k, v] : schema.items())
                if (k != "$ref" && !kAnnotations.count(k)) siblings[k] = v;
            if (siblings.empty()) return ref_value(schema["$ref"].get<std::string>(), where);
            // Keywords beside $ref apply too (draft 2019+): merge them with the target like allOf.
            ojson both = {{"allOf", ojson::array({ojson{{"$ref", schema["$ref"]}}, siblings})}};
            return value(both, where);
        }
        for (const char* key : {"anyOf", "oneOf"}) {
            if (!schema.contains(key)) continue;
            const ojson& alts_in = schema[key];
            if (!alts_in.is_array() || alts_in.empty())
                fail("JSON Schema {} must be a non-empty array (at {})", key, where);
            ojson base = schema;
            base.erase(key);
            bool base_constrains = false;
            for (auto& [k, v] : base.items())
                if (!kAnnotations.count(k)) base_constrains = true;
            // oneOf: keep the alternatives whose outputs provably fail every other alternative, so an
            // output matches exactly one; when none can be shown exclusive, generate like anyOf.
            std::vector<size_t> keep;
            std::map<size_t, ojson> narrowed;  // literal alternatives reduced to their exclusive values
            if (std::string(key) == "oneOf") {
                std::vector<ojson> analysed;
                for (const ojson& a : alts_in)
                    analysed.push_back(base_constrains ? merge_all_of({{"allOf", ojson::array({base, a})}}, where)
                                                       : deref(a));
                for (size_t i = 0; i < analysed.size(); ++i) {
                    bool exclusive = true;
                    for (size_t j = 0; j < analysed.size() && exclusive; ++j)
                        if (i != j) exclusive = excludes(analysed[i], analysed[j], 0);
                    if (exclusive) {
                        keep.push_back(i);
                        continue;
                    }
                    // A literal alternative keeps the values no other alternative accepts.
                    if (!analysed[i].is_object() || !(analysed[i].contains("const") || analysed[i].contains("enum")))
                        continue;
                    ojson vals = ojson::array();
                    for (const ojson& v : literals(analysed[i])) {
                        bool only = true;
                        for (size_t j = 0; j < analysed.size() && only; ++j)
                            if (i != j) only = value_fails(v, analysed[j]);
                        if (only) vals.push_back(v);
                    }
                    if (vals.empty()) continue;
                    ojson reduced = analysed[i];
                    reduced.erase("const");
                    reduced["enum"] = vals;
                    narrowed[i] = reduced;
                    keep.push_back(i);
                }
            }
            if (keep.empty())
                for (size_t i = 0; i < alts_in.size(); ++i) keep.push_back(i);
            std::vector<Frag> alts;
            for (size_t i : keep) {
                std::string w = where + "/" + key + "/" + std::to_string(i);
                if (auto it = narrowed.find(i); it != narrowed.end()) {
                    alts.push_back(value(it->second, w));
                    continue;
                }
                if (!base_constrains) {
                    alts.push_back(value(alts_in[i], w));
                } else {
                    ojson merged = {{"allOf", ojson::array({base, alts_in[i]})}};
                    alts.push_back(value(merged, w));
                }
            }
            return b_.alt(alts);
        }
        if (schema.contains("const")) return literal_values({schema["const"]}, schema, where);
        if (schema.contains("enum")) {
            std::vector<ojson> vals(schema["enum"].begin(), schema["enum"].end());
            return literal_values(vals, schema, where);
        }

        std::vector<std::string> types;
        if (schema.contains("type")) {
            if (schema["type"].is_string()) types.push_back(schema["type"]);
            else for (auto& t : schema["type"]) types.push_back(t);
        } else {
            bool obj =
                schema.contains("properties") || schema.contains("required") || schema.contains("additionalProperties");
            bool arr = schema.contains("items") || schema.contains("prefixItems") || schema.contains("minItems") ||
                       schema.contains("maxItems");
            bool str = schema.contains("pattern") || schema.contains("format") || schema.contains("minLength") ||
                       schema.contains("maxLength");
            bool num = schema.contains("minimum") || schema.contains("maximum") ||
                       schema.contains("exclusiveMinimum") || schema.contains("exclusiveMaximum");
            if (obj) types.push_back("object");
            if (arr) types.push_back("array");
            if (str) types.push_back("string");
            if (num) types.push_back("number");
            if (types.empty()) return any_value();
        }
        std::vector<Frag> alts;
        bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
        for (const std::string& t : types) {
            if (t == "string") alts.push_back(string_value(schema, where));
            else if (t == "integer" && !has_number) alts.push_back(regex(integer_regex(bounds(schema, where))));
            else if (t == "integer") continue;  // covered by number
            else if (t == "number" && schema.contains("multipleOf"))  // multipleOf 1: whole numbers
                alts.push_back(regex(integer_regex(bounds(schema, where))));
            else if (t == "number") alts.push_back(regex(number_regex(bounds(schema, where))));
            else if (t == "boolean") alts.push_back(b_.alt({b_.literal("true"), b_.literal("false")}));
            else if (t == "null") alts.push_back(b_.literal("null"));
            else if (t == "object") alts.push_back(object_value(schema, where));
            else if (t == "array") alts.push_back(array_value(schema, where));
            else fail("JSON Schema: unknown type '{}' (at {})", t, where);
        }
        return b_.alt(alts);
    }

    // ---- oneOf analysis (sound, incomplete) ----
    const ojson& deref(const ojson& s) {
        const ojson* cur = &s;
        for (int i = 0; i < 8 && cur->is_object() && cur->contains("$ref"); ++i) {
            bool only_ref = true;
            for (auto& [k, v] : cur->items())
                if (k != "$ref" && !kAnnotations.count(k)) only_ref = false;
            if (!only_ref) break;
            cur = &resolve((*cur)["$ref"].get<std::string>(), "oneOf");
        }
        return *cur;
    }

    // JSON types our generator may produce for a schema (empty: unknown).
    std::set<std::string> generated_types(const ojson& s) {
        std::set<std::string> t;
        auto type_of = [](const ojson& v) -> std::string {
            if (v.is_string()) return "string";
            if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
            if (v.is_number()) return "number";
            if (v.is_boolean()) return "boolean";
            if (v.is_null()) return "null";
            return v.is_object() ? "object" : "array";
        };
        if (!s.is_object() || s.contains("anyOf") || s.contains("oneOf") || s.contains("allOf") || s.contains("$ref"))
            return t;
        if (s.contains("const")) t.insert(type_of(s["const"]));
        else if (s.contains("enum")) for (auto& v : s["enum"]) t.insert(type_of(v));
        else if (s.contains("type") && s["type"].is_string()) t.insert(s["type"].get<std::string>());
        else if (s.contains("type")) for (auto& x : s["type"]) t.insert(x.get<std::string>());
        else if (s.contains("properties") || s.contains("required")) t.insert("object");
        return t;
    }

    // True when every output generated for `a` is invalid under `b`.
    bool excludes(const ojson& a_in, const ojson& b_in, int depth) {
        const ojson& a = deref(a_in);
        const ojson& b = deref(b_in);
        if (b.is_boolean()) return !b.get<bool>();
        if (depth > 8 || !a.is_object() || !b.is_object()) return false;
        if (b.contains("anyOf") || b.contains("oneOf") || b.contains("allOf") || b.contains("$ref") ||
            b.contains("not"))
            return false;
        // Literal values of `a` against b's literals or types.
        if (a.contains("const") || a.contains("enum")) {
            for (const ojson& v : literals(a))
                if (!value_fails(v, b)) return false;
            return true;
        }
        std::set<std::string> ta = generated_types(a);
        if (ta.empty()) return false;
        if (b.contains("const") || b.contains("enum")) {
            // b admits only its literals: a fails b when no literal has a type a generates.
            bool possible = false;
            for (const ojson& v : literals(b))
                for (const std::string& t : ta)
                    possible = possible || is_type(v, t) || (t == "number" && v.is_number());
            if (!possible) return true;
        }
        if (b.contains("type")) {
            std::set<std::string> tb;
            if (b["type"].is_string()) tb.insert(b["type"].get<std::string>());
            else for (auto& x : b["type"]) tb.insert(x.get<std::string>());
            bool all_fail = true;
            for (const std::string& t : ta) {
                bool accepted = tb.count(t) || (t == "integer" && tb.count("number")) ||
                                (t == "number" && tb.count("integer"));  // generated numbers may be whole
                if (accepted) all_fail = false;
            }
            if (all_fail) return true;
        }
        if (ta == std::set<std::string>{"object"} && (!b.contains("type") || b["type"] == "object")) {
            bool a_extra = a.contains("additionalProperties")
                               ? !(a["additionalProperties"].is_boolean() && !a["additionalProperties"].get<bool>())
                               : (!o_.strict || (!a.contains("properties") && !a.contains("required")));
            if (a_extra) return false;
            std::set<std::string> a_keys, a_req;
            if (a.contains("properties")) for (auto& [k, v] : a["properties"].items()) a_keys.insert(k);
            if (a.contains("required")) for (auto& k : a["required"]) a_req.insert(k), a_keys.insert(k);
            if (b.contains("required"))
                for (auto& k : b["required"])
                    if (!a_keys.count(k)) return true;  // a never writes a key b requires
            bool b_closed = b.contains("additionalProperties") && b["additionalProperties"].is_boolean() &&
                            !b["additionalProperties"].get<bool>();
            for (const std::string& k : a_req) {
                bool in_b = b.contains("properties") && b["properties"].contains(k);
                if (!in_b && b_closed) return true;  // a always writes a key b forbids
                if (in_b && a.contains("properties") && a["properties"].contains(k) &&
                    excludes(a["properties"][k], b["properties"][k], depth + 1))
                    return true;  // e.g. a discriminator const
            }
        }
        return false;
    }

    static std::vector<ojson> literals(const ojson& s) {
        if (s.contains("const")) return {s["const"]};
        return std::vector<ojson>(s["enum"].begin(), s["enum"].end());
    }

    // True when the value certainly fails b (literal or type mismatch).
    bool value_fails(const ojson& v, const ojson& b_in) {
        const ojson& b = deref(b_in);
        if (b.is_boolean()) return !b.get<bool>();
        if (!b.is_object()) return false;
        if (b.contains("anyOf") || b.contains("oneOf") || b.contains("allOf") || b.contains("$ref") ||
            b.contains("not"))
            return false;
        if (b.contains("const") && !json_equal(v, b["const"])) return true;
        if (b.contains("enum")) {
            bool in = false;
            for (auto& e : b["enum"]) in = in || json_equal(v, e);
            if (!in) return true;
        }
        if (b.contains("type")) {
            bool ok = false;
            if (b["type"].is_string()) ok = is_type(v, b["type"]);
            else for (auto& t : b["type"]) ok = ok || is_type(v, t);
            if (!ok) return true;
        }
        return false;
    }

    static bool json_equal(const ojson& x, const ojson& y) {
        if (x.is_number() && y.is_number()) return x.get<double>() == y.get<double>();
        return x == y;
    }

    Frag literal_values(const std::vector<ojson>& vals, const ojson& schema, const std::string& where) {
        std::vector<Frag> alts;
        for (const ojson& v : vals) {
            if (schema.contains("type")) {
                bool ok = false;
                if (schema["type"].is_string()) ok = is_type(v, schema["type"]);
                else for (auto& t : schema["type"]) ok = ok || is_type(v, t);
                if (!ok) continue;
            }
            alts.push_back(b_.literal(v.dump(-1, ' ', false, nlohmann::detail::error_handler_t::strict)));
        }
        if (alts.empty()) fail("JSON Schema enum/const has no value of the allowed type (at {})", where);
        return b_.alt(alts);
    }

    NumberBounds bounds(const ojson& s, const std::string& where) {
        NumberBounds nb;
        auto num = [&](const char* k) -> std::optional<double> {
            if (!s.contains(k)) return std::nullopt;
            if (s[k].is_boolean()) unsupported(std::string("boolean ") + k + " (draft-4 style)", where);
            return s[k].get<double>();
        };
        nb.min = num("minimum");
        nb.max = num("maximum");
        if (auto e = num("exclusiveMinimum"); e && (!nb.min || *e >= *nb.min)) nb.min = e, nb.min_exclusive = true;
        if (auto e = num("exclusiveMaximum"); e && (!nb.max || *e <= *nb.max)) nb.max = e, nb.max_exclusive = true;
        return nb;
    }

    // ---- strings ----
    Frag string_value(const ojson& s, const std::string& where) {
        bool has_len = s.contains("minLength") || s.contains("maxLength");
        int64_t lo = s.value("minLength", int64_t(0));
        int64_t hi = s.contains("maxLength") ? s["maxLength"].get<int64_t>() : -1;
        if (s.contains("pattern")) {
            if (has_len) unsupported("pattern combined with minLength/maxLength", where);
            if (s.contains("format") && !format_regex(s["format"].get<std::string>()).empty())
                unsupported("pattern combined with format", where);
            return quoted(build_regex(b_, s["pattern"].get<std::string>(), RegexMode::kSearch, encode_json_chars));
        }
        if (s.contains("format")) {
            std::string re = format_regex(s["format"].get<std::string>());
            if (!re.empty()) {
                if (has_len) re = bounded_format_regex(s["format"].get<std::string>(), re, lo, hi, where);
                return quoted(regex(re));
            }
        }
        if (hi >= 0 && hi < lo) fail("JSON Schema maxLength < minLength (at {})", where);
        if (hi > 2000) unsupported("maxLength above 2000", where);
        return quoted(b_.repeat(json_char(), lo, hi));
    }

    static std::string format_regex(const std::string& f) {
        const std::string date =
            "[1-9][0-9]{3}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)";
        const std::string time =
            "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
        const std::string octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
        const std::string label = "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?";
        if (f == "date") return date;
        if (f == "time") return time;
        if (f == "date-time") return date + "T" + time;
        if (f == "uuid") return "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
        if (f == "ipv4") return octet + "\\." + octet + "\\." + octet + "\\." + octet;
        if (f == "ipv6") return "[0-9a-f]{1,4}(:[0-9a-f]{1,4}){7}";
        if (f == "email") return "[a-zA-Z0-9_+-]+(\\.[a-zA-Z0-9_+-]+)*@" + label + "(\\." + label + ")+";
        if (f == "hostname") return label + "(\\." + label + ")*";
        if (f == "uri" || f == "url") return "https?://" + label + "(\\." + label + ")*(/[a-zA-Z0-9._~-]*)*";
        return "";  // unknown formats are annotations
    }

    // A format under minLength/maxLength: fixed-length formats pass when their length range fits;
    // open-ended ones get a length-bounded shape (every string it yields is still of that format).
    static std::string bounded_format_regex(const std::string& f, const std::string& re, int64_t lo, int64_t hi,
                                            const std::string& where) {
        struct Span { const char* name; int64_t min, max; };
        static const Span fixed[] = {{"date", 10, 10}, {"time", 9, 21}, {"date-time", 20, 32},
                                     {"uuid", 36, 36}, {"ipv4", 7, 15}, {"ipv6", 15, 39}};
        for (const Span& sp : fixed)
            if (f == sp.name) {
                if (lo <= sp.min && (hi < 0 || hi >= sp.max)) return re;
                unsupported("format '" + f + "' with minLength/maxLength cutting into its lengths", where);
            }
        int64_t cap = hi < 0 ? 64 : hi;
        auto r = [](int64_t a, int64_t b) { return "{" + std::to_string(a) + "," + std::to_string(b) + "}"; };
        if (f == "email" && lo <= 7 && cap >= 7) {  // local@domain.com: 1+1+1+4 .. cap
            int64_t local = std::max<int64_t>(1, (cap - 5) / 2), domain = cap - 5 - local;
            return "[a-zA-Z0-9_+-]" + r(1, local) + "@[a-z0-9]" + r(1, domain) + "\\.(com|org|net)";
        }
        if (f == "hostname" && lo <= 5 && cap >= 5) return "[a-z0-9]" + r(1, cap - 4) + "\\.(com|org|net)";
        if ((f == "uri" || f == "url") && lo <= 13 && cap >= 13)
            return "https://[a-z0-9]" + r(1, cap - 12) + "\\.com";
        unsupported("format '" + f + "' with minLength/maxLength", where);
    }

    // ---- objects ----
    // Keys of additional properties: printable ASCII (no escapes), never one of the listed names.
    Frag extra_key(const std::vector<std::string>& names) {
        struct TrieNode { std::map<uint8_t, int> kids; bool end = false; int state = -1; };
        std::vector<TrieNode> trie(1);
        for (const std::string& n : names) {
            int cur = 0;
            for (unsigned char c : n) {
                auto it = trie[cur].kids.find(c);
                if (it == trie[cur].kids.end()) {
                    trie.push_back({});
                    it = trie[cur].kids.emplace(c, int(trie.size()) - 1).first;
                }
                cur = it->second;
            }
            trie[cur].end = true;
        }
        int32_t start = b_.node(), free = b_.node(), after = b_.node(), end = b_.node();
        for (auto& t : trie) t.state = b_.node();
        b_.link_bytes(start, '"', '"', trie[0].state);
        for (int c = 0x20; c <= 0x7E; ++c) {
            if (c == '"' || c == '\\') continue;
            b_.link_bytes(free, c, c, free);
            for (auto& t : trie) {
                auto it = t.kids.find(uint8_t(c));
                b_.link_bytes(t.state, c, c, it == t.kids.end() ? free : trie[it->second].state);
            }
        }
        b_.link_bytes(free, '"', '"', after);
        for (size_t i = 1; i < trie.size(); ++i)
            if (!trie[i].end) b_.link_bytes(trie[i].state, '"', '"', after);
        b_.link(after, end);
        return {start, end};
    }

    Frag object_value(const ojson& s, const std::string& where) {
        struct Prop { std::string name; const ojson* schema; bool required; };
        std::vector<Prop> props;
        std::set<std::string> required;
        if (s.contains("required"))
            for (auto& r : s["required"]) required.insert(r.get<std::string>());
        static const ojson kAny = true;
        if (s.contains("properties"))
            for (auto& [k, v] : s["properties"].items()) props.push_back({k, &v, required.count(k) > 0});
        for (const std::string& r : required) {
            bool listed = false;
            for (auto& p : props) listed = listed || p.name == r;
            if (!listed) props.push_back({r, &kAny, true});
        }
        const ojson* extra = nullptr;
        if (s.contains("additionalProperties")) {
            const ojson& ap = s["additionalProperties"];
            if (!(ap.is_boolean() && !ap.get<bool>())) extra = &ap;
        } else if (!o_.strict || (!s.contains("properties") && !s.contains("required"))) {
            extra = &kAny;  // a bare {"type": "object"} means any object
        }

        // States: S[i][e] = before property i, e = whether a member was already written.
        size_t n = props.size();
        std::vector<std::array<int32_t, 2>> S(n + 1);
        for (auto& st : S) st = {b_.node(), b_.node()};
        for (size_t i = 0; i < n; ++i) {
            int32_t k = b_.node();
            b_.link(S[i][0], k);
            Frag sep = item_sep();
            b_.link(S[i][1], sep.start);
            b_.link(sep.end, k);
            std::string key = ojson(props[i].name).dump();
            Frag kv =
                b_.seq({b_.literal(key), key_sep(), value(*props[i].schema, where + "/properties/" + props[i].name)});
            b_.link(k, kv.start);
            b_.link(kv.end, S[i + 1][1]);
            if (!props[i].required) {
                b_.link(S[i][0], S[i + 1][0]);
                b_.link(S[i][1], S[i + 1][1]);
            }
        }
        if (extra) {
            std::vector<std::string> names;
            for (auto& p : props) names.push_back(p.name);
            int32_t k = b_.node();
            b_.link(S[n][0], k);
            Frag sep = item_sep();
            b_.link(S[n][1], sep.start);
            b_.link(sep.end, k);
            Frag kv = b_.seq({extra_key(names), key_sep(), value(*extra, where + "/additionalProperties")});
            b_.link(k, kv.start);
            b_.link(kv.end, S[n][1]);
        }
        Frag head = open("{");
        int32_t end = b_.node();
        b_.link(head.end, S[0][0]);
        Frag close_empty = b_.literal("}");
        b_.link(S[n][0], close_empty.start);
        b_.link(close_empty.end, end);
        Frag close_full = close("}");
        b_.link(S[n][1], close_full.start);
        b_.link(close_full.end, end);
        return {head.start, end};
    }

    // ---- arrays ----
    Frag element(const ojson& schema, const std::string& where, bool many) {
        Frag f = value(schema, where);
        // A large element repeated many times becomes a rule, so the automaton stays small.
        if (many && b_.size_of(f) > 400) {
            int32_t r = b_.declare_rule(b_.fresh_rule_name("item"));
            b_.set_body(r, f);
            return b_.call(r);
        }
        return f;
    }

    Frag array_value(const ojson& s, const std::string& where) {
        std::vector<const ojson*> prefix;
        const ojson* items = nullptr;
        static const ojson kAny = true;
        if (s.contains("prefixItems"))
            for (auto& p : s["prefixItems"]) prefix.push_back(&p);
        if (s.contains("items")) {
            const ojson& it = s["items"];
            if (it.is_array()) {
                // Draft-4/7 tuple form: further items follow additionalItems.
                for (auto& p : it) prefix.push_back(&p);
                if (s.contains("additionalItems")) {
                    const ojson& ai = s["additionalItems"];
                    items = ai.is_boolean() && !ai.get<bool>() ? nullptr : &ai;
                } else {
                    items = o_.strict ? nullptr : &kAny;
                }
            } else if (!(it.is_boolean() && !it.get<bool>())) {
                items = &it;
            }
        } else if (prefix.empty() || !o_.strict) {
            items = &kAny;
        }
        int64_t lo = s.value("minItems", int64_t(0));
        int64_t hi = s.contains("maxItems") ? s["maxItems"].get<int64_t>() : -1;
        if (hi >= 0 && hi < lo) fail("JSON Schema maxItems < minItems (at {})", where);
        if (lo > 1000 || hi > 1000) unsupported("minItems/maxItems above 1000", where);
        int64_t k = static_cast<int64_t>(prefix.size());
        if (!items && lo > k) fail("JSON Schema minItems {} exceeds the {} allowed items (at {})", lo, k, where);

        // Element i (0-based) is written with a separator unless it is the first.
        auto elem = [&](int64_t i, Frag v) { return i == 0 ? v : b_.seq(item_sep(), v); };
        // Tail after the prefix: extra items, count in [max(0, lo-k), hi-k].
        Frag tail = b_.empty();
        if (items && (hi < 0 || hi > k)) {
            int64_t t_lo = std::max<int64_t>(0, lo - k), t_hi = hi < 0 ? -1 : hi - k;
            bool many = t_hi < 0 || t_hi > 3;
            std::string w = where + "/items";
            if (k == 0) {
                Frag first = element(*items, w, many);
                Frag rest = b_.repeat(b_.seq(item_sep(), element(*items, w, many)), std::max<int64_t>(0, t_lo - 1),
                                      t_hi < 0 ? -1 : t_hi - 1);
                tail = b_.seq(first, rest);
                if (t_lo == 0) tail = b_.optional(tail);
            } else {
                tail = b_.repeat(b_.seq(item_sep(), element(*items, w, many)), t_lo, t_hi);
            }
        }
        // Prefix items from the last backwards: item i is optional when i >= lo.
        Frag body = tail;
        int64_t limit = hi < 0 ? k : std::min(k, hi);
        for (int64_t i = limit - 1; i >= 0; --i) {
            Frag v = b_.seq(elem(i, value(*prefix[i], where + "/prefixItems/" + std::to_string(i))), body);
            body = i >= lo ? b_.optional(v) : v;
        }
        Frag head = open("[");
        int32_t end = b_.node();
        // Empty arrays close right after "["; others allow whitespace before "]".
        Frag full = b_.seq(body, close("]"));
        if (lo == 0) {
            Frag empty_close = b_.literal("]");
            int32_t split = b_.node();
            b_.link(head.end, split);
            b_.link(split, empty_close.start);
            b_.link(empty_close.end, end);
            b_.link(split, full.start);
            b_.link(full.end, end);
            return {head.start, end};
        }
        b_.link(head.end, full.start);
        b_.link(full.end, end);
        return {head.start, end};
    }

    const ojson& root_;
    int depth_ = 0;
    JsonSchemaOptions o_;
    GrammarBuilder own_;
    GrammarBuilder& b_;
    int32_t any_rule_ = -1;
    bool pending_any_ = false;
    std::map<std::string, int32_t> ref_rules_;
    std::vector<std::string> pending_refs_;
    std::set<std::string> expanding_;
};

}  // namespace

Grammar json_schema_grammar(const ojson& schema, const JsonSchemaOptions& options) {
    return SchemaCompiler(schema, options).build_schema();
}

Grammar json_schema_grammar(const std::string& schema_text, const JsonSchemaOptions& options) {
    ojson schema;
    if (const char* problem = json_shape_problem(schema_text)) fail("JSON Schema text {}", problem);
    try {
        schema = ojson::parse(schema_text);
    } catch (const std::exception& e) {
        fail("JSON Schema is not valid JSON: {}", e.what());
    }
    return json_schema_grammar(schema, options);
}

Frag json_schema_fragment(GrammarBuilder& b, const std::string& schema_text, const JsonSchemaOptions& options) {
    ojson schema;
    if (const char* problem = json_shape_problem(schema_text)) fail("JSON Schema text {}", problem);
    try {
        schema = ojson::parse(schema_text);
    } catch (const std::exception& e) {
        fail("JSON Schema is not valid JSON: {}", e.what());
    }
    return SchemaCompiler(schema, options, b).fragment();
}

Grammar json_object_grammar(const JsonSchemaOptions& options) {
    return SchemaCompiler(ojson::object(), options).build_any_object();
}

}  // namespace peregrine::grammar
