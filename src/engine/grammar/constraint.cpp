#include "engine/grammar/constraint.h"

#include "engine/grammar/budget.h"
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

std::optional<ConstraintSpec> constraint_from_sampling_params(const nlohmann::json& params) {
    std::optional<ConstraintSpec> spec;
    for (const char* key : {"json_schema", "regex", "ebnf"}) {
        if (!params.contains(key) || params[key].is_null()) continue;
        PEREGRINE_CHECK(!spec, "only one of json_schema, regex and ebnf may be given");
        const auto& v = params[key];
        std::string text;
        if (v.is_string()) text = v.get<std::string>();
        else if (std::string(key) == "json_schema" && (v.is_object() || v.is_boolean())) text = v.dump();
        else fail("sampling parameter '{}' must be a string", key);
        spec = ConstraintSpec{constraint_kind_from_name(key), text};
    }
    return spec;
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

std::string GrammarCompiler::key_of(const ConstraintSpec& spec) {
    return std::string(constraint_kind_name(spec.kind)) + '\0' + spec.text;
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const ConstraintSpec& spec) {
    return compile_cached(key_of(spec), [&] { return build_grammar(spec, options_); });
}

std::optional<GrammarCompiler::Future> GrammarCompiler::find(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(key);
    if (it == cache_.end()) return std::nullopt;
    return it->second;
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile_cached(const std::string& key,
                                                                       const std::function<Grammar()>& build) {
    for (;;) {
        bool owner = false;
        Future future = entry(key, build, owner);
        if (owner) return future.get();
        // Another request compiles it: wait under this thread's own budget, and compile it here if that one was
        // cancelled (its client left; the failed entry is gone from the cache).
        const CompileBudget* budget = current_budget();
        while (future.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready)
            if (budget) budget->check();
        try {
            return future.get();
        } catch (const CompileCancelled&) {
        }
    }
}

GrammarCompiler::Future GrammarCompiler::entry(const std::string& key, const std::function<Grammar()>& build,
                                               bool& owner) {
    std::promise<std::shared_ptr<const CompiledGrammar>> promise;
    Future future;
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
            promise.set_value(compile(build()));
        } catch (const GrammarTooComplex&) {
            promise.set_exception(std::current_exception());  // kept: finding out again would cost the budget again
        } catch (...) {
            {
                std::lock_guard<std::mutex> lock(mutex_);
                cache_.erase(key);  // a failed spec is not kept: its error is cheap to reproduce
                order_.remove(key);
            }
            promise.set_exception(std::current_exception());
        }
    }
    return future;
}

size_t GrammarCompiler::cached() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return cache_.size();
}

}  // namespace peregrine::grammar
