#pragma once
// A small state layout for the kv tests: two layers with windows (of window_tokens; 0: every window page kept),
// one with a ratio-4 compressor (entries and carry), pages of 8 tokens, in host memory.
#include "kv/state_layout.h"

namespace peregrine::test {

inline StateLayout small_layout(int page_tokens = 8, int window_tokens = 0) {
    StateSpec spec;
    spec.window_tokens = window_tokens;
    spec.layers.resize(2);
    for (auto& L : spec.layers) L.window = {fp8_entry_format(64, 64, 32), 1};
    spec.layers[1].comp = {fp4_entry_format(64, 16, true), 4};
    spec.layers[1].index_k = {fp4_entry_format(32, 32, false), 4};
    spec.layers[1].carry_floats = 4 * 64;
    spec.layers[1].index_carry_floats = 4 * 32;
    return make_state_layout(spec, page_tokens);
}

}  // namespace peregrine::test
