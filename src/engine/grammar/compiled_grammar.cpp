#include "engine/grammar/compiled_grammar.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <map>
#include <cstdio>
#include <cstdlib>

#include "engine/grammar/budget.h"
#include "engine/grammar/stack.h"
#include "engine/grammar/worker_pools.h"
#include "util/switches.h"

namespace peregrine::grammar {

namespace {

// Walks the vocabulary trie from one state with an unknown caller, classifying every token.
class TrieClassifier {
public:
    TrieClassifier(const Grammar& g, const Vocabulary& v) : g_(g), v_(v), stepper_(g, pool_) {
        size_t max_len = 0;
        for (int32_t id : v.sorted_ids()) max_len = std::max(max_len, v.token_bytes(id).size());
        levels_.resize(max_len + 2);
        follow_.resize(g.rules.size());
        for (int32_t st = 0; st < g.num_states(); ++st)
            for (auto [rule, ret] : g.calls[st])
                if (g.reachable[st]) follow_[rule].push_back(ret);
        for (auto& f : follow_) {
            std::sort(f.begin(), f.end());
            f.erase(std::unique(f.begin(), f.end()), f.end());
        }
        // Runs: from a plain state, the bytes leading to its main successor (a self-loop inside an
        // unbounded string, the next counter state inside a bounded one) and how many such bytes can
        // follow one another while staying on plain states with byte edges.
        const int32_t n = g.num_states();
        plain_.resize(n);
        run_bytes_.resize(n);
        run_next_.assign(n, -1);
        run_cap_.assign(n, -1);
        for (int32_t st = 0; st < n; ++st) plain_[st] = !g.accepting[st] && g.calls[st].empty() && g.has_bytes(st);
        for (int32_t st = 0; st < n; ++st) {
            poll_budget();
            if (!plain_[st]) continue;
            std::map<int32_t, int> count;
            for (int b = 0; b < 256; ++b)
                if (int32_t t = g.step(st, uint8_t(b)); t >= 0 && plain_[t]) ++count[t];
            int best = 0;
            for (auto [t, c] : count)
                if (c > best || (c == best && t == st)) best = c, run_next_[st] = t;
            if (run_next_[st] < 0) continue;
            for (int b = 0; b < 256; ++b)
                if (g.step(st, uint8_t(b)) == run_next_[st]) run_bytes_[st].add(uint8_t(b));
        }
        for (int32_t st = 0; st < n; ++st) run_capacity(st);
    }

    int32_t run_capacity(int32_t st) {
        constexpr int32_t kUnbounded = 1 << 30;
        if (run_cap_[st] >= 0) return run_cap_[st];
        if (run_next_[st] < 0) return run_cap_[st] = 0;
        if (run_next_[st] == st) return run_cap_[st] = kUnbounded;
        // Follow the chain iteratively (bounded strings give chains of hundreds of states).
        std::vector<int32_t> chain{st};
        int32_t cur = st;
        while (true) {
            int32_t t = run_next_[cur];
            if (t < 0 || run_cap_[t] >= 0 || t == cur || !run_bytes_[cur].subset_of(run_bytes_[t]) ||
                std::find(chain.begin(), chain.end(), t) != chain.end())
                break;
            chain.push_back(t);
            cur = t;
        }
        // The last state's successor ends the run: it still has byte edges, so one more byte fits.
        int32_t last = chain.back(), t = run_next_[last];
        int32_t cap = 1;
        if (t == last) cap = kUnbounded;
        else if (t >= 0 && run_cap_[t] >= 0 && run_bytes_[last].subset_of(run_bytes_[t]))
            cap = run_cap_[t] >= kUnbounded ? kUnbounded : run_cap_[t] + 1;
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
            run_cap_[*it] = cap;
            if (cap < kUnbounded) ++cap;
        }
        return run_cap_[st];
    }

    // bottom: the frame below the state's rule (kRootFrame when the rule can only be the root).
    void classify(int32_t state, int32_t bottom, std::vector<int32_t>& accepted, std::vector<int32_t>& uncertain) {
        pool_.clear();
        accepted_ = &accepted;
        uncertain_ = &uncertain;
        levels_[0].clear();
        StepFlags flags;
        stepper_.set_follow(bottom == kBottomFrame ? &follow_ : nullptr);
        stepper_.closure(state, bottom, levels_[0], flags);
        walk(0, 0, flags.popped);
    }

private:
    void add_range(std::vector<int32_t>& out, int32_t a, int32_t b) {
        const auto& ids = v_.sorted_ids();
        for (int32_t i = a; i < b; ++i) out.push_back(ids[i]);
    }

    // Whether a top lives in a follow context (its stack bottoms out at kFollowFrame).
    bool in_follow(const Top& t) const {
        int32_t f = t.frame;
        while (f >= 0) f = pool_[f].parent;
        return f == kFollowFrame;
    }

    void walk(int32_t node, size_t depth, bool popped_before) {
        poll_budget();
        const auto& trie = v_.trie();
        const std::vector<Top>& cur = levels_[depth];
        // One plain state whose run covers every byte below, long enough for the deepest token: the whole
        // subtree stays on plain states with byte edges.
        if (cur.size() == 1 && run_next_[cur[0].state] >= 0 &&
            v_.trie_depth_below()[node] <= run_cap_[cur[0].state] &&
            v_.trie_below()[node].subset_of(run_bytes_[cur[0].state])) {
            add_range(in_follow(cur[0]) ? *uncertain_ : *accepted_, trie[node].tok_end_here, trie[node].tok_end);
            return;
        }
        const bool single = cur.size() == 1;
        const Top top = single ? cur[0] : Top{-1, 0};
        const bool top_follow = single && in_follow(top);
        for (int32_t ci = trie[node].child_begin; ci < trie[node].child_end; ++ci) {
            const Vocabulary::TrieNode& c = trie[ci];
            if (single) {
                // Fast path: one top moving to a plain state (no closure work, no flags).
                int32_t t = g_.step(top.state, c.byte);
                if (t < 0) {
                    if (popped_before) add_range(*uncertain_, c.tok_begin, c.tok_end);
                    continue;
                }
                if (plain_[t]) {
                    add_range(top_follow ? *uncertain_ : *accepted_, c.tok_begin, c.tok_end_here);
                    if (c.child_begin < c.child_end) {
                        levels_[depth + 1].assign(1, Top{t, top.frame});
                        walk(ci, depth + 1, popped_before);
                    }
                    continue;
                }
            }
            std::vector<Top>& next = levels_[depth + 1];
            StepFlags flags;
            stepper_.step(levels_[depth], c.byte, next, flags);
            bool pb = popped_before || flags.popped;
            bool local = false, follow = false;
            for (const Top& t : next) (in_follow(t) ? follow : local) = true;
            // Ends here: valid in any context if consumed inside the rule (or ending it exactly);
            // otherwise only some callers might take it.
            if (local || flags.bottom_popped || flags.can_end) add_range(*accepted_, c.tok_begin, c.tok_end_here);
            else if (follow || pb || flags.follow_end) add_range(*uncertain_, c.tok_begin, c.tok_end_here);
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
    std::vector<std::vector<int32_t>> follow_;  // per rule: return states of its call sites
    std::vector<uint8_t> plain_;                 // not accepting, no calls, has byte edges
    std::vector<Vocabulary::ByteSet> run_bytes_; // bytes leading to run_next_
    std::vector<int32_t> run_next_, run_cap_;
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

    // PEREGRINE_GRAMMAR_PROFILE=1 prints each state's walk time and class sizes (compile-time tuning).
    static const bool profile = switch_is("PEREGRINE_GRAMMAR_PROFILE", "1");
    auto classify_range = [&](int64_t begin, int64_t end, const std::atomic<bool>& stop) {
        TrieClassifier cls(grammar_, v);
        std::vector<int32_t> accepted, uncertain;
        for (int64_t i = begin; i < end && !stop.load(std::memory_order_relaxed); ++i) {
            accepted.clear();
            uncertain.clear();
            int32_t bottom =
                !root_called && grammar_.rule_of[todo[i]] == grammar_.root_rule ? kRootFrame : kBottomFrame;
            auto c0 = std::chrono::steady_clock::now();
            cls.classify(todo[i], bottom, accepted, uncertain);
            if (profile)
                std::fprintf(stderr, "state %d: %.3f ms acc %zu unc %zu\n", todo[i],
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
    };
    // The pool's threads run under the caller's budget; the first part to fail (time, cancel) stops the others,
    // and its error is raised here once every part has returned.
    const CompileBudget* budget = current_budget();
    std::atomic<bool> failed{false};
    std::exception_ptr error;
    std::mutex error_mutex;
    grammar_parallel_for(GrammarPool::kCompile, static_cast<int64_t>(todo.size()), [&](int64_t begin, int64_t end) {
        BudgetScope scope(budget);
        try {
            classify_range(begin, end, failed);
        } catch (...) {
            std::lock_guard<std::mutex> lock(error_mutex);
            if (!error) error = std::current_exception();
            failed = true;
        }
    });
    if (error) std::rethrow_exception(error);

    stats_.states = grammar_.num_states();
    stats_.mask_states = static_cast<int32_t>(todo.size());
    for (const StateMask& m : masks_) {
        stats_.uncertain_total += static_cast<int64_t>(m.uncertain.size());
        stats_.cache_bytes += 4 * static_cast<int64_t>(m.ids.size() + m.bits.size() + m.uncertain.size());
    }
    stats_.precompute_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace peregrine::grammar
