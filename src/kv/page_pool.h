#pragma once
// State memory for sequences: fixed-size pages carved from one allocation, and a carry-over slot per sequence.
// The pool sets a sequence's state up (fresh, or resumed at a page boundary from the page's snapshot) and takes
// its pages and slot back.
#include "kv/sequence_state.h"
#include "kv/state_layout.h"
#include "kv/state_memory.h"

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

class PagePool {
public:
    PagePool(StateMemory& memory, const StateLayout& layout, int64_t n_pages);
    ~PagePool();
    PagePool(const PagePool&) = delete;
    PagePool& operator=(const PagePool&) = delete;

    // Pages that fit in `bytes` for this layout.
    static int64_t pages_for_budget(const StateLayout& layout, int64_t bytes);

    uint8_t* base() const { return base_; }
    int64_t capacity() const { return static_cast<int64_t>(n_pages_); }
    int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
    int64_t used_pages() const { return capacity() - free_pages(); }
    const StateLayout& layout() const { return layout_; }
    StateMemory& memory() { return memory_; }

    // A free page id, or -1 when the pool is exhausted.
    int32_t alloc();
    void free(int32_t page);
    // Grows a sequence's page table to cover n_tokens; false (and nothing allocated) if the pool is short.
    bool reserve(SeqState& s, int64_t n_tokens);
    // Returns all of a sequence's pages and its carry slot.
    void release(SeqState& s);

    // A fresh sequence: no tokens, a fresh carry (its pages are the caller's).
    void init(SeqState& s);
    // The sequence as it was after its first n_tokens tokens (a page boundary: the carry from that page's
    // snapshot); its pages and token history must cover them.
    void restore(SeqState& s, int64_t n_tokens);

private:
    StateMemory& memory_;
    StateLayout layout_;
    size_t n_pages_;
    uint8_t* base_ = nullptr;
    std::vector<int32_t> free_;
    CarryPool carries_;
    std::vector<uint8_t> initial_carry_;
};

}  // namespace peregrine
