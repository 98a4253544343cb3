#pragma once
// Batch mask filling for the decode loop: one matcher per sequence (nullptr = unconstrained row, left
// untouched), rows of ceil(V/32) words. The async form runs on its own thread so the CPU work overlaps
// the GPU's forward pass; the caller waits on the future just before sampling.
#include <cstdint>
#include <future>
#include <vector>

#include "engine/grammar/matcher.h"

namespace peregrine::grammar {

// Fills bitmasks[i * words .. (i+1) * words) for every non-null matchers[i], rows in parallel.
void fill_next_token_bitmasks(const std::vector<GrammarMatcher*>& matchers, uint32_t* bitmasks, int32_t words);

// Starts the same work on a separate thread. The matchers and the buffer must outlive the future and
// must not be touched until it is ready.
std::future<void> fill_next_token_bitmasks_async(std::vector<GrammarMatcher*> matchers, uint32_t* bitmasks,
                                                 int32_t words);

}  // namespace peregrine::grammar
