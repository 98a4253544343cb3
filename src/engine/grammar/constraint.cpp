#include "engine/grammar/constraint.h"

#include "engine/grammar/ebnf.h"
#include "engine/grammar/regex.h"
#include "util/error.h"

namespace peregrine::grammar {

ConstraintKind constraint_kind_from_name(const std::string& name) {
    if (name == "json_object") return ConstraintKind::kJsonObject;
    if (name == "json_schema") return ConstraintKind::kJsonSchema;
    if (name == "regex") return ConstraintKind::kRegex;
    if (name == "ebnf") return ConstraintKind::kEbnf;
    fail("unknown constraint kind '{}' (expected json_object, json_schema, regex or ebnf)", name);
}

const char* constraint_kind_name(ConstraintKind kind) {
    switch (kind) {
        case ConstraintKind::kJsonObject: return "json_object";
        case ConstraintKind::kJsonSchema: return "json_schema";
        case ConstraintKind::kRegex: return "regex";
        case ConstraintKind::kEbnf: return "ebnf";
    }
    return "?";
}

std::optional<ConstraintSpec> constraint_from_response_format(const nlohmann::json& rf) {
    PEREGRINE_CHECK(rf.is_object() && rf.contains("type") && rf["type"].is_string(),
                    "response_format must be an object with a string 'type'");
    std::string type = rf["type"];
    if (type == "text") return std::nullopt;
    if (type == "json_object") return ConstraintSpec{ConstraintKind::kJsonObject, ""};
    if (type == "json_schema") {
        PEREGRINE_CHECK(rf.contains("json_schema") && rf["json_schema"].is_object(),
                        "response_format json_schema needs a 'json_schema' object");
        const auto& js = rf["json_schema"];
        PEREGRINE_CHECK(js.contains("schema"), "response_format json_schema needs 'json_schema.schema'");
        return ConstraintSpec{ConstraintKind::kJsonSchema, js["schema"].dump()};
    }
    fail("unsupported response_format type '{}'", type);
}

Grammar build_grammar(const ConstraintSpec& spec, const JsonSchemaOptions& options) {
    switch (spec.kind) {
        case ConstraintKind::kJsonObject: return json_object_grammar(options);
        case ConstraintKind::kJsonSchema: return json_schema_grammar(spec.text, options);
        case ConstraintKind::kRegex: return regex_grammar(spec.text);
        case ConstraintKind::kEbnf: return ebnf_grammar(spec.text);
    }
    fail("unknown constraint kind");
}

GrammarCompiler::GrammarCompiler(std::shared_ptr<const Vocabulary> vocab, JsonSchemaOptions options, size_t max_cached)
    : vocab_(std::move(vocab)), options_(std::move(options)), max_cached_(max_cached) {}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const Grammar& grammar) const {
    return std::make_shared<const CompiledGrammar>(grammar, vocab_);
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const ConstraintSpec& spec) {
    std::string key = std::string(constraint_kind_name(spec.kind)) + '\0' + spec.text;
    std::promise<std::shared_ptr<const CompiledGrammar>> promise;
    Future future;
    bool owner = false;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = cache_.find(key);
        if (it != cache_.end()) {
            future = it->second;
        } else {
            future = promise.get_future().share();
            cache_[key] = future;
            order_.push_back(key);
            owner = true;
            while (order_.size() > max_cached_) {
                cache_.erase(order_.front());
                order_.pop_front();
            }
        }
    }
    if (owner) {
        try {
            promise.set_value(compile(build_grammar(spec, options_)));
        } catch (...) {
            {
                std::lock_guard<std::mutex> lock(mutex_);
                cache_.erase(key);  // a failed spec is not kept: its error is cheap to reproduce
                order_.remove(key);
            }
            promise.set_exception(std::current_exception());
        }
    }
    return future.get();
}

size_t GrammarCompiler::cached() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return cache_.size();
}

}  // namespace peregrine::grammar
