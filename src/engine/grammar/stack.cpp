#include "engine/grammar/stack.h"

#include <algorithm>

namespace peregrine::grammar {

int32_t FramePool::intern(int32_t ret_state, int32_t parent) {
    auto [it, inserted] = index_.try_emplace(key(ret_state, parent), static_cast<int32_t>(frames_.size()));
    if (inserted) frames_.push_back({ret_state, parent});
    return it->second;
}

void FramePool::release(size_t mark) {
    while (frames_.size() > mark) {
        const Frame& f = frames_.back();
        index_.erase(key(f.ret_state, f.parent));
        frames_.pop_back();
    }
}

void StackStepper::closure_slow(int32_t state, int32_t frame, std::vector<Top>& out, StepFlags& flags) {
    work_.clear();
    seen_.clear();
    work_.push_back({state, frame});
    seen_.push_back({state, frame});
    auto visit = [&](int32_t s, int32_t f) {
        Top t{s, f};
        if (std::find(seen_.begin(), seen_.end(), t) != seen_.end()) return;
        seen_.push_back(t);
        work_.push_back(t);
    };
    while (!work_.empty()) {
        Top t = work_.back();
        work_.pop_back();
        if (g_.has_bytes(t.state)) push_unique(out, t);
        if (g_.accepting[t.state]) {
            if (t.frame == kRootFrame) {
                flags.can_end = true;
            } else if (t.frame == kBottomFrame) {
                flags.popped = true;
            } else {
                Frame f = pool_[t.frame];
                visit(f.ret_state, f.parent);
            }
        }
        for (auto [rule, ret] : g_.calls[t.state]) {
            int32_t nf = pool_.intern(ret, t.frame);
            visit(g_.rules[rule].start, nf);
        }
    }
}

}  // namespace peregrine::grammar
