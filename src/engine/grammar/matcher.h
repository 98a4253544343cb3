#pragma once
// Per-request matcher: tracks where generation is in the grammar, fills the next-token bitmask and
// advances on sampled tokens. fill_next_token_bitmask is pure CPU work meant to run while the GPU
// computes the step's logits; it reads only this matcher and the immutable CompiledGrammar, so
// matchers of different requests may be filled concurrently.
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/stack.h"

namespace peregrine::grammar {

class GrammarMatcher {
public:
    // max_rollback: how many accepted tokens rollback() can undo (speculative decoding); -1 = all.
    explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar, int max_rollback = -1);

    // bitmask has ceil(V/32) words; bit i of word w set = token 32*w+i allowed. Stop tokens are set
    // exactly when the grammar may end here; other special tokens never.
    void fill_next_token_bitmask(uint32_t* bitmask);
    // Advances on a sampled token; false (state unchanged) if the grammar does not allow it.
    bool accept_token(int32_t id);
    // Advances on raw bytes (e.g. a forced prefix); false (state unchanged) if not allowed.
    bool accept_bytes(std::string_view bytes);
    // True once a stop token was accepted, or when no further text is possible (only EOS remains).
    bool is_terminated() const;
    // The text so far is a complete sentence of the grammar (a stop token would be accepted).
    bool can_end() const { return cur_.can_end; }
    // Undoes the last n accepted tokens.
    void rollback(int n_tokens);
    void reset();
    int num_accepted() const { return static_cast<int>(history_.size()); }

    const CompiledGrammar& compiled() const { return *grammar_; }

private:
    struct Config {
        std::vector<Top> tops;
        bool can_end = false;
        bool stopped = false;
    };
    // Runs bytes from `from`; returns whether the result is non-dead.
    bool run_bytes(const Config& from, std::string_view bytes, Config& out);
    void check_uncertain(Top top, const std::vector<int32_t>& ids, uint32_t* bitmask);

    std::shared_ptr<const CompiledGrammar> grammar_;
    int max_rollback_;
    FramePool pool_;
    StackStepper stepper_;
    Config cur_;
    std::vector<Config> history_;
    std::vector<std::vector<Top>> levels_;
    std::vector<uint8_t> level_end_;
};

}  // namespace peregrine::grammar
