#include "kv/page_pool.h"
#include "util/error.h"

#include <algorithm>
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

PagePool::PagePool(StateMemory& memory, const StateLayout& layout, Pages pages)
    : memory_(memory), layout_(layout), capacity_(pages), carries_(memory, layout.carry_bytes),
      initial_carry_(layout.initial_carry()) {
    PEREGRINE_CHECK(pages[kHistoryPages] > 0 && pages[kWindowPages] > 0, "page pool needs at least one page");
    for (size_t t = 0; t < kPageTables; ++t) {
        const size_t bytes = static_cast<size_t>(capacity_[t]) * layout_.page_bytes[t];
        if (bytes > 0) base_[t] = memory_.alloc(bytes);
        auto& f = free_[t];
        f.reserve(static_cast<size_t>(capacity_[t]));
        for (int64_t i = capacity_[t] - 1; i >= 0; --i) f.push_back(static_cast<int32_t>(i));
    }
}

PagePool::~PagePool() {
    for (uint8_t* b : base_)
        if (b) memory_.free(b);
}

PagePool::Pages PagePool::pages_for_budget(const StateLayout& layout, int64_t bytes, int64_t window_pages) {
    // A model whose layers keep only windows has empty history pages: count what their table entry costs.
    const auto history = std::max<int64_t>(static_cast<int64_t>(layout.page_bytes[kHistoryPages]), 64);
    const auto window = static_cast<int64_t>(layout.page_bytes[kWindowPages]);
    const int64_t rows = bytes / static_cast<int64_t>(layout.row_bytes());
    if (window_pages >= rows) return {rows, rows};
    return {(bytes - window_pages * window) / history, window_pages};
}

PageRow PagePool::alloc() {
    PageRow row;
    row.fill(-1);
    if (free_rows() == 0) return row;
    for (PageTable t : {kHistoryPages, kWindowPages}) row[t] = alloc_page(t);
    return row;
}

int32_t PagePool::alloc_page(PageTable t) {
    if (free_[t].empty()) return -1;
    const int32_t id = free_[t].back();
    free_[t].pop_back();
    return id;
}

void PagePool::free(const PageRow& row) {
    for (size_t t = 0; t < row.size(); ++t)
        if (row[t] >= 0) free_[t].push_back(row[t]);
}

void PagePool::attach(SeqState& s) const { s.pool = base_; }

bool PagePool::reserve(SeqState& s, int64_t n_tokens) {
    const int64_t need = layout_.pages_for(n_tokens) - static_cast<int64_t>(s.pages.size());
    if (need <= 0) return true;
    if (need > free_rows()) return false;
    attach(s);
    for (int64_t i = 0; i < need; ++i) s.pages.push_back(alloc());
    return true;
}

void PagePool::drop_window(SeqState& s, int64_t from_row, int64_t to_row) {
    to_row = std::min<int64_t>(to_row, static_cast<int64_t>(s.pages.size()));
    for (int64_t r = std::max<int64_t>(from_row, 0); r < to_row; ++r) {
        int32_t& id = s.pages[static_cast<size_t>(r)][kWindowPages];
        if (id >= 0) free_[kWindowPages].push_back(std::exchange(id, -1));
    }
}

void PagePool::release(SeqState& s) {
    for (const PageRow& row : s.pages) free(row);
    s.pages.clear();
    s.carry.reset();
    s.step_carries.clear();
    s.step_carries_from = -1;
}

void PagePool::init(SeqState& s) {
    attach(s);
    s.tokens.clear();
    s.n_cached = 0;
    s.window_floor = 0;
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
    attach(s);
    s.tokens.resize(static_cast<size_t>(n_tokens));
    s.n_cached = n_tokens;
    if (!s.carry) s.carry = carries_.take();
    if (s.carry)  // stream-ordered after the step that wrote the snapshot
        memory_.copy(s.carry.get(), layout_.snapshot(s, n_tokens / P - 1), layout_.carry_bytes);
}

bool PagePool::keep_step_carries(SeqState& s, int n_tokens) {
    while (static_cast<int>(s.step_carries.size()) < n_tokens + 1) {
        CarrySlot c = carries_.take();
        if (!c && layout_.carry_bytes > 0) return false;
        s.step_carries.push_back(std::move(c));
    }
    return true;
}

void PagePool::cut(SeqState& s, int64_t n_tokens) {
    const int64_t i = n_tokens - s.step_carries_from;
    PEREGRINE_CHECK(s.step_carries_from >= 0 && i >= 0 && n_tokens <= s.n_cached &&
                        i < static_cast<int64_t>(s.step_carries.size()),
                    "a sequence can be cut only within its last speculative step ({} tokens, step from {}, cut at {})",
                    s.n_cached, s.step_carries_from, n_tokens);
    if (layout_.carry_bytes > 0)  // stream-ordered after the step that wrote it
        memory_.copy(s.carry.get(), s.step_carries[static_cast<size_t>(i)].get(), layout_.carry_bytes);
    s.tokens.resize(static_cast<size_t>(n_tokens));
    s.n_cached = n_tokens;
    s.step_carries_from = -1;
}

}  // namespace peregrine
