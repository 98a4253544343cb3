#pragma once
// Structured output for the HTTP API: a request's constraint (OpenAI response_format, /generate's
// regex / ebnf / json_schema) is compiled on a small pool of compile threads under a time budget (cached per
// constraint, so the engine loop never waits on a compilation) and applied in the engine through a
// GrammarLogitProcessor per sequence.
#include "engine/grammar/budget.h"
#include "engine/grammar/constraint.h"
#include "engine/grammar/matcher.h"
#include "engine/request.h"
#include "tokenizer/tokenizer.h"
#include "util/task_pool.h"

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>

namespace peregrine {

// Masks the logits with a grammar matcher; EOS is allowed only where the grammar can end, and the
// request stops once the matcher is terminated. Near the token budget it steers to the nearest valid
// end: once the remaining budget comes within a margin of min_bytes_to_end() (`steer_margin` tokens, at
// least twice the grammar's shortest sentence, since one token can open a whole new part), only tokens
// after which the text can still be completed one byte per token within the budget are allowed
// (checked in logit order), so an output completes within max_tokens whenever the budget allows it.
class GrammarLogitProcessor : public LogitProcessor {
public:
    GrammarLogitProcessor(std::shared_ptr<const grammar::CompiledGrammar> g, int64_t max_new_tokens,
                          int32_t steer_margin = 64);
    void process(float* logits, int vocab) override;
    void accept(int32_t id) override;
    bool done() const override { return matcher_.is_terminated(); }
    int max_rollback() const override { return kMaxRollback; }
    void rollback(int n_tokens) override;

    const grammar::GrammarMatcher& matcher() const { return matcher_; }

private:
    static constexpr int kMaxRollback = 16;  // drafts of a speculative step (the matcher keeps one more for steer)
    // True when after `id` the text can still end within `budget` more tokens (EOS included).
    bool feasible(int32_t id, int64_t budget);
    void steer(float* logits, int vocab, int64_t remaining);

    grammar::GrammarMatcher matcher_;
    int64_t max_new_tokens_;
    int32_t steer_margin_;
    int64_t generated_ = 0;
    std::vector<uint32_t> mask_;
};

struct GrammarCompileOptions {
    int threads = 2;                               // --grammar-compile-threads
    size_t max_queued = 32;                        // --grammar-compile-queue: compilations waiting for a thread
    std::chrono::milliseconds timeout{5000};       // --grammar-compile-timeout (0: none)
};

// Every compile thread is busy and max_queued compilations wait already (HTTP 429).
class CompileQueueFull : public Error {
public:
    using Error::Error;
};

// Returns true once the request's client has gone away (its compilation is then cancelled).
using ClientGone = std::function<bool()>;

// One per server: the grammar vocabulary (the tokenizer's text tokens, the model's EOS as stop token), the
// compile cache and the compile threads. Thread-safe.
class StructuredOutput {
public:
    StructuredOutput(const Tokenizer& tok, int32_t vocab_size, int32_t eos_id, GrammarCompileOptions opts = {});
    // Compiles (or finds in the cache) on a compile thread, waiting here. Throws peregrine::Error naming
    // unsupported features, grammar::GrammarTooComplex past the time or state limit, CompileQueueFull, and
    // grammar::CompileCancelled once `gone` reports the client gone.
    std::shared_ptr<const grammar::CompiledGrammar> compile(const grammar::ConstraintSpec& spec,
                                                            const ClientGone& gone = {});
    // A grammar the caller builds, cached under `key`, over the vocabulary in which the DSML marker token
    // is text (tool-call grammars spell it); throws as compile().
    std::shared_ptr<const grammar::CompiledGrammar> compile_tool_calls(const std::string& key,
                                                                       const std::function<grammar::Grammar()>& build,
                                                                       const ClientGone& gone = {});
    // A processor for one sequence of a request.
    std::shared_ptr<LogitProcessor> processor(std::shared_ptr<const grammar::CompiledGrammar> g,
                                              int64_t max_new_tokens) const;

    const GrammarCompileOptions& options() const { return opts_; }

private:
    using Result = std::shared_ptr<const grammar::CompiledGrammar>;
    std::unique_ptr<grammar::GrammarCompiler> make_compiler(const std::vector<int32_t>& text_ids) const;
    // Runs `compile` on a compile thread under the budget, polling `gone` meanwhile; a compilation already
    // under way for `key` is waited for here instead.
    Result run(grammar::GrammarCompiler& compiler, const std::string& key, const std::function<Result()>& compile,
               const ClientGone& gone);
    const Tokenizer& tok_;
    int32_t vocab_size_, eos_;
    GrammarCompileOptions opts_;
    TaskPool pool_;
    std::once_flag once_, tools_once_;
    std::unique_ptr<grammar::GrammarCompiler> compiler_, tools_compiler_;
};

}  // namespace peregrine
