#pragma once
// State memory for sequences: fixed-size pages of each page table (sequence_state.h) carved from one allocation
// per table, and a carry-over slot per sequence. The pool sets a sequence's state up (fresh, or resumed at a page
// boundary from the page's snapshot) and takes its pages and slot back.
#include "kv/sequence_state.h"
#include "kv/state_layout.h"
#include "kv/state_memory.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

namespace peregrine {

// Carry-over slots of one size, allocated in chunks as sequences need them and reused.
class CarryPool {
public:
    CarryPool(StateMemory& memory, size_t slot_bytes) : memory_(memory), slot_bytes_(slot_bytes) {}
    ~CarryPool();
    CarryPool(const CarryPool&) = delete;
    CarryPool& operator=(const CarryPool&) = delete;
    // A slot (empty when slots are 0 bytes); its contents are undefined.
    CarrySlot take();

private:
    friend class CarrySlot;
    void give(uint8_t* p) { free_.push_back(p); }
    static constexpr size_t kChunk = 16;
    StateMemory& memory_;
    size_t slot_bytes_;
    std::vector<uint8_t*> chunks_, free_;
};

// Each table has its own number of pages. A sequence takes a row of pages (one of each table) per page_tokens
// tokens, and gives the window pages of rows it no longer reads back on their own (drop_window), so the window
// table can be much smaller than the history table.
class PagePool {
public:
    using Pages = std::array<int64_t, kPageTables>;  // pages of each table
    PagePool(StateMemory& memory, const StateLayout& layout, Pages pages);
    // n_rows pages in each table: every row can keep its window page.
    PagePool(StateMemory& memory, const StateLayout& layout, int64_t n_rows)
        : PagePool(memory, layout, Pages{n_rows, n_rows}) {}
    ~PagePool();
    PagePool(const PagePool&) = delete;
    PagePool& operator=(const PagePool&) = delete;

    // Pages of each table that fit in `bytes` when at most `window_pages` window pages are needed at once (never
    // more window pages than history pages).
    static Pages pages_for_budget(const StateLayout& layout, int64_t bytes, int64_t window_pages);

    // Table t's pages: page id i at base(t) + i * layout().page_bytes[t].
    uint8_t* base(PageTable t) const { return base_[t]; }
    int64_t capacity(PageTable t = kHistoryPages) const { return capacity_[t]; }
    int64_t free_pages(PageTable t) const { return static_cast<int64_t>(free_[t].size()); }
    // Rows that can be taken now (the scarcer table's free pages).
    int64_t free_rows() const { return std::min(free_pages(kHistoryPages), free_pages(kWindowPages)); }
    int64_t used_pages(PageTable t = kHistoryPages) const { return capacity(t) - free_pages(t); }
    const StateLayout& layout() const { return layout_; }
    StateMemory& memory() { return memory_; }

    // A free row of pages, or a row of -1 when the pool is exhausted.
    PageRow alloc();
    // A free page of table t, or -1.
    int32_t alloc_page(PageTable t);
    // The row's pages (those held: not -1) back to the pool.
    void free(const PageRow& row);
    // Grows a sequence's page tables to cover n_tokens; false (and nothing allocated) if the pool is short.
    bool reserve(SeqState& s, int64_t n_tokens);
    // The window pages of the sequence's rows [from_row, to_row) that it holds back to the pool.
    void drop_window(SeqState& s, int64_t from_row, int64_t to_row);
    // Returns all of a sequence's pages and its carry slot.
    void release(SeqState& s);

    // A fresh sequence: no tokens, a fresh carry (its pages are the caller's).
    void init(SeqState& s);
    // The sequence as it was after its first n_tokens tokens (a page boundary: the carry from that page's
    // snapshot); its pages and token history must cover them.
    void restore(SeqState& s, int64_t n_tokens);
    // Carry slots for a speculative step of up to n_tokens (SeqState::step_carries); false if state memory is short.
    bool keep_step_carries(SeqState& s, int n_tokens);
    // The sequence as it was after its first n_tokens tokens, a position of its last (speculative) step: the carry
    // as of there, the token history cut. What the step wrote beyond is rewritten when those positions are fed again.
    void cut(SeqState& s, int64_t n_tokens);

private:
    void attach(SeqState& s) const;  // the sequence's table bases: this pool's
    StateMemory& memory_;
    StateLayout layout_;
    Pages capacity_;
    std::array<uint8_t*, kPageTables> base_{};
    std::array<std::vector<int32_t>, kPageTables> free_;
    CarryPool carries_;
    std::vector<uint8_t> initial_carry_;
};

}  // namespace peregrine
