#include "kv/page_pool.h"
#include "util/error.h"

#include <utility>

namespace peregrine {

CarrySlot& CarrySlot::operator=(CarrySlot&& o) noexcept {
    if (this != &o) {
        reset();
        pool_ = std::exchange(o.pool_, nullptr);
        p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
}

void CarrySlot::reset() {
    if (pool_ && p_) pool_->give(p_);
    pool_ = nullptr;
    p_ = nullptr;
}

CarryPool::~CarryPool() {
    for (uint8_t* c : chunks_) memory_.free(c);
}

CarrySlot CarryPool::take() {
    if (slot_bytes_ == 0) return {};
    if (free_.empty()) {
        uint8_t* chunk = memory_.alloc(slot_bytes_ * kChunk);
        chunks_.push_back(chunk);
        for (size_t i = kChunk; i-- > 0;) free_.push_back(chunk + i * slot_bytes_);
    }
    uint8_t* p = free_.back();
    free_.pop_back();
    return {this, p};
}

PagePool::PagePool(StateMemory& memory, const StateLayout& layout, int64_t n_pages)
    : memory_(memory), layout_(layout), n_pages_(static_cast<size_t>(n_pages)), carries_(memory, layout.carry_bytes),
      initial_carry_(layout.initial_carry()) {
    PEREGRINE_CHECK(n_pages > 0, "page pool needs at least one page");
    base_ = memory_.alloc(n_pages_ * layout_.page_bytes);
    free_.reserve(n_pages_);
    for (int64_t i = n_pages - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
}

PagePool::~PagePool() { memory_.free(base_); }

int64_t PagePool::pages_for_budget(const StateLayout& layout, int64_t bytes) {
    return bytes / static_cast<int64_t>(layout.page_bytes);
}

int32_t PagePool::alloc() {
    if (free_.empty()) return -1;
    int32_t p = free_.back();
    free_.pop_back();
    return p;
}

void PagePool::free(int32_t page) { free_.push_back(page); }

bool PagePool::reserve(SeqState& s, int64_t n_tokens) {
    int64_t need = layout_.pages_for(n_tokens) - static_cast<int64_t>(s.pages.size());
    if (need <= 0) return true;
    if (need > free_pages()) return false;
    s.pool = base_;
    for (int64_t i = 0; i < need; ++i) s.pages.push_back(alloc());
    return true;
}

void PagePool::release(SeqState& s) {
    for (int32_t p : s.pages) free(p);
    s.pages.clear();
    s.carry.reset();
}

void PagePool::init(SeqState& s) {
    s.pool = base_;
    s.tokens.clear();
    s.n_cached = 0;
    if (!s.carry) s.carry = carries_.take();
    if (s.carry) memory_.from_host(s.carry.get(), initial_carry_.data(), initial_carry_.size());
}

void PagePool::restore(SeqState& s, int64_t n_tokens) {
    const int P = layout_.page_tokens;
    PEREGRINE_CHECK(n_tokens % P == 0, "state can only be restored at a page boundary");
    PEREGRINE_CHECK(static_cast<int64_t>(s.tokens.size()) >= n_tokens, "restore needs the token history");
    if (n_tokens == 0) {
        init(s);
        return;
    }
    s.pool = base_;
    s.tokens.resize(static_cast<size_t>(n_tokens));
    s.n_cached = n_tokens;
    if (!s.carry) s.carry = carries_.take();
    if (s.carry)  // stream-ordered after the step that wrote the snapshot
        memory_.copy(s.carry.get(),
                     layout_.page_ptr(base_, s.pages.at(static_cast<size_t>(n_tokens / P - 1))) + layout_.snapshot_offset,
                     layout_.carry_bytes);
}

}  // namespace peregrine
