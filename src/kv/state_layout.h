#pragma once
// Where per-sequence state lives in fixed-size pages, so that a prefix's state can be shared between sequences
// and cached. A model variant says what each layer keeps (StateSpec); make_state_layout places it in the pages of
// two tables (sequence_state.h): every layer's window K=V in the window table's pages, the rest in the history's.
//
// Everything a layer keeps per token (sliding-window K=V) or per compressed group (compressed KV latents, indexer
// keys) lives in the pages of the tokens it belongs to, packed in the release's byte formats (entry_format.h).
// The only state not tied to a token is the compressors' carry-over (partial groups): it lives in a slot of state
// memory per sequence (SeqState::carry), and each page also keeps a copy as of its last token (the snapshot), so
// that a sequence can resume from any page boundary.
#include "kv/entry_format.h"
#include "kv/sequence_state.h"

#include <cstddef>
#include "util/error.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace peregrine {

// ---- what a model keeps (its variant says)

// Entries of one kind: their byte format and how many tokens each covers (0: the layer keeps none).
struct SectionSpec {
    EntryFormat format;
    int per_entry_tokens = 0;
    bool present() const { return per_entry_tokens > 0; }
};

// One layer's state. A compressor's carry-over holds `floats` pending values, then as many gate scores.
struct LayerStateSpec {
    SectionSpec window;             // K=V of the sliding window, one per token
    SectionSpec comp;               // compressed KV latents, one per group
    SectionSpec index_k;            // indexer keys, one per group
    int64_t carry_floats = 0;       // the layer's compressor
    int64_t index_carry_floats = 0; // its indexer's own compressor (V4)
};

// The backbone's layers, then the draft stages'.
struct StateSpec {
    std::vector<LayerStateSpec> layers;
    int window_tokens = 0;  // a query reads the window entries of its last window_tokens positions (0: of all)
    int64_t hidden_floats = 0;  // V4's MTP layer: the backbone's final hidden state at the last position, in the carry
};

// ---- where it is

// Entries of one kind for one layer inside a page of its table.
struct StateSection {
    PageTable table = kHistoryPages;
    size_t offset = 0;        // bytes from the page start
    size_t entry_bytes = 0;   // bytes per entry (format.bytes)
    EntryFormat format;       // how an entry's values are packed
    int per_entry_tokens = 1; // tokens per entry (1 for window K=V, the ratio for compressed entries)
    int entries_per_page = 0;
    bool present() const { return entry_bytes != 0; }
};

struct LayerStateLayout {
    StateSection window, comp, index_k;
    size_t carry_offset = 0, carry_bytes = 0;              // compressor carry-over inside a sequence's carry
    size_t index_carry_offset = 0, index_carry_bytes = 0;  // the indexer's own compressor's (V4)
};

struct StateLayout {
    int page_tokens = 0;
    int window_tokens = 0;  // StateSpec::window_tokens
    std::array<size_t, kPageTables> page_bytes{};  // a page of each table
    size_t carry_bytes = 0;       // per sequence
    size_t hidden_offset = 0, hidden_bytes = 0;  // StateSpec::hidden_floats inside the carry (fp32)
    size_t snapshot_offset = 0;   // where a history page keeps the carry as of its last token
    std::vector<LayerStateLayout> layers;

    // What page_tokens tokens cost: a page of each table.
    size_t row_bytes() const { return page_bytes[kHistoryPages] + page_bytes[kWindowPages]; }

    // Address of entry `index` of a section of a sequence.
    template <typename T>
    T* entry(const SeqState& st, const StateSection& s, int64_t index) const {
        int64_t page, slot;
        if (s.per_entry_tokens <= page_tokens) {
            int64_t per_page = page_tokens / s.per_entry_tokens;
            page = index / per_page;
            slot = index % per_page;
        } else {  // an entry spanning several pages lives in the page of its last token
            page = ((index + 1) * s.per_entry_tokens - 1) / page_tokens;
            slot = 0;
        }
        return reinterpret_cast<T*>(page_ptr(st, s.table, page) + s.offset + static_cast<size_t>(slot) * s.entry_bytes);
    }
    // Page `row` of table t of a sequence.
    uint8_t* page_ptr(const SeqState& st, PageTable t, int64_t row) const {
        const int32_t id = st.pages.at(static_cast<size_t>(row))[t];
        PEREGRINE_CHECK(id >= 0, "page {} of table {} is not held", row, static_cast<int>(t));
        return st.pool[t] + static_cast<size_t>(id) * page_bytes[t];
    }
    // Where the snapshot of page row `row` (the carry after its last token) is.
    uint8_t* snapshot(const SeqState& st, int64_t row) const {
        return page_ptr(st, kHistoryPages, row) + snapshot_offset;
    }
    int64_t pages_for(int64_t n_tokens) const { return (n_tokens + page_tokens - 1) / page_tokens; }
    // The first row whose window entries a query at `pos` (or later) reads: the window pages of the rows before
    // it are never read again.
    int64_t window_first_row(int64_t pos) const {
        return window_tokens > 0 ? std::max<int64_t>(0, pos - window_tokens + 1) / page_tokens : 0;
    }
    // Rows before a page boundary whose window pages a sequence resumed there needs (-1: all of them).
    int64_t window_rows() const { return window_tokens > 0 ? pages_for(window_tokens - 1) : -1; }
    // A fresh sequence's carry (carry_bytes): pending values 0, gate scores -inf (an empty slot never wins).
    std::vector<uint8_t> initial_carry() const;
};

// Places every layer's sections in the pages of `page_tokens` tokens of their tables (whole entries per page; an
// entry spanning pages lives in the page of its last token), the snapshot after the history's; fails when a ratio
// and the page size do not divide one another.
StateLayout make_state_layout(const StateSpec& spec, int page_tokens);

}  // namespace peregrine
