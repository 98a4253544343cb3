#include "engine/grammar/compiled_grammar.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "engine/grammar/stack.h"
#include "util/thread_pool.h"

namespace peregrine::grammar {

namespace {

// Walks the vocabulary trie from one state with an unknown caller, classifying every token.
class TrieClassifier {
public:
    TrieClassifier(const Grammar& g, const Vocabulary& v) : g_(g), v_(v), stepper_(g, pool_) {
        size_t max_len = 0;
        for (int32_t id : v.sorted_ids()) max_len = std::max(max_len, v.token_bytes(id).size());
        levels_.resize(max_len + 2);
        plain_.resize(g.num_states());
        loops_.resize(g.num_states());
        for (int32_t st = 0; st < g.num_states(); ++st) {
            plain_[st] = !g.accepting[st] && g.calls[st].empty();
            for (int b = 0; b < 256; ++b)
                if (g.step(st, uint8_t(b)) == st) loops_[st].add(uint8_t(b));
        }
    }

    // bottom: the frame below the state's rule (kRootFrame when the rule can only be the root).
    void classify(int32_t state, int32_t bottom, std::vector<int32_t>& accepted, std::vector<int32_t>& uncertain) {
        pool_.clear();
        accepted_ = &accepted;
        uncertain_ = &uncertain;
        levels_[0].clear();
        StepFlags flags;
        stepper_.closure(state, bottom, levels_[0], flags);
        walk(0, 0, false);
    }

private:
    void add_range(std::vector<int32_t>& out, int32_t a, int32_t b) {
        const auto& ids = v_.sorted_ids();
        for (int32_t i = a; i < b; ++i) out.push_back(ids[i]);
    }

    void walk(int32_t node, size_t depth, bool popped_before) {
        const auto& trie = v_.trie();
        const std::vector<Top>& cur = levels_[depth];
        // One plain state whose self-loops cover every byte below: the whole subtree stays there.
        if (cur.size() == 1 && plain_[cur[0].state] && v_.trie_below()[node].subset_of(loops_[cur[0].state])) {
            add_range(*accepted_, trie[node].tok_end_here, trie[node].tok_end);
            return;
        }
        for (int32_t ci = trie[node].child_begin; ci < trie[node].child_end; ++ci) {
            const Vocabulary::TrieNode& c = trie[ci];
            std::vector<Top>& next = levels_[depth + 1];
            StepFlags flags;
            stepper_.step(levels_[depth], c.byte, next, flags);
            bool pb = popped_before || flags.popped;
            if (!next.empty() || flags.popped || flags.can_end) add_range(*accepted_, c.tok_begin, c.tok_end_here);
            else if (pb) add_range(*uncertain_, c.tok_begin, c.tok_end_here);
            if (next.empty()) {
                if (pb) add_range(*uncertain_, c.tok_end_here, c.tok_end);
                continue;
            }
            walk(ci, depth + 1, pb);
        }
    }

    const Grammar& g_;
    const Vocabulary& v_;
    FramePool pool_;
    StackStepper stepper_;
    std::vector<std::vector<Top>> levels_;
    std::vector<uint8_t> plain_;                 // closure of the state is the state itself
    std::vector<Vocabulary::ByteSet> loops_;     // bytes that loop on the state
    std::vector<int32_t>* accepted_ = nullptr;
    std::vector<int32_t>* uncertain_ = nullptr;
};

}  // namespace

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
    auto t0 = std::chrono::steady_clock::now();
    const Vocabulary& v = *vocab_;
    const int32_t words = v.mask_words();
    text_bits_.assign(words, 0);
    for (int32_t id : v.sorted_ids()) text_bits_[id >> 5] |= 1u << (id & 31);
    const int64_t n_text = static_cast<int64_t>(v.sorted_ids().size());

    std::vector<int32_t> todo;
    for (int32_t s = 0; s < grammar_.num_states(); ++s)
        if (grammar_.reachable[s] && grammar_.has_bytes(s)) todo.push_back(s);
    masks_.resize(grammar_.num_states());
    // Tokens running past the end of a root rule nobody calls are simply rejected, not uncertain.
    bool root_called = false;
    for (const auto& cs : grammar_.calls)
        for (auto [rule, ret] : cs) root_called = root_called || rule == grammar_.root_rule;

    parallel_for(static_cast<int64_t>(todo.size()), [&](int64_t begin, int64_t end) {
        TrieClassifier cls(grammar_, v);
        std::vector<int32_t> accepted, uncertain;
        for (int64_t i = begin; i < end; ++i) {
            accepted.clear();
            uncertain.clear();
            int32_t bottom = !root_called && grammar_.rule_of[todo[i]] == grammar_.root_rule ? kRootFrame : kBottomFrame;
            auto c0 = std::chrono::steady_clock::now();
            cls.classify(todo[i], bottom, accepted, uncertain);
            if (getenv("PEREGRINE_GRAMMAR_PROFILE"))
                fprintf(stderr, "state %d: %.3f ms acc %zu unc %zu\n", todo[i],
                        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count(),
                        accepted.size(), uncertain.size());
            StateMask& m = masks_[todo[i]];
            m.uncertain = uncertain;
            int64_t n_acc = static_cast<int64_t>(accepted.size());
            int64_t n_rej = n_text - n_acc - static_cast<int64_t>(uncertain.size());
            if (n_acc <= words) {
                m.storage = StateMask::kAcceptList;
                m.ids = accepted;
            } else if (n_rej <= words) {
                // Rejected = text tokens that are neither accepted nor uncertain.
                std::vector<uint32_t> bits = text_bits_;
                for (int32_t id : accepted) bits[id >> 5] &= ~(1u << (id & 31));
                for (int32_t id : uncertain) bits[id >> 5] &= ~(1u << (id & 31));
                m.storage = StateMask::kRejectList;
                for (int32_t w = 0; w < words; ++w)
                    for (uint32_t x = bits[w]; x; x &= x - 1) m.ids.push_back(w * 32 + __builtin_ctz(x));
            } else {
                m.storage = StateMask::kBitset;
                m.bits.assign(words, 0);
                for (int32_t id : accepted) m.bits[id >> 5] |= 1u << (id & 31);
            }
        }
    });

    stats_.states = grammar_.num_states();
    stats_.mask_states = static_cast<int32_t>(todo.size());
    for (const StateMask& m : masks_) {
        stats_.uncertain_total += static_cast<int64_t>(m.uncertain.size());
        stats_.cache_bytes += 4 * static_cast<int64_t>(m.ids.size() + m.bits.size() + m.uncertain.size());
    }
    stats_.precompute_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace peregrine::grammar
