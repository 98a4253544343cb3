#pragma once
// The window keys a query row reads, in the official reference's order: plain arithmetic shared by the host
// (window_list, attention_plan.h) and the device's key tables (paged_window_table, paged_tables.cu).
#include "util/host_device.h"

#include <cstdint>

namespace peregrine {

// Entry j of the window list of the query at `pos` (window_list): a position or -1; *n: the list's length. The
// sequence starts this step at `start` with `n_tokens` rows; as_decode: keys_as_decode(seq); positions below `floor`
// are absent.
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

}  // namespace peregrine
