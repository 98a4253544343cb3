#pragma once
// Sizing the state pages from a GPU's memory, as SGLang's --mem-fraction-static does: weights plus state pages take
// that fraction of the device; a step's activations, graphs and the CUDA context live in the rest.
#include "model/model.h"

#include <cstddef>
#include <string>
#include <vector>

namespace peregrine {

struct DeviceMemoryPlan {
    std::string device;
    double fraction = 0;
    int chunk_tokens = 0;
    size_t total = 0;        // the device's memory
    size_t weights = 0;      // parameters and their tables (all uploaded by the warm-up)
    size_t activations = 0;  // the warm-up step's peak beyond the weights
    size_t graphs = 0;       // decode steps' CUDA graphs, captured by the warm-up
    size_t state = 0;        // for state pages: fraction x total - weights
    size_t left = 0;         // free once the state pages are taken (activations, graphs)
    double warmup_s = 0;
    // Once the state pages are allocated (ready to serve): the device's memory in use, what the pages took, and what
    // the stream-ordered pool keeps mapped beyond the weights (freed activations, kept for the next step).
    size_t in_use = 0, state_allocated = 0, pool_kept = 0;
    std::string describe() const;
};

// Uploads every rank's weights and runs one prefill step of `chunk_tokens` (the largest step) to measure its
// activations, captures the decode steps' CUDA graphs at every batch size the backend graphs, then sizes the state
// pages. Throws, with the figures, when the model does not fit.
DeviceMemoryPlan plan_device_memory(const std::vector<Model*>& ranks, double fraction, int chunk_tokens);

}  // namespace peregrine
