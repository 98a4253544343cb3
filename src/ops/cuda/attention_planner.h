#pragma once
// Where an attention block's state entries are and which rows do what, for the one skeleton of
// CudaBackend::attention (attention.cpp), which makes every launch of arithmetic. Two planners answer:
// - the prefill planner (attention_prefill.cpp): prefill, mixed and Exact-numerics steps. The host lists what the
//   step's rows need (positions, the groups they complete, key tables or the page tables to work them out from) and
//   uploads it; the compressor emits only the groups completed.
// - the decode planner (attention_decode.cpp): decode and verify steps under Fast numerics. Everything is worked out
//   on the device from the step's page tables, in sizes that depend only on T, the sequences and the step's cap (the
//   compressor emits a row per token, zeros where no group ends), so a layer uploads nothing and replays as a graph.
// Rows are independent in every kernel, so both planners give the same bits (test_cuda_graphs).
#include "kv/state_layout.h"
#include "ops/weights.h"
#include "tensor/tensor.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace peregrine {
struct ForwardBatch;
}

namespace peregrine::cuda {

class CudaBackend;
struct CudaScratch;
struct PagedSeqs;

// A compressor's output: n pooled rows [n, d] (before the compressor's norm and RoPE, which the attention block
// applies with its own) and each one's group position on the device.
struct Compressed {
    Tensor pooled;
    const int64_t* gpos = nullptr;
    int64_t n = 0;
    int ratio = 0;
    std::vector<int> rows;        // prefill: the row that completed each group
    std::vector<int64_t> group;   // prefill: its group index
    std::shared_ptr<void> keep;
};

// Per row at one compression ratio: its sequence's entries at the end of the step (width) and those the row sees
// (visible), on the device; max bounds every width. The host's lists where the planner has them.
struct Widths {
    const int64_t* width = nullptr;
    const int64_t* visible = nullptr;
    int64_t max = 0;
    std::vector<int64_t> width_h, visible_h;
    std::shared_ptr<void> keep;
};

// Addresses of a section's entries: row t's sequence's entry j at table[base[t] + j]; n in all.
struct EntryTable {
    const uint8_t* const* table = nullptr;
    const int64_t* base = nullptr;
    int64_t n = 0;
    std::vector<int64_t> base_h;  // prefill: the host's list
    std::vector<std::shared_ptr<void>> keep;
};

// Each row's compressed entries to attend to: sel [T, k] (-1: none) and counts [T] on the device.
struct Selection {
    std::shared_ptr<void> sel, count;
    int k = 0;
};

// The level-1 candidate mask an indexer reads: [T, stride] bytes and the widths it was made with.
struct CandidateMask {
    const uint8_t* mask = nullptr;
    const int64_t* width = nullptr;
    int64_t stride = 0;
};

// The keys of sparse attention: per row its window keys' addresses [T, W] and their count, and its sequence's
// compressed entries (with key_rows, the rows they were decoded to: 2 x dim bytes each).
struct KeyTables {
    const uint8_t* const* win = nullptr;
    const int32_t* nwin = nullptr;
    EntryTable comp;
    const uint8_t* comp_rows = nullptr;
    bool key_rows = false;
    std::vector<std::shared_ptr<void>> keep;
};

// The indexer's query rows and head weights, ready to score.
struct IndexQueries {
    const float* q = nullptr;
    const float* w = nullptr;
    int heads = 0, dim = 0;
};

// Buffers that later layers of the step read.
enum StepSlot { kSlotTopk, kSlotTopkCount, kSlotMask };

class AttentionPlanner {
public:
    virtual ~AttentionPlanner() = default;
    // Each row's position [T] on the device.
    virtual const int64_t* positions() = 0;
    // Row t of x into the entry of `sec` at its position.
    virtual void store_rows(const Tensor& x, const StateSection& sec) = 0;
    // The step's page tables where store_rows works from them (a kernel may then store rows itself), else null.
    virtual const PagedSeqs* paged_rows() { return nullptr; }
    // The compressor `cw` over the step's rows x (its carry at carry_offset in each sequence's carry).
    virtual Compressed compress(const CompressorWeight& cw, size_t carry_offset, const Tensor& x) = 0;
    // Row i of x (c's rows) into the entry of its group in `sec`.
    virtual void store_groups(const Tensor& x, const StateSection& sec, const Compressed& c) = 0;
    // The widths at `ratio` (on_device: the device arrays too).
    virtual Widths widths(int ratio, bool on_device) = 0;
    // Each row's sequence's entries of `sec` up to its width.
    virtual EntryTable entries(const StateSection& sec, int ratio, const Widths& w) = 0;

    // The indexer's score rows are taken in chunks of this many (stride: a row's length).
    virtual int64_t chunk_rows(int64_t stride) = 0;
    // The scores of rows [r0, r1) against their keys (format kf) into scores [r1 - r0, stride].
    virtual void score(const IndexQueries& q, int64_t r0, int64_t r1, const Widths& w, const EntryTable& keys,
                       const EntryFormat& kf, float* scores) = 0;
    // A buffer that later layers of the step read.
    virtual std::shared_ptr<void> step_buffer(StepSlot slot, size_t bytes) = 0;
    // The candidate source's mask of `stride` bytes a row, published in the step's scratch.
    virtual uint8_t* make_candidate_mask(int ratio, const Widths& w, int64_t stride) = 0;
    // The mask a candidate user at `ratio` (widths w) reads.
    virtual CandidateMask candidate_mask(int ratio, const Widths& w) = 0;
    // Every visible entry (a layer that attends to all of them).
    virtual Selection all_entries(int ratio, const Widths& w) = 0;
    // The window `win` and, with k > 0 selected entries a row, the compressed entries of `comp` (format comp_format).
    virtual KeyTables keys(const StateSection& win, const StateSection& comp, const EntryFormat& comp_format,
                           int ratio, const Widths& w, int k) = 0;
};

std::unique_ptr<AttentionPlanner> prefill_planner(CudaBackend& b, ForwardBatch& batch, CudaScratch& scratch);
// scratch: a decode step's (begin_decode).
std::unique_ptr<AttentionPlanner> decode_planner(CudaBackend& b, CudaScratch& scratch, int64_t T);

}  // namespace peregrine::cuda
