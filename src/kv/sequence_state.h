#pragma once
// One sequence's state: its page tables into a pool, its token history and its compressor carry-over.
#include <array>
#include <cstdint>
#include <vector>

namespace peregrine {

// A sequence's state lives in two page tables (StateLayout places each section in one): the sliding window's K=V,
// which only a sequence's last tokens read, so that its old pages can go back to the pool on their own; and the
// history (compressed entries, indexer keys, the carry snapshot), which a sequence keeps whole.
enum PageTable : int { kHistoryPages = 0, kWindowPages = 1, kPageTables = 2 };

// Row i of a sequence's page tables: in each table, the page holding tokens [i*page_tokens, (i+1)*page_tokens)
// (-1: none).
using PageRow = std::array<int32_t, kPageTables>;

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
    std::array<uint8_t*, kPageTables> pool{};  // each table's pages in the pool the ids refer to
    std::vector<PageRow> pages;     // row i: the pages holding tokens [i*page_tokens, (i+1)*page_tokens)
    std::vector<int32_t> tokens;    // every token id fed so far (engram history, prefix keys)
    int64_t n_cached = 0;           // tokens whose state is in the pages
    int64_t window_floor = 0;       // window K=V below it was never computed (encoder SWA bounded replay)
    CarrySlot carry;                // compressor partial groups, in state memory (PagePool::init / restore)
    // Speculative steps (BatchSeq::speculative): the carry as of each position of the last step, step_carries[i]
    // after its first i tokens (from position step_carries_from), written by the backend, so that the sequence can
    // be cut back to any of them when drafts are rejected (PagePool::cut).
    std::vector<CarrySlot> step_carries;
    int64_t step_carries_from = -1;
};

}  // namespace peregrine
