#pragma once
// Execution state of the pushdown automaton: a set of stack tops (DFA state + interned caller frame).
// Frames are hash-consed (return state, parent frame) pairs, so stacks share their common bottoms
// and a set of parallel stacks (ambiguous grammars) stays small.
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/grammar/grammar.h"

namespace peregrine::grammar {

constexpr int32_t kRootFrame = -1;    // below the root rule: popping it means the grammar may end
constexpr int32_t kBottomFrame = -2;  // unknown caller (mask precomputation): popping it = context needed

struct Top {
    int32_t state;
    int32_t frame;
    bool operator==(const Top& o) const { return state == o.state && frame == o.frame; }
    bool operator<(const Top& o) const { return state != o.state ? state < o.state : frame < o.frame; }
};

struct Frame {
    int32_t ret_state;  // where the caller resumes when the callee completes
    int32_t parent;
};

class FramePool {
public:
    int32_t intern(int32_t ret_state, int32_t parent);
    const Frame& operator[](int32_t id) const { return frames_[id]; }
    // Frames created after mark() can be dropped again with release() (scratch work in mask checks).
    size_t mark() const { return frames_.size(); }
    void release(size_t mark);
    void clear() { frames_.clear(); index_.clear(); }
    size_t size() const { return frames_.size(); }

private:
    static uint64_t key(int32_t r, int32_t p) { return (uint64_t(uint32_t(r)) << 32) | uint32_t(p); }
    std::vector<Frame> frames_;
    std::unordered_map<uint64_t, int32_t> index_;
};

struct StepFlags {
    bool can_end = false;  // the root rule completed
    bool popped = false;   // a rule completed into kBottomFrame
};

// Adds to `out` every top reachable from (state, frame) without consuming input: rule calls are
// entered, completed rules return to their caller. Only states with byte edges become tops.
class StackStepper {
public:
    StackStepper(const Grammar& g, FramePool& pool) : g_(g), pool_(pool) {}

    void closure(int32_t state, int32_t frame, std::vector<Top>& out, StepFlags& flags) {
        if (!g_.accepting[state] && g_.calls[state].empty()) {
            push_unique(out, {state, frame});
            return;
        }
        closure_slow(state, frame, out, flags);
    }

    // out = tops after consuming byte b from `in`.
    void step(const std::vector<Top>& in, uint8_t b, std::vector<Top>& out, StepFlags& flags) {
        out.clear();
        for (const Top& t : in) {
            int32_t n = g_.step(t.state, b);
            if (n >= 0) closure(n, t.frame, out, flags);
        }
    }

    const Grammar& grammar() const { return g_; }

private:
    static void push_unique(std::vector<Top>& out, Top t) {
        for (const Top& o : out)
            if (o == t) return;
        out.push_back(t);
    }
    void closure_slow(int32_t state, int32_t frame, std::vector<Top>& out, StepFlags& flags);

    const Grammar& g_;
    FramePool& pool_;
    std::vector<Top> work_, seen_;
};

}  // namespace peregrine::grammar
