#pragma once
// The step's page tables on the device (one packed upload), for the kernels that work out state-entry
// addresses themselves (paged_tables.cu).
#include "ops/backend.h"
#include "ops/cuda/kernels.h"
#include "ops/state.h"

#include <memory>

namespace peregrine::cuda {

struct PagedStep {
    std::shared_ptr<void> keep;  // the device copy PagedSeqs points into
    PagedSeqs seqs;
};

// Page tables (the pages covering each sequence's tokens up to the end of the step), per-sequence pool base,
// start and token count, per-row sequence and position.
PagedStep upload_paged_step(const StateLayout& layout, const ForwardBatch& batch);

inline PagedSection paged_section(const StateSection& s) {
    return {static_cast<int64_t>(s.offset), static_cast<int64_t>(s.entry_bytes), s.per_entry_tokens};
}

}  // namespace peregrine::cuda
