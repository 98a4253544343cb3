#pragma once
// Per-sequence model state kept in fixed-size pages, so that a prefix's state can be shared between
// sequences and cached (the kv layer owns the pages; the backends read and write them through this layout).
//
// Everything a layer keeps per token (sliding-window K=V) or per compressed group (compressed KV latents,
// indexer keys) lives in the pages of the tokens it belongs to, packed in the release's byte formats
// (state_format.h). The only state not tied to a token is the compressors' carry-over (partial groups); it
// lives in SeqState::carry (or, for a backend that keeps it itself, in SeqState::backend_carry) and is also
// copied into each page when the page's last token is processed, so a sequence can resume from any page
// boundary.
#include "ops/state_format.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace peregrine {

// Entries of one kind for one layer inside a page.
struct StateSection {
    size_t offset = 0;        // bytes from the page start
    size_t entry_bytes = 0;   // bytes per entry (format.bytes)
    EntryFormat format;       // how an entry's values are packed (state_format.h)
    int per_entry_tokens = 1; // tokens per entry (1 for window K=V, the ratio for compressed entries)
    int entries_per_page = 0;
    bool present() const { return entry_bytes != 0; }
};

struct LayerStateLayout {
    StateSection window;   // K=V of the sliding window, one per token
    StateSection comp;     // compressed KV latents, one per group (kv-source / compressing layers)
    StateSection index_k;  // indexer keys, one per group (index-key owners)
    size_t carry_offset = 0, carry_bytes = 0;  // compressor carry-over inside SeqState::carry
    size_t index_carry_offset = 0;             // V4: the indexer's own compressor carry-over
};

struct StateLayout {
    int page_tokens = 0;
    size_t page_bytes = 0;
    size_t carry_bytes = 0;       // per sequence
    size_t snapshot_offset = 0;   // where a page keeps the carry as of its last token
    std::vector<LayerStateLayout> layers;

    // Address of entry `index` of a section, given the sequence's page table.
    template <typename T>
    T* entry(uint8_t* pool, const std::vector<int32_t>& pages, const StateSection& s, int64_t index) const {
        int64_t page, slot;
        if (s.per_entry_tokens <= page_tokens) {
            int64_t per_page = page_tokens / s.per_entry_tokens;
            page = index / per_page;
            slot = index % per_page;
        } else {  // an entry spanning several pages lives in the page of its last token
            page = ((index + 1) * s.per_entry_tokens - 1) / page_tokens;
            slot = 0;
        }
        return reinterpret_cast<T*>(pool + static_cast<size_t>(pages.at(static_cast<size_t>(page))) * page_bytes +
                                    s.offset + static_cast<size_t>(slot) * s.entry_bytes);
    }
    uint8_t* page_ptr(uint8_t* pool, int32_t page) const { return pool + static_cast<size_t>(page) * page_bytes; }
    int64_t pages_for(int64_t n_tokens) const { return (n_tokens + page_tokens - 1) / page_tokens; }
};

// A backend's own copy of a sequence's carry-over (the CUDA backend keeps it in device memory, so that a step
// copies nothing each way); Model::init_state and Model::restore_state (re)load it through
// Backend::load_carry. A copied SeqState does not share it: the copy starts without one and may only go on
// from its host carry while that is still current (host_stale false).
struct BackendCarry {
    std::shared_ptr<void> p;
    bool host_stale = false;  // the backend's copy has moved past SeqState::carry
    BackendCarry() = default;
    BackendCarry(const BackendCarry& o) : host_stale(o.host_stale) {}
    BackendCarry& operator=(const BackendCarry& o) {
        if (this != &o) {
            p.reset();
            host_stale = o.host_stale;
        }
        return *this;
    }
    BackendCarry(BackendCarry&&) noexcept = default;
    BackendCarry& operator=(BackendCarry&&) noexcept = default;
};

// One sequence's state: its page table into a pool, token history and live carry-over.
struct SeqState {
    uint8_t* pool = nullptr;        // base of the page pool the ids refer to
    std::vector<int32_t> pages;     // page i holds tokens [i*page_tokens, (i+1)*page_tokens)
    std::vector<int32_t> tokens;    // every token id fed so far (engram history, prefix keys)
    int64_t n_cached = 0;           // tokens whose state is in the pages
    std::vector<uint8_t> carry;     // compressor partial groups (StateLayout::carry_bytes)
    BackendCarry backend_carry;     // where a backend keeps the live carry instead (see BackendCarry)
};

}  // namespace peregrine
