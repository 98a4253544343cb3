#include "engine/grammar/matcher.h"

#include <algorithm>
#include <cstring>

#include "util/error.h"

namespace peregrine::grammar {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar, int max_rollback)
    : grammar_(std::move(grammar)), max_rollback_(max_rollback), stepper_(grammar_->grammar(), pool_) {
    reset();
}

void GrammarMatcher::reset() {
    pool_.clear();
    history_.clear();
    cur_ = Config{};
    StepFlags flags;
    stepper_.closure(grammar_->grammar().root_start(), kRootFrame, cur_.tops, flags);
    std::sort(cur_.tops.begin(), cur_.tops.end());
    cur_.can_end = flags.can_end;
}

bool GrammarMatcher::is_terminated() const { return cur_.stopped || (cur_.tops.empty() && cur_.can_end); }

bool GrammarMatcher::run_bytes(const Config& from, std::string_view bytes, Config& out) {
    std::vector<Top> a = from.tops, b;
    StepFlags flags;
    for (size_t i = 0; i < bytes.size(); ++i) {
        flags = {};
        stepper_.step(a, static_cast<uint8_t>(bytes[i]), b, flags);
        std::swap(a, b);
        if (a.empty() && !(flags.can_end && i + 1 == bytes.size())) return false;
    }
    std::sort(a.begin(), a.end());
    out.tops = std::move(a);
    out.can_end = bytes.empty() ? from.can_end : flags.can_end;
    out.stopped = false;
    return !out.tops.empty() || out.can_end;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
    if (cur_.stopped) return false;
    Config next;
    if (!run_bytes(cur_, bytes, next)) return false;
    history_.push_back(std::move(cur_));
    cur_ = std::move(next);
    if (max_rollback_ >= 0 && static_cast<int>(history_.size()) > max_rollback_)
        history_.erase(history_.begin(), history_.end() - max_rollback_);
    return true;
}

bool GrammarMatcher::accept_token(int32_t id) {
    const Vocabulary& v = grammar_->vocab();
    if (id < 0 || id >= v.size() || cur_.stopped) return false;
    if (v.is_special(id)) {
        if (!v.is_stop(id) || !cur_.can_end) return false;
        history_.push_back(cur_);
        cur_.stopped = true;
        return true;
    }
    const std::string& bytes = v.token_bytes(id);
    if (bytes.empty()) return false;
    return accept_bytes(bytes);
}

void GrammarMatcher::rollback(int n_tokens) {
    PEREGRINE_CHECK(n_tokens >= 0 && n_tokens <= static_cast<int>(history_.size()),
                    "cannot roll back {} tokens (only {} kept)", n_tokens, history_.size());
    for (int i = 0; i < n_tokens; ++i) {
        cur_ = std::move(history_.back());
        history_.pop_back();
    }
}

// Checks the uncertain tokens of one stack top against the real stack, sharing work between tokens
// with a common prefix (they are sorted by bytes).
void GrammarMatcher::check_uncertain(Top top, const std::vector<int32_t>& ids, uint32_t* bitmask) {
    const Vocabulary& v = grammar_->vocab();
    if (levels_.empty()) levels_.resize(64);
    levels_[0].assign(1, top);
    size_t computed = 0;       // levels_[0..computed] hold the configs of prev's prefixes
    bool dead = false;         // levels_[computed] is empty (prev's prefix of that length is dead)
    const std::string* prev = nullptr;
    for (int32_t id : ids) {
        if (bitmask[id >> 5] >> (id & 31) & 1u) continue;
        const std::string& t = v.token_bytes(id);
        size_t lcp = 0;
        if (prev) {
            size_t m = std::min({prev->size(), t.size(), computed});
            while (lcp < m && (*prev)[lcp] == t[lcp]) ++lcp;
        }
        prev = &t;
        if (dead && lcp >= computed) continue;  // shares a dead prefix
        computed = lcp;
        dead = false;
        if (levels_.size() < t.size() + 1) levels_.resize(t.size() + 1);
        if (level_end_.size() < levels_.size()) level_end_.resize(levels_.size());
        bool ok = false;
        for (size_t k = computed; k < t.size(); ++k) {
            StepFlags flags;
            stepper_.step(levels_[k], static_cast<uint8_t>(t[k]), levels_[k + 1], flags);
            level_end_[k + 1] = flags.can_end;
            computed = k + 1;
            if (levels_[k + 1].empty()) {
                dead = true;
                break;
            }
        }
        if (computed == t.size()) ok = !levels_[computed].empty() || level_end_[computed];
        if (ok) bitmask[id >> 5] |= 1u << (id & 31);
    }
}

void GrammarMatcher::fill_next_token_bitmask(uint32_t* bitmask) {
    const CompiledGrammar& cg = *grammar_;
    const Vocabulary& v = cg.vocab();
    const int32_t words = v.mask_words();
    if (cur_.stopped) {
        std::memset(bitmask, 0, sizeof(uint32_t) * words);
        return;
    }
    bool initialised = false;
    int32_t last_state = -1;
    for (const Top& t : cur_.tops) {  // sorted by state: equal states share their accepted set
        if (t.state == last_state) continue;
        last_state = t.state;
        const StateMask& m = cg.mask(t.state);
        if (!initialised && m.storage == StateMask::kBitset) {
            std::memcpy(bitmask, m.bits.data(), sizeof(uint32_t) * words);
        } else if (!initialised && m.storage == StateMask::kRejectList) {
            std::memcpy(bitmask, cg.text_token_bits().data(), sizeof(uint32_t) * words);
            for (int32_t id : m.ids) bitmask[id >> 5] &= ~(1u << (id & 31));
        } else {
            if (!initialised) std::memset(bitmask, 0, sizeof(uint32_t) * words);
            if (m.storage == StateMask::kBitset) {
                for (int32_t w = 0; w < words; ++w) bitmask[w] |= m.bits[w];
            } else if (m.storage == StateMask::kRejectList) {
                // Rare (several tops): OR in text tokens minus this state's rejects.
                std::vector<uint32_t> tmp = cg.text_token_bits();
                for (int32_t id : m.ids) tmp[id >> 5] &= ~(1u << (id & 31));
                for (int32_t w = 0; w < words; ++w) bitmask[w] |= tmp[w];
            } else {
                for (int32_t id : m.ids) bitmask[id >> 5] |= 1u << (id & 31);
            }
        }
        initialised = true;
    }
    if (!initialised) std::memset(bitmask, 0, sizeof(uint32_t) * words);
    size_t mark = pool_.mark();
    for (const Top& t : cur_.tops) check_uncertain(t, cg.mask(t.state).uncertain, bitmask);
    pool_.release(mark);
    if (cur_.can_end)
        for (int32_t id : v.stop_ids()) bitmask[id >> 5] |= 1u << (id & 31);
}

}  // namespace peregrine::grammar
