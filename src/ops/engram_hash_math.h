#pragma once
// The engram n-gram hash of one position, shared by the model's host hashing (model/engram_hash.cpp) and the
// CUDA backend's kernel for deferred ids, so that both give the reference's row ids.
#include "util/host_device.h"

#include <cstdint>

namespace peregrine {

// Row ids out[(n - 2) * n_heads + head] for n-gram sizes n = 2..max_ngram from the compressed ids of the
// position's window: comp[0] its own token, comp[k] the token k before it (the pad id before the sequence).
// The products fit int64 (the multipliers are bounded for that) and are non-negative, so % is the reference's.
PEREGRINE_HD void engram_hash_window(const int64_t* comp, int max_ngram, int n_heads, const int64_t* mult,
                                            const int64_t* primes, const int64_t* offsets, int64_t* out) {
    int64_t rolling = comp[0] * mult[0];
    for (int k = 1; k < max_ngram; ++k) {
        rolling ^= comp[k] * mult[k];
        for (int h = 0; h < n_heads; ++h) {
            const int c = (k - 1) * n_heads + h;
            out[c] = rolling % primes[c] + offsets[c];
        }
    }
}

}  // namespace peregrine
