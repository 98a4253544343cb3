#pragma once
// A pool of fixed-size state pages carved from one allocation, sized from a memory budget.
#include "ops/backend.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace peregrine {

class PagePool {
public:
    // Pages live in memory from `backend` (device memory for GPU backends).
    PagePool(Backend& backend, const StateLayout& layout, int64_t n_pages);
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

    // A free page id, or -1 when the pool is exhausted.
    int32_t alloc();
    void free(int32_t page);
    // Grows a sequence's page table to cover n_tokens; false (and nothing allocated) if the pool is short.
    bool reserve(SeqState& s, int64_t n_tokens);
    // Returns all of a sequence's pages.
    void release(SeqState& s);

private:
    Backend& backend_;
    StateLayout layout_;
    size_t n_pages_;
    uint8_t* base_ = nullptr;
    std::vector<int32_t> free_;
};

}  // namespace peregrine
