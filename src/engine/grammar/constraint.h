#pragma once
// The request-facing entry point: a constraint spec (kind + text) -> compiled grammar, with a cache.
// Errors (bad syntax, unsupported schema feature) are peregrine::Error whose message names the
// problem; the server turns them into HTTP 400.
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/json_schema.h"

namespace peregrine::grammar {

enum class ConstraintKind { kJsonObject, kJsonSchema, kRegex, kEbnf };

struct ConstraintSpec {
    ConstraintKind kind = ConstraintKind::kJsonObject;
    std::string text;  // schema JSON, regex or EBNF source (empty for json_object)
};

// "json_object" | "json_schema" | "regex" | "ebnf" (the /generate sampling-parameter names).
ConstraintKind constraint_kind_from_name(const std::string& name);
const char* constraint_kind_name(ConstraintKind kind);

// OpenAI response_format: {"type":"text"} -> nullopt; {"type":"json_object"};
// {"type":"json_schema","json_schema":{"name":..,"schema":{..},"strict":..}}.
std::optional<ConstraintSpec> constraint_from_response_format(const nlohmann::json& response_format);

// Native /generate sampling parameters: at most one of "json_schema" (string or object), "regex",
// "ebnf"; nullopt when none is given, an error when several are.
std::optional<ConstraintSpec> constraint_from_sampling_params(const nlohmann::json& params);

Grammar build_grammar(const ConstraintSpec& spec, const JsonSchemaOptions& options = {});

// Compiles constraints for one vocabulary, caching compiled grammars by (kind, text). Thread-safe;
// concurrent requests for the same constraint wait for a single compilation. Compilations run under the
// calling thread's CompileBudget (budget.h), if any.
class GrammarCompiler {
public:
    explicit GrammarCompiler(std::shared_ptr<const Vocabulary> vocab, JsonSchemaOptions options = {},
                             size_t max_cached = 512);
    std::shared_ptr<const CompiledGrammar> compile(const ConstraintSpec& spec);
    std::shared_ptr<const CompiledGrammar> compile(const Grammar& grammar) const;
    // A grammar the caller builds (e.g. a tool-call grammar from ebnf_grammar with schema rules),
    // cached under a caller-chosen key (keys of specs start with their kind name and a NUL).
    std::shared_ptr<const CompiledGrammar> compile_cached(const std::string& key,
                                                          const std::function<Grammar()>& build);
    // The cache key of a spec.
    static std::string key_of(const ConstraintSpec& spec);
    // The entry under `key` (compiled or being compiled), if any: waiting on it needs no compilation of one's own.
    std::optional<std::shared_future<std::shared_ptr<const CompiledGrammar>>> find(const std::string& key) const;
    size_t cached() const;
    const std::shared_ptr<const Vocabulary>& vocab() const { return vocab_; }

private:
    using Future = std::shared_future<std::shared_ptr<const CompiledGrammar>>;
    // The cache entry for `key`; owner: this call created it and has compiled it (the future is ready).
    Future entry(const std::string& key, const std::function<Grammar()>& build, bool& owner);
    std::shared_ptr<const Vocabulary> vocab_;
    JsonSchemaOptions options_;
    size_t max_cached_;
    mutable std::mutex mutex_;
    std::map<std::string, Future> cache_;
    std::list<std::string> order_;  // insertion order, oldest first (eviction)
};

}  // namespace peregrine::grammar
