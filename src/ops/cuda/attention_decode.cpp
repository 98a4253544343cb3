// Attention block of decode steps (one token per sequence, row t of sequence t; Numerics::Fast): the same kernels
// and results as attention.cpp, but every table and list is worked out on the device from the step's page tables
// (uploaded once per step, with each sequence's compressor carry address). Sizes depend only on T and cap (a bound
// on every row's position + 1): the compressor's outputs are T rows (zeros for rows that end no group, which store
// nothing), the indexer's and the compressed entries' tables cap / ratio wide per row. So a layer's block uploads
// nothing and launches the same kernels for every step of the same T and cap, and the layer is captured as a CUDA
// graph (layer_graph, cuda_graphs.cpp). The rows are independent in every kernel, so the results are those of
// the general path bit for bit (test_cuda_graphs).
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/launch_stream.h"
#include "ops/cuda/paged_state.h"
#include "util/error.h"

#include <cuda_runtime.h>

#include <algorithm>

namespace peregrine::cuda {

// Cross-layer buffers of a decode step (DecodeSet::slots).
enum DecodeSlot { kSlotTopk, kSlotTopkCount, kSlotMask };

struct CudaBackend::DecodePlan {
    std::shared_ptr<void> keep;  // one allocation for every array (its address is the compressor's state base)
    DecodeRows rows;
};

void CudaBackend::begin_decode(const ForwardBatch& batch, CudaScratch& scratch) {
    scratch.decode = 0;
    if (batch.mode != BatchMode::decode || numerics_ != Numerics::Fast || !decode_tables_) return;
    const int64_t T = batch.rows();
    int64_t top = 0;  // a decode batch: row t is sequence t's one token (Model::forward checks it)
    for (const BatchSeq& s : batch.seqs) top = std::max(top, s.start_pos + 1);
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
        auto& slot = decode_sets_[T];
        if (!slot || slot->cap != cap) {
            if (slot) graph_runner_.drop(GraphRunner::Kind::decoder_layer, T);  // a new cap: they read old buffers
            slot = std::make_shared<DecodeSet>();
            slot->cap = cap;
            slot->step_bytes = paged_step_bytes(T, T, T * layout_.pages_for(cap));
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

std::shared_ptr<void> CudaBackend::decode_buffer(CudaScratch& scratch, int slot, size_t bytes) {
    if (!scratch.set) return device_alloc(bytes);
    auto& s = scratch.set->slots[slot];
    if (!s.first || s.second < bytes) {
        cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        PG_CUDA(cudaStreamIsCapturing(launch_stream(), &cap));
        if (cap != cudaStreamCaptureStatusNone) fail("decode buffer {} grew during graph capture", slot);
        s = {device_alloc(bytes), bytes};
    }
    return s.first;
}

CudaBackend::DecodePlan CudaBackend::decode_plan(const PagedSeqs& p, int64_t T, int ratio, int64_t cap,
                                                 const size_t* carry_offset) {
    const size_t n = static_cast<size_t>(T);
    const size_t b_width = 0, b_base = b_width + 8 * n, b_gpos = b_base + 8 * n, b_meta = b_gpos + 8 * n,
                 b_snap = b_meta + (carry_offset ? 48 * n : 0), b_rows = b_snap + (carry_offset ? 8 * n : 0),
                 total = b_rows + 4 * n;
    DecodePlan plan;
    plan.keep = device_alloc(total);
    auto* d = static_cast<uint8_t*>(plan.keep.get());
    DecodeRows& r = plan.rows;
    r.width = reinterpret_cast<int64_t*>(d + b_width);
    r.base = reinterpret_cast<int64_t*>(d + b_base);
    r.gpos = reinterpret_cast<int64_t*>(d + b_gpos);
    r.rows = reinterpret_cast<int32_t*>(d + b_rows);
    if (carry_offset) {
        r.meta = reinterpret_cast<int64_t*>(d + b_meta);
        r.snap = reinterpret_cast<float**>(d + b_snap);
    }
    paged_decode_rows(p, T, ratio, cap, carry_offset ? static_cast<int64_t>(*carry_offset) : 0,
                      static_cast<int64_t>(layout_.snapshot_offset), reinterpret_cast<const float*>(d), r);
    return plan;
}

// The compressor over T rows (decode_plan with the compressor's carry offset): row t of the result is the
// normalised latent row t emits, or zeros where it ends no group.
Tensor CudaBackend::compress_decode(const CompressorWeight& cw, const Tensor& x, const DecodePlan& plan) {
    if (cw.ratio == 1) return rms_norm(linear_.run(x, cw.wkv), cw.norm);  // every row ends its group; no carry
    const int64_t T = x.dim(0);
    const int d = cw.head_dim;
    auto [kv, score] = linear_.run_pair(x, cw.wkv, cw.wgate, true);
    Tensor pooled = empty(DType::F32, {T, d});
    PG_CUDA(cudaMemsetAsync(pooled.raw(), 0, pooled.nbytes(), launch_stream()));
    CompressorArgs a;
    a.kv = kv.f32();
    a.score = score.f32();
    a.ape = cw.ape.empty() ? nullptr : weights_.f32(cw.ape);
    a.ratio = cw.ratio;
    a.d = d;
    a.overlap = cw.overlap ? 1 : 0;
    a.state = static_cast<float*>(plan.keep.get());  // the base of the plan's carry offsets
    a.pooled = pooled.f32();
    a.snapshot = plan.rows.snap;
    compressor_batch(a, static_cast<int>(T), plan.rows.meta);
    return rms_norm(pooled, cw.norm);
}

Tensor CudaBackend::attention_decode(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                                     CudaScratch& scratch) {
    const int T = static_cast<int>(x.dim(0)), D = cfg_.head_dim, rd = cfg_.rope_head_dim, W = cfg_.window_size;
    const float* freqs = weights_.rope(info);
    const LayerStateLayout& L = layout_.layers.at(static_cast<size_t>(info.layer));
    const PagedSeqs& P = scratch.paged;
    const int64_t* pos = P.row_pos;

    phase("attn.q+kv projections");
    AttentionInputs in = attention_inputs(x, w, info, freqs, pos, T);
    paged_store_entries(in.kv.f32(), T, L.window.format, P, paged_section(L.window));

    if (info.compresses) {  // compressed entries (and, for key owners, indexer keys) of the rows ending a group
        phase("attn.compressor");
        const CompressorWeight& cw = *w.compressor;
        const DecodePlan cp = decode_plan(P, T, cw.ratio, 0, cw.ratio > 1 ? &L.carry_offset : nullptr);
        Tensor latent = compress_decode(cw, x, cp);
        if (info.owns_index_k) {
            const IndexerWeight& iw = *w.indexer;
            Tensor k = rms_norm(linear_.run(latent, iw.wk), iw.k_norm);
            index_rope_qdq(k.f32(), T, 1, cp.rows.gpos, freqs, L.index_k.format);
            paged_store_entries(k.f32(), T, L.index_k.format, P, paged_section(L.index_k), cw.ratio);
        }
        const EntryFormat& cf = L.comp.format;
        rope_qdq(latent.f32(), T, 1, D, D, D - rd, cp.rows.gpos, freqs, rd, false, cf.quant_dims, cf.block,
                 qdq_kind(cf));
        paged_store_entries(latent.f32(), T, L.comp.format, P, paged_section(L.comp), cw.ratio);
    }

    // Which compressed entries each row attends to: sel [T, kmax] (-1: none) and counts [T].
    std::shared_ptr<void> sel_keep, nsel_keep;
    int kmax = 0;
    DecodePlan rp;  // this layer's ratio: widths, table bases
    const int64_t C = info.ratio > 0 ? scratch.cap / info.ratio : 0;
    if (info.ratio > 0) {
        const int ratio = info.ratio;
        rp = decode_plan(P, T, ratio, C, nullptr);
        const int64_t* width = rp.rows.width;  // also each row's visible entries
        if (info.has_indexer) {
            phase("attn.indexer+topk");
            const IndexerWeight& iw = *w.indexer;
            const int nh = iw.n_heads, hd = iw.head_dim;
            const StateSection& ks = layout_.layers.at(static_cast<size_t>(info.index_k_source)).index_k;
            if (info.index_compressor) {  // the indexer's own compressor turns tokens into keys
                const CompressorWeight& icw = *iw.compressor;
                const DecodePlan ip = decode_plan(P, T, icw.ratio, 0, icw.ratio > 1 ? &L.index_carry_offset : nullptr);
                Tensor lat = compress_decode(icw, x, ip);
                index_rope_qdq(lat.f32(), T, 1, ip.rows.gpos, freqs, L.index_k.format);
                paged_store_entries(lat.f32(), T, L.index_k.format, P, paged_section(L.index_k), icw.ratio);
            }
            Tensor wts = index_queries(x, in.iq, iw, freqs, pos, T, ks.format);
            const AddressTable keys = decode_entry_table(P, ks, ratio, rp.rows.base, T, C);
            const int64_t stride = std::max<int64_t>(C, 1);
            Tensor scores = empty(DType::F32, {T, stride});
            index_scores_stream(in.iq.f32(), wts.f32(), rp.rows.rows, T, nh, hd, width, width, rp.rows.base, keys.table,
                                ks.format, C, scores.f32());
            const int bs = cfg_.candidate_block_size;
            if (info.candidate_source) {
                const int64_t max_nb = std::max<int64_t>((C + bs - 1) / bs, 1);
                Tensor bscore = empty(DType::F32, {T, max_nb}), bsel = empty(DType::I32, {T, max_nb});
                const int64_t mstride = candidate_mask_stride(stride, bs);
                scratch.mask = decode_buffer(scratch, kSlotMask, static_cast<size_t>(T * mstride));
                scratch.mask_stride = mstride;
                scratch.mask_ratio = ratio;
                candidate_blocks_fast(scores.f32(), T, C, width, width, bs, cfg_.candidate_topk_blocks, bscore.f32(),
                                      bsel.data<int32_t>(), max_nb, static_cast<uint8_t*>(scratch.mask.get()), mstride);
            } else if (info.uses_candidates) {
                // The source's widths are this layer's (same ratio, same rows).
                PEREGRINE_CHECK(scratch.mask && scratch.mask_ratio == ratio,
                                "layer {}: no candidate source of ratio {} ran this step", info.layer, ratio);
                apply_candidates(scores.f32(), T, C, width, static_cast<const uint8_t*>(scratch.mask.get()), width,
                                 scratch.mask_stride, bs);
            }
            kmax = iw.topk;
            sel_keep = decode_buffer(scratch, kSlotTopk, sizeof(int32_t) * static_cast<size_t>(T) * kmax);
            nsel_keep = decode_buffer(scratch, kSlotTopkCount, sizeof(int32_t) * static_cast<size_t>(T));
            auto tmp = device_alloc(sizeof(int32_t) * static_cast<size_t>(T) * kmax);
            const bool sorted = format_.sorted_selection;
            const bool fast_topk = sorted || static_cast<size_t>(kmax) * 8 <= 48 * 1024;
            (fast_topk ? topk_rows_fast : topk_rows)(scores.f32(), T, C, width, width, kmax, sorted,
                                                     static_cast<int32_t*>(tmp.get()),
                                                     static_cast<int32_t*>(sel_keep.get()),
                                                     static_cast<int32_t*>(nsel_keep.get()));
            scratch.topk = sel_keep;  // for the layers after it that reuse it
            scratch.topk_count = nsel_keep;
            scratch.topk_k = kmax;
        } else if (info.reuses_selection) {
            sel_keep = scratch.topk;
            nsel_keep = scratch.topk_count;
            kmax = sel_keep ? scratch.topk_k : 0;
        } else if (C > 0) {  // every visible entry
            kmax = static_cast<int>(C);
            sel_keep = device_alloc(sizeof(int32_t) * static_cast<size_t>(T) * kmax);
            nsel_keep = device_alloc(sizeof(int32_t) * static_cast<size_t>(T));
            paged_all_entries(P, ratio, T, kmax, static_cast<int32_t*>(sel_keep.get()),
                              static_cast<int32_t*>(nsel_keep.get()));
        }
    }
    const int32_t* sel = kmax > 0 ? static_cast<const int32_t*>(sel_keep.get()) : nullptr;
    const int32_t* nsel = kmax > 0 ? static_cast<const int32_t*>(nsel_keep.get()) : nullptr;

    phase("attn.sparse attention");
    // Key lists: the window entries, then the selected compressed entries.
    const LayerStateLayout& CL =
        layout_.layers.at(static_cast<size_t>(info.comp_source >= 0 ? info.comp_source : info.layer));
    const EntryFormat& comp_format = CL.comp.present() ? CL.comp.format : L.window.format;
    const WindowTable wt = device_window_table(P, L.window, T, W, format_.ring_before_full);
    AddressTable comp;
    if (sel) comp = decode_entry_table(P, CL.comp, info.ratio, rp.rows.base, T, C);
    const int maxk = W + kmax;
    auto keys = device_alloc(sizeof(uint8_t*) * static_cast<size_t>(T) * maxk);
    auto nkeys = device_alloc(sizeof(int32_t) * static_cast<size_t>(T));
    build_keys(T, wt.win.table, wt.nwin, W, sel, nsel, kmax, comp.table, sel ? rp.rows.base : nullptr,
               static_cast<const uint8_t**>(keys.get()), static_cast<int32_t*>(nkeys.get()), maxk, nullptr,
               2 * static_cast<int64_t>(D));
    KeyRefs kr;
    kr.keys = static_cast<const uint8_t* const*>(keys.get());
    kr.nkeys = static_cast<const int32_t*>(nkeys.get());
    kr.nwin = wt.nwin;
    kr.maxk = maxk;
    kr.win = L.window.format;
    kr.comp = comp_format;
    Tensor o = sparse_attend(in.q, w, kr, false);
    phase("attn.output projection");
    return project_output(o, w, freqs, pos, T);
}

}  // namespace peregrine::cuda
