#pragma once
// State-entry addresses from a page table and the window order, as plain arithmetic shared by the device
// kernels (paged_tables.cu) and host code: the same results as StateLayout::entry and window_list
// (attention_plan.cpp), checked against them in tests/ops/test_paged_address.cpp.
#include "kv/sequence_state.h"
#include "util/host_device.h"

#include <cstdint>

namespace peregrine::cuda {

struct PagedSection {  // a StateSection of one layer
    int64_t offset = 0, entry_bytes = 0;
    int per_entry_tokens = 1;
    int table = kHistoryPages;  // the page table it lives in
};

// A sequence's fields in PagedSeqs::seq: its history pages' base address, its first row in the step's page rows,
// start_pos, n_tokens, its window pages' base address, its window floor (BatchSeq::window_floor), 1 where its rows
// list their keys as decode steps do (keys_as_decode, attention_plan.h).
constexpr int kSeqFields = 7;
PEREGRINE_HD int64_t seq_table_base(const int64_t* m, int table) { return table == kWindowPages ? m[4] : m[0]; }

// Byte offset from its table's base of entry `index` of `sec`, given the sequence's page rows (kPageTables ids
// each) and the table's page size.
PEREGRINE_HD int64_t paged_entry_offset(const int32_t* rows, int page_tokens, int64_t page_bytes,
                                        const PagedSection& sec, int64_t index) {
    int64_t page, slot;
    if (sec.per_entry_tokens <= page_tokens) {
        const int64_t per_page = page_tokens / sec.per_entry_tokens;
        page = index / per_page;
        slot = index % per_page;
    } else {  // an entry spanning several pages lives in the page of its last token
        page = ((index + 1) * sec.per_entry_tokens - 1) / page_tokens;
        slot = 0;
    }
    return static_cast<int64_t>(rows[page * kPageTables + sec.table]) * page_bytes + sec.offset +
           slot * sec.entry_bytes;
}

// Entry j of window_list(seq, pos, W, ring_before_full): a position or -1; *n: the list's length. The sequence
// starts this step at `start` with `n_tokens` rows; as_decode: keys_as_decode(seq); positions below `floor` are
// absent.
PEREGRINE_HD int64_t window_position(int64_t start, int64_t n_tokens, bool as_decode, int64_t floor, int64_t pos,
                                     int W, bool ring_before_full, int j, int* n) {
    const int64_t lo = pos - W + 1 > 0 ? pos - W + 1 : 0;
    int64_t at;
    if (start == 0 && (!as_decode || pos == 0)) {  // one-shot prefill (as decoding: position 0's one-token one)
        const int64_t len = as_decode ? 1 : n_tokens < W ? n_tokens : W;
        *n = static_cast<int>(len);
        at = j < len && lo + j <= pos ? lo + j : -1;
    } else if (*n = W; as_decode && (ring_before_full || pos >= W - 1)) {
        // decode (and the decode steps the rows stand for): the ring, oldest slot first
        const int64_t slot = (pos % W + 1 + j) % W;
        at = slot <= pos ? pos - ((pos - slot) % W) : -1;
    } else {
        at = lo + j <= pos ? lo + j : -1;  // chunked prefill: oldest first, padded
    }
    return at >= floor ? at : -1;
}

// The lowest window position a sequence's rows see this step: max(0, start - W + 1, floor).
PEREGRINE_HD int64_t window_lowest(int64_t start, int64_t floor, int W) {
    const int64_t lo = start - W + 1 > 0 ? start - W + 1 : 0;
    return lo > floor ? lo : floor;
}

}  // namespace peregrine::cuda
