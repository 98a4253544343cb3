#pragma once
// State-entry addresses from a page table and the window order, as plain arithmetic shared by the device
// kernels (paged_tables.cu) and host code: the same results as StateLayout::entry and window_list
// (attention_plan.cpp), checked against them in tests/ops/test_paged_address.cpp.
#include "util/host_device.h"

#include <cstdint>

namespace peregrine::cuda {

struct PagedSection {  // a StateSection of one layer
    int64_t offset = 0, entry_bytes = 0;
    int per_entry_tokens = 1;
};

// Byte offset from the pool base of entry `index` of `sec`, given the sequence's page table.
PEREGRINE_HD int64_t paged_entry_offset(const int32_t* pages, int page_tokens, int64_t page_bytes,
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
    return static_cast<int64_t>(pages[page]) * page_bytes + sec.offset + slot * sec.entry_bytes;
}

// Entry j of window_list(seq, pos, W, ring_before_full): a position or -1; *n: the list's length. The sequence
// starts this step at `start` with `n_tokens` rows.
PEREGRINE_HD int64_t window_position(int64_t start, int64_t n_tokens, int64_t pos, int W, bool ring_before_full, int j,
                                     int* n) {
    const int64_t lo = pos - W + 1 > 0 ? pos - W + 1 : 0;
    if (start == 0) {  // one-shot prefill: the query's window, oldest first
        const int64_t len = n_tokens < W ? n_tokens : W;
        *n = static_cast<int>(len);
        return j < len && lo + j <= pos ? lo + j : -1;
    }
    *n = W;
    if (n_tokens == 1 && (ring_before_full || pos >= W - 1)) {  // decode: the ring from its oldest slot
        const int64_t slot = (pos % W + 1 + j) % W;
        return slot <= pos ? pos - ((pos - slot) % W) : -1;
    }
    return lo + j <= pos ? lo + j : -1;  // chunked prefill: oldest first, padded
}

}  // namespace peregrine::cuda
