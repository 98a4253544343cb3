// The decode planner (attention_planner.h): decode steps (one token per sequence, row t of sequence t) and verify
// steps (a few tokens per sequence: its token and drafts, kept or cut back after) under Fast numerics. Every table
// and list is worked out on the device from the step's page tables (uploaded once per step by begin_decode, with each
// sequence's compressor carry address and its speculative carry slots), in sizes that depend only on T, the number of
// sequences S and cap (a bound on every row's position + 1): the compressor's outputs are T rows (zeros for rows that
// end no group, which store nothing), the indexer's and the compressed entries' tables cap / ratio wide per
// sequence. So a layer's block uploads nothing and launches the same kernels for every step of the same T, S and
// cap, and a run of layers is captured as one CUDA graph (layers_graph, cuda_graphs.cpp).
#include "ops/cuda/attention_planner.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/launch_stream.h"
#include "ops/cuda/paged_state.h"
#include "util/error.h"

#include <cuda_runtime.h>

#include <algorithm>

namespace peregrine::cuda {

namespace {
// The most tokens a sequence feeds in a decode-form step: more, and the prefill planner's kernels (tensor-core index
// scores, the compressor's tokens in parallel) pay.
constexpr int kDecodeFormTokens = 8;

// A decode step, or a verify step: each sequence's rows together and in order, a token or a few drafted ones.
bool decode_form(const ForwardBatch& batch) {
    if (batch.mode == BatchMode::decode) return true;  // row t is sequence t's one token (Model::forward checks it)
    int row = 0;
    for (const BatchSeq& s : batch.seqs) {
        if (s.row0 != row || s.n_tokens < 1 || s.n_tokens > kDecodeFormTokens || (s.n_tokens > 1 && !s.speculative))
            return false;
        row += s.n_tokens;
    }
    return !batch.seqs.empty() && row == batch.rows();
}
}  // namespace

void CudaBackend::begin_decode(const ForwardBatch& batch, CudaScratch& scratch) {
    scratch.decode = 0;
    if (!decode_form(batch) || numerics_ != Numerics::Fast || !decode_tables_) return;
    const int64_t T = batch.rows(), S = static_cast<int64_t>(batch.seqs.size());
    int64_t top = 0;
    for (const BatchSeq& s : batch.seqs) top = std::max(top, s.start_pos + s.n_tokens);
    // Indexers the streaming scorer does not take.
    if (cfg_.index_n_heads > 0 && !index_scores_stream_supported(cfg_.index_n_heads, cfg_.index_head_dim)) return;
    const bool graphs = graphs_ && !profiling_ && graph_bucket(T);
    const int64_t cap = graphs ? (top + graph_cap_tokens_ - 1) / graph_cap_tokens_ * graph_cap_tokens_ : top;
    // The indexer's scores [T, cap / ratio] in one chunk (ratio 1 bounds every layer's).
    if (T * cap * 4 > index_score_bytes_) return;

    std::vector<int64_t> carries;
    if (layout_.carry_bytes > 0)
        for (const BatchSeq& s : batch.seqs)
            carries.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(device_carry(*s.state))));
    DecodeSet* set = nullptr;
    if (graphs) {
        auto& slot = decode_sets_[{T, S}];
        if (!slot || slot->cap != cap) {
            if (slot) graph_runner_.drop(GraphRunner::Kind::decoder_layers, T, S);  // a new cap: they read old buffers
            slot = std::make_shared<DecodeSet>();
            slot->cap = cap;
            slot->step_bytes = paged_step_bytes(S, T, S * layout_.pages_for(cap));
            slot->step = device_alloc(slot->step_bytes);
        }
        set = slot.get();
    }
    // With graphs, into the set's fixed buffer (the graphs read it there).
    PagedStep step = upload_paged_step(layout_, batch, carries.empty() ? nullptr : &carries,
                                       set ? set->step : nullptr, set ? set->step_bytes : 0);
    scratch.paged_keep = step.keep;
    scratch.paged = step.seqs;
    scratch.set = set;
    scratch.cap = cap;
    scratch.decode = 1;
}

namespace {

// Per row at one ratio, on the device (paged_decode_rows): one allocation for every array, whose address is also
// the base of the compressor's carry offsets.
struct DecodePlan {
    std::shared_ptr<void> keep;
    DecodeRows rows;
};

}  // namespace

class DecodePlanner final : public AttentionPlanner {
public:
    DecodePlanner(CudaBackend& b, CudaScratch& scratch, int64_t T)
        : b_(b), scratch_(scratch), P_(scratch.paged), T_(T) {}

    const int64_t* positions() override { return P_.row_pos; }

    void store_rows(const Tensor& x, const StateSection& sec) override {
        paged_store_entries(x.f32(), T_, sec.format, P_, paged_section(sec));
    }
    const PagedSeqs* paged_rows() override { return &P_; }

    // Row t of the pooled rows is the one row t emits, or zeros where it ends no group (written by the compressor
    // kernel, not a memset: a memset between two kernels would break their programmatic dependency).
    Compressed compress(const CompressorWeight& cw, size_t carry_offset, const Tensor& x) override {
        const DecodePlan plan = decode_plan(cw.ratio, 0, cw.ratio > 1 ? &carry_offset : nullptr);
        Compressed c;
        c.n = T_;
        c.ratio = cw.ratio;
        c.gpos = plan.rows.gpos;
        c.keep = plan.keep;
        if (cw.ratio == 1) {  // every row ends its group; no carry
            c.pooled = b_.linear_.run(x, cw.wkv);
            return c;
        }
        const int d = cw.head_dim;
        auto [kv, score] = b_.linear_.run_pair(x, cw.wkv, cw.wgate, true);
        Tensor pooled = empty(DType::F32, {T_, d});
        if (!b_.launch_folds_) PG_CUDA(cudaMemsetAsync(pooled.raw(), 0, pooled.nbytes(), launch_stream()));  // A/B
        CompressorArgs a;
        a.kv = kv.f32();
        a.score = score.f32();
        a.ape = cw.ape.empty() ? nullptr : b_.weights_.f32(cw.ape);
        a.ratio = cw.ratio;
        a.d = d;
        a.overlap = cw.overlap ? 1 : 0;
        a.state = static_cast<float*>(plan.keep.get());  // the base of the plan's carry offsets
        a.pooled = pooled.f32();
        a.snapshot = plan.rows.snap;
        a.step = plan.rows.step;
        a.emit_at_row = true;
        compressor_batch(a, P_.n_seqs, plan.rows.meta);
        c.pooled = pooled;
        return c;
    }

    void store_groups(const Tensor& x, const StateSection& sec, const Compressed& c) override {
        paged_store_entries(x.f32(), T_, sec.format, P_, paged_section(sec), c.ratio);
    }

    // A row's entries are all visible to it; the tables are cap / ratio wide.
    Widths widths(int ratio, bool) override {
        C_ = scratch_.cap / ratio;
        plan_ = decode_plan(ratio, C_, nullptr);
        Widths w;
        w.width = w.visible = plan_.rows.width;
        w.max = C_;
        w.keep = plan_.keep;
        return w;
    }

    EntryTable entries(const StateSection& sec, int ratio, const Widths&) override {
        const AddressTable t = decode_entry_table(P_, sec, ratio, plan_.rows.seq_base, T_, C_);
        EntryTable e;
        e.table = t.table;
        e.base = plan_.rows.base;
        e.n = t.n;
        e.keep.push_back(t.keep);
        return e;
    }

    // One chunk: begin_decode took the step only if the scores of every row fit.
    int64_t chunk_rows(int64_t) override { return T_; }

    void score(const IndexQueries& q, int64_t r0, int64_t r1, const Widths& w, const EntryTable& keys,
               const EntryFormat& kf, float* scores) override {
        PEREGRINE_CHECK(r0 == 0 && r1 == T_, "decode scores rows [{}, {}) of {}", r0, r1, T_);
        index_scores_stream(q.q, q.w, plan_.rows.rows, static_cast<int>(T_), q.heads, q.dim, w.width, w.visible,
                            keys.base, keys.table, kf, w.max, scores);
    }

    // From the step's DecodeSet if it has one (fixed addresses, which its graphs read), else fresh.
    std::shared_ptr<void> step_buffer(StepSlot slot, size_t bytes) override {
        if (!scratch_.set) return device_alloc(bytes);
        auto& s = scratch_.set->slots[slot];
        if (!s.first || s.second < bytes) {
            cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
            PG_CUDA(cudaStreamIsCapturing(launch_stream(), &cap));
            if (cap != cudaStreamCaptureStatusNone)
                fail("step buffer {} grew during graph capture", static_cast<int>(slot));
            s = {device_alloc(bytes), bytes};
        }
        return s.first;
    }

    uint8_t* make_candidate_mask(int ratio, const Widths&, int64_t stride) override {
        scratch_.mask = step_buffer(kSlotMask, static_cast<size_t>(T_ * stride));
        scratch_.mask_stride = stride;
        scratch_.mask_ratio = ratio;
        return static_cast<uint8_t*>(scratch_.mask.get());
    }

    // The source's widths are the user's (same ratio, same rows): the mask's widths need not outlive its layer.
    CandidateMask candidate_mask(int ratio, const Widths& w) override {
        PEREGRINE_CHECK(scratch_.mask && scratch_.mask_ratio == ratio, "no candidate source of ratio {} ran this step",
                        ratio);
        return {static_cast<const uint8_t*>(scratch_.mask.get()), w.width, scratch_.mask_stride};
    }

    Selection all_entries(int ratio, const Widths&) override {
        Selection s;
        if (C_ <= 0) return s;
        s.k = static_cast<int>(C_);
        s.sel = device_alloc(sizeof(int32_t) * static_cast<size_t>(T_) * s.k);
        s.count = device_alloc(sizeof(int32_t) * static_cast<size_t>(T_));
        paged_all_entries(P_, ratio, T_, s.k, static_cast<int32_t*>(s.sel.get()), static_cast<int32_t*>(s.count.get()));
        return s;
    }

    KeyTables keys(const StateSection& win, const StateSection& comp, const EntryFormat&, int ratio, const Widths& w,
                   int k) override {
        const WindowTable wt = device_window_table(P_, win, T_, b_.cfg_.window_size, b_.format().ring_before_full);
        KeyTables kt;
        kt.win = wt.win.table;
        kt.nwin = wt.nwin;
        kt.keep = {wt.win.keep, wt.nwin_keep};
        if (k > 0) kt.comp = entries(comp, ratio, w);
        return kt;
    }

private:
    CudaBackend& b_;
    CudaScratch& scratch_;
    const PagedSeqs& P_;
    const int64_t T_;
    int64_t C_ = 0;    // the layer's table width: cap / ratio
    DecodePlan plan_;  // the layer's ratio: widths, table bases

    DecodePlan decode_plan(int ratio, int64_t cap, const size_t* carry_offset) {
        const size_t n = static_cast<size_t>(T_);
        const size_t b_width = 0, b_base = b_width + 8 * n, b_seq_base = b_base + 8 * n, b_gpos = b_seq_base + 8 * n,
                     b_meta = b_gpos + 8 * n, b_snap = b_meta + (carry_offset ? 48 * n : 0),
                     b_step = b_snap + (carry_offset ? 8 * n : 0), b_rows = b_step + (carry_offset ? 8 * n : 0),
                     total = b_rows + 4 * n;
        DecodePlan plan;
        plan.keep = device_alloc(total);
        auto* d = static_cast<uint8_t*>(plan.keep.get());
        DecodeRows& r = plan.rows;
        r.width = reinterpret_cast<int64_t*>(d + b_width);
        r.base = reinterpret_cast<int64_t*>(d + b_base);
        r.seq_base = reinterpret_cast<int64_t*>(d + b_seq_base);
        r.gpos = reinterpret_cast<int64_t*>(d + b_gpos);
        r.rows = reinterpret_cast<int32_t*>(d + b_rows);
        if (carry_offset) {
            r.meta = reinterpret_cast<int64_t*>(d + b_meta);
            r.snap = reinterpret_cast<float**>(d + b_snap);
            r.step = reinterpret_cast<float**>(d + b_step);
        }
        paged_decode_rows(P_, T_, ratio, cap, carry_offset ? static_cast<int64_t>(*carry_offset) : 0,
                          static_cast<int64_t>(b_.layout_.snapshot_offset), reinterpret_cast<const float*>(d), r);
        return plan;
    }
};

std::unique_ptr<AttentionPlanner> decode_planner(CudaBackend& b, CudaScratch& scratch, int64_t T) {
    return std::make_unique<DecodePlanner>(b, scratch, T);
}

}  // namespace peregrine::cuda
