#pragma once
// One sequence's state: its page table into a pool, its token history and its compressor carry-over.
#include <cstdint>
#include <vector>

namespace peregrine {

class CarryPool;

// A sequence's carry-over slot in state memory (StateLayout::carry_bytes), back to its pool when dropped; moves,
// never copies (two sequences never share a carry).
class CarrySlot {
public:
    CarrySlot() = default;
    CarrySlot(CarryPool* pool, uint8_t* p) : pool_(pool), p_(p) {}
    CarrySlot(CarrySlot&& o) noexcept : pool_(o.pool_), p_(o.p_) { o.pool_ = nullptr, o.p_ = nullptr; }
    CarrySlot& operator=(CarrySlot&& o) noexcept;
    CarrySlot(const CarrySlot&) = delete;
    CarrySlot& operator=(const CarrySlot&) = delete;
    ~CarrySlot() { reset(); }
    void reset();
    uint8_t* get() const { return p_; }
    explicit operator bool() const { return p_ != nullptr; }

private:
    CarryPool* pool_ = nullptr;
    uint8_t* p_ = nullptr;
};

struct SeqState {
    uint8_t* pool = nullptr;        // base of the page pool the ids refer to
    std::vector<int32_t> pages;     // page i holds tokens [i*page_tokens, (i+1)*page_tokens)
    std::vector<int32_t> tokens;    // every token id fed so far (engram history, prefix keys)
    int64_t n_cached = 0;           // tokens whose state is in the pages
    CarrySlot carry;                // compressor partial groups, in state memory (PagePool::init / restore)
};

}  // namespace peregrine
