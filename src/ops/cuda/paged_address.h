#pragma once
// State-entry addresses from a page table and the window order, as plain arithmetic shared by the device
// kernels (paged_tables.cu) and host code: the same results as StateLayout::entry, checked against it in
// tests/ops/test_paged_address.cpp (the window order: ops/window_order.h).
#include "kv/sequence_state.h"
#include "ops/window_order.h"
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

}  // namespace peregrine::cuda
