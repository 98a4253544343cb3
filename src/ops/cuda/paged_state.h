#pragma once
// The step's page tables on the device (one packed upload), for the kernels that work out state-entry
// addresses themselves (paged_tables.cu).
#include "ops/backend.h"
#include "ops/cuda/kernels.h"
#include "kv/sequence_state.h"
#include "kv/state_layout.h"

#include <algorithm>
#include <memory>
#include <vector>

namespace peregrine::cuda {

struct PagedStep {
    std::shared_ptr<void> keep;  // the device copy PagedSeqs points into
    PagedSeqs seqs;
};

// Bytes of the packed tables of S sequences, T rows and n_pages rows of pages.
size_t paged_step_bytes(int64_t S, int64_t T, int64_t n_pages);

// Page tables (the rows of pages covering each sequence's tokens up to the end of the step), per-sequence table
// bases, start and token count, per-row sequence and position; with `carries`, each sequence's compressor carry address
// and each row's speculative carry slot (PagedSeqs::row_step).
// Into fresh device memory, or into `into` of into_bytes (the pages come last, so the other arrays keep their
// offsets from step to step: a CUDA graph's fixed buffer).
PagedStep upload_paged_step(const StateLayout& layout, const ForwardBatch& batch,
                            const std::vector<int64_t>* carries = nullptr, std::shared_ptr<void> into = nullptr,
                            size_t into_bytes = 0);

inline PagedSection paged_section(const StateSection& s) {
    return {static_cast<int64_t>(s.offset), static_cast<int64_t>(s.entry_bytes), s.per_entry_tokens, s.table};
}

// An address table on the device: `table` entries (kept alive by `keep`).
struct AddressTable {
    std::shared_ptr<void> keep;
    const uint8_t** table = nullptr;
    int64_t n = 0;
};

// Addresses of each sequence's compressed entries of `sec` (the (start_pos + n_tokens) / ratio at the end of
// the step) back to back; rowbase[t] (T entries) is where row t's sequence starts. Sequences without tokens
// this step get none.
AddressTable device_entry_table(const PagedSeqs& p, const ForwardBatch& batch, const StateSection& sec, int ratio,
                                std::vector<int64_t>& rowbase);

// Per row the window keys' addresses [T, W] in window_list's order (null: none) and their count nwin [T].
struct WindowTable {
    AddressTable win;
    std::shared_ptr<void> nwin_keep;
    int32_t* nwin = nullptr;
};
WindowTable device_window_table(const PagedSeqs& p, const StateSection& sec, int64_t T, int W,
                                bool ring_before_full);

// Room for T rows' tables cap wide (decode steps: row t's sequence starts at t * cap, paged_entry_table's
// seq_base = DecodeRows::base) filled by paged_entry_table with entries of `sec`.
AddressTable decode_entry_table(const PagedSeqs& p, const StateSection& sec, int ratio, const int64_t* base, int64_t T,
                                int64_t cap);

// How many window positions sequence s's rows can see this step (device_window_rows decodes them).
inline int64_t window_rows_of(const BatchSeq& s, int W) {
    const int64_t end = s.start_pos + s.n_tokens;
    return s.n_tokens > 0 ? std::max<int64_t>(0, end - window_lowest(s.start_pos, s.window_floor, W)) : 0;
}
// The window entries a step's rows can see (per sequence from max(0, start_pos - W + 1) to the step's end: `src`,
// back to back), decoded once to bf16 rows of 2 x dim bytes (`rows`, in src's order), and the rows' window lists
// as pointers into them (device_window_table's order and counts; null: none).
struct WindowRows {
    AddressTable src;
    std::shared_ptr<void> rows;
    WindowTable table;
};
WindowRows device_window_rows(const PagedSeqs& p, const ForwardBatch& batch, const StateSection& sec, int W,
                              bool ring_before_full);

}  // namespace peregrine::cuda
