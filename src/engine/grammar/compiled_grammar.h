#pragma once
// A grammar bound to a vocabulary, with the per-state token mask cache.
//
// For every automaton state that can be on top of the stack, each token falls in one of three classes,
// decided once at compile time by walking the vocabulary trie from that state with an unknown caller:
//  - accepted: some path consumes all its bytes inside the current rule (or ends the rule exactly at
//    the token's end), so it is valid whatever the stack below holds;
//  - rejected: every path dies before the rule could complete;
//  - uncertain: only paths that complete the rule mid-token survive, so validity depends on the
//    callers; these few are checked at run time against the real stack.
// Accepted sets are stored adaptively (id list, rejected-id list or bitset, whichever is smallest).
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/grammar/grammar.h"
#include "engine/grammar/vocabulary.h"

namespace peregrine::grammar {

struct StateMask {
    enum Storage : uint8_t { kAcceptList, kRejectList, kBitset };
    Storage storage = kAcceptList;
    std::vector<int32_t> ids;         // accepted ids, or (kRejectList) rejected normal-token ids
    std::vector<uint32_t> bits;       // kBitset
    std::vector<int32_t> uncertain;   // checked at run time; sorted by token bytes
};

struct CompileStats {
    double precompute_ms = 0;
    int32_t states = 0;          // automaton states
    int32_t mask_states = 0;     // states with a mask cache entry
    int64_t uncertain_total = 0; // over all states
    int64_t cache_bytes = 0;
};

class CompiledGrammar {
public:
    CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocab);

    const Grammar& grammar() const { return grammar_; }
    const Vocabulary& vocab() const { return *vocab_; }
    const std::shared_ptr<const Vocabulary>& vocab_ptr() const { return vocab_; }
    const StateMask& mask(int32_t state) const { return masks_[state]; }
    // Bitset of all tokens a grammar may ever produce as text (non-special, non-empty).
    const std::vector<uint32_t>& text_token_bits() const { return text_bits_; }
    const CompileStats& stats() const { return stats_; }

private:
    Grammar grammar_;
    std::shared_ptr<const Vocabulary> vocab_;
    std::vector<StateMask> masks_;
    std::vector<uint32_t> text_bits_;
    CompileStats stats_;
};

}  // namespace peregrine::grammar
