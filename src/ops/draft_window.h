#pragma once
// The stored window keys a drafter's row reads, as positions: plain arithmetic shared by the host
// (draft_window_keys, attention_plan.h) and the device's key lists (paged_draft_keys, paged_tables.cu).
#include "util/host_device.h"

#include <cstdint>

namespace peregrine {

// The stored window keys of a draft row at position `row_pos` after a sequence's last fed position `pos`, at or above
// the window floor, each passed to f in order: a DSpark block's (chain false) the whole window of pos, its ring
// listed by slot (slot k holds the latest position <= pos with position % W == k); an MTP chain's row its own
// window's, oldest first (as the one-shot prefill the layer was trained with lists them), from floor + 1 (the MTP
// layer's first entry after a gap, or at position 0, reads a hidden state from before it).
template <class F>
PEREGRINE_HD void for_each_draft_window_key(int64_t pos, int64_t row_pos, int W, int64_t floor, bool chain, F&& f) {
    if (chain) {
        for (int64_t p = floor + 1 > row_pos - W + 1 ? floor + 1 : row_pos - W + 1; p <= pos; ++p) f(p);
        return;
    }
    const int64_t n = W < pos + 1 ? W : pos + 1;
    for (int64_t k = 0; k < n; ++k) {
        const int64_t p = pos - ((pos - k) % W + W) % W;
        if (p >= floor) f(p);
    }
}

}  // namespace peregrine
