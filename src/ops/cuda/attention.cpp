// Attention block on the GPU, step for step the reference's (cpu/attention.cpp): one skeleton makes every launch
// of arithmetic, top-k selections included, so no data comes back to the host; a planner (attention_planner.h)
// says where each row's state entries are. Then the blocks' shared pieces: projections, sparse attention, output.
#include "ops/cuda/attention_planner.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/paged_state.h"
#include "util/error.h"

#include <algorithm>
#include <cmath>

namespace peregrine::cuda {

Tensor CudaBackend::attention(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                              ForwardBatch& batch, StepScratch& scratch_base) {
    OpTimer op_(*this, "attention");
    auto& scratch = static_cast<CudaScratch&>(scratch_base);
    if (scratch.decode < 0) begin_decode(batch, scratch);
    auto plan = scratch.decode == 1 ? decode_planner(*this, scratch, batch.rows())
                                    : prefill_planner(*this, batch, scratch);
    return attend(x, w, info, *plan, scratch);
}

// The block, step for step the reference's: projections, the window entry, compressed entries (and indexer keys),
// the selection of compressed entries, the key lists, sparse attention, the output projection.
Tensor CudaBackend::attend(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                           AttentionPlanner& plan, CudaScratch& scratch) {
    const int T = static_cast<int>(x.dim(0)), D = cfg_.head_dim, rd = cfg_.rope_head_dim, W = cfg_.window_size;
    const bool fast = numerics_ == Numerics::Fast;
    const float* freqs = weights_.rope(info);
    const LayerStateLayout& L = layout_.layers.at(static_cast<size_t>(info.layer));
    const int64_t* pos = plan.positions();

    phase("attn.q+kv projections");
    AttentionInputs in = attention_inputs(x, w, info, freqs, pos, T);
    store_window(in.kv_proj, w, plan, L.window, pos, freqs);  // the sliding window's K=V, per token

    if (info.compresses) {  // compressed entries (and, for key owners, indexer keys from the latents)
        phase("attn.compressor");
        const Compressed c = plan.compress(*w.compressor, L.carry_offset, x);
        if (c.n > 0) {
            const EntryFormat& cf = L.comp.format;
            Tensor latent;
            if (info.owns_index_k) {  // the keys read the normalised latents before their RoPE
                const IndexerWeight& iw = *w.indexer;
                latent = rms_norm(c.pooled, w.compressor->norm);
                plan.store_groups(index_keys(linear_.run(latent, iw.wk), iw.k_norm, c.gpos, freqs, L.index_k.format),
                                  L.index_k, c);
                rope_qdq(latent.f32(), c.n, 1, D, D, D - rd, c.gpos, freqs, rd, false, cf.quant_dims, cf.block,
                         qdq_kind(cf));
            } else {
                latent = norm_rope_qdq(c.pooled, w.compressor->norm, c.gpos, freqs, cf);
            }
            plan.store_groups(latent, L.comp, c);
        }
    }

    // Which compressed entries each row attends to.
    Selection sel;
    Widths widths;
    if (info.ratio > 0) {
        const int ratio = info.ratio;
        widths = plan.widths(ratio, info.has_indexer);
        if (info.has_indexer) {
            phase("attn.indexer+topk");
            const IndexerWeight& iw = *w.indexer;
            const StateSection& ks = layout_.layers.at(static_cast<size_t>(info.index_k_source)).index_k;
            if (info.index_compressor) {  // the indexer's own compressor turns tokens into keys
                const Compressed c = plan.compress(*iw.compressor, L.index_carry_offset, x);
                if (c.n > 0)
                    plan.store_groups(index_keys(c.pooled, iw.compressor->norm, c.gpos, freqs, L.index_k.format),
                                      L.index_k, c);
            }
            Tensor wts = index_queries(x, in.iq, iw, freqs, pos, T, ks.format);
            const IndexQueries iq{in.iq.f32(), wts.f32(), iw.n_heads, iw.head_dim};
            const EntryTable keys = plan.entries(ks, ratio, widths);

            // Scores [rows, width], the candidate blocks and the top-k run over chunks of rows, so that the score
            // matrix stays bounded (a 64K-token prefill against 64K entries would otherwise need 16 GiB). Rows are
            // independent throughout, so the chunking changes no result.
            const int64_t stride = std::max<int64_t>(widths.max, 1), chunk = plan.chunk_rows(stride);
            Tensor scores = empty(DType::F32, {chunk, stride});
            const int bs = cfg_.candidate_block_size;
            Tensor bscore, bsel;
            int64_t max_nb = 1, mstride = 0;
            uint8_t* mask = nullptr;
            CandidateMask cm;
            if (info.candidate_source) {
                max_nb = std::max<int64_t>((widths.max + bs - 1) / bs, 1);
                bscore = empty(DType::F32, {chunk, max_nb});
                bsel = empty(DType::I32, {chunk, max_nb});
                mstride = candidate_mask_stride(stride, bs);
                mask = plan.make_candidate_mask(ratio, widths, mstride);
            } else if (info.uses_candidates) {
                cm = plan.candidate_mask(ratio, widths);
            }
            sel.k = iw.topk;
            sel.sel = plan.step_buffer(kSlotTopk, sizeof(int32_t) * static_cast<size_t>(T) * sel.k);
            sel.count = plan.step_buffer(kSlotTopkCount, sizeof(int32_t) * static_cast<size_t>(T));
            auto tmp = device_alloc(sizeof(int32_t) * static_cast<size_t>(chunk) * sel.k);
            const bool sorted = format_.sorted_selection;
            const bool fast_topk = fast && (sorted || static_cast<size_t>(sel.k) * 8 <= 48 * 1024);
            for (int64_t r0 = 0; r0 < T; r0 += chunk) {
                const int64_t r1 = std::min<int64_t>(T, r0 + chunk), nr = r1 - r0;
                const int64_t *wd = widths.width + r0, *vd = widths.visible + r0;
                plan.score(iq, r0, r1, widths, keys, ks.format, scores.f32());
                if (info.candidate_source) {
                    (fast ? candidate_blocks_fast : candidate_blocks)(scores.f32(), nr, widths.max, wd, vd, bs,
                                                                      cfg_.candidate_topk_blocks, bscore.f32(),
                                                                      bsel.data<int32_t>(), max_nb,
                                                                      mask + r0 * mstride, mstride);
                } else if (info.uses_candidates) {
                    apply_candidates(scores.f32(), nr, widths.max, wd, cm.mask + r0 * cm.stride, cm.width + r0,
                                     cm.stride, bs);
                }
                (fast_topk ? topk_rows_fast : topk_rows)(scores.f32(), nr, widths.max, wd, vd, sel.k, sorted,
                                                         static_cast<int32_t*>(tmp.get()),
                                                         static_cast<int32_t*>(sel.sel.get()) + r0 * sel.k,
                                                         static_cast<int32_t*>(sel.count.get()) + r0);
            }
            scratch.topk = sel.sel;  // for the layers after it that reuse it
            scratch.topk_count = sel.count;
            scratch.topk_k = sel.k;
        } else if (info.reuses_selection) {
            if (scratch.topk) sel = {scratch.topk, scratch.topk_count, scratch.topk_k};
        } else {  // every visible entry
            sel = plan.all_entries(ratio, widths);
        }
        if (!sel.sel || sel.k <= 0) sel = {};
    }

    phase("attn.sparse attention");
    // Key lists: the window entries, then the selected compressed entries (of the layer that owns them).
    const LayerStateLayout& CL =
        layout_.layers.at(static_cast<size_t>(info.comp_source >= 0 ? info.comp_source : info.layer));
    const EntryFormat& comp_format = CL.comp.present() ? CL.comp.format : L.window.format;
    const KeyTables kt = plan.keys(L.window, CL.comp, comp_format, info.ratio, widths, sel.k);
    const int maxk = W + sel.k;
    auto keys = device_alloc(sizeof(uint8_t*) * static_cast<size_t>(T) * maxk);
    auto nkeys = device_alloc(sizeof(int32_t) * static_cast<size_t>(T));
    build_keys(T, kt.win, kt.nwin, W, static_cast<const int32_t*>(sel.sel.get()),
               static_cast<const int32_t*>(sel.count.get()), sel.k, kt.comp.table, kt.comp.base,
               static_cast<const uint8_t**>(keys.get()), static_cast<int32_t*>(nkeys.get()), maxk, kt.comp_rows,
               2 * static_cast<int64_t>(D));

    // Sparse attention with sink and the inverse rotation of the output.
    KeyRefs kr;
    kr.keys = static_cast<const uint8_t* const*>(keys.get());
    kr.nkeys = static_cast<const int32_t*>(nkeys.get());
    kr.nwin = kt.nwin;
    kr.maxk = maxk;
    kr.win = L.window.format;
    kr.comp = comp_format;
    Tensor o = sparse_attend(in.q, w, kr, kt.key_rows, freqs, pos);
    phase("attn.output projection");
    return project_output(o, w, T);
}

CudaBackend::AttentionInputs CudaBackend::attention_inputs(const Tensor& x, const AttentionWeight& w,
                                                           const AttentionLayerInfo& info, const float* freqs,
                                                           const int64_t* pos, int T) {
    AttentionInputs in;
    auto [qa, kva] = linear_.run_pair(x, w.wq_a, w.wkv);  // one GEMV launch at decode
    Tensor qr = rms_norm(qa, w.q_norm);
    if (info.ratio > 0 && info.has_indexer) {  // the indexer's queries read qr too: its wq_b rides in the launch
        auto [qb, ib] = linear_.run_pair(qr, w.wq_b, w.indexer->wq_b);
        in.q = queries_of(qb, freqs, pos, T);
        in.iq = std::move(ib);
    } else {
        in.q = project_queries(qr, w, freqs, pos, T);
    }
    in.kv_proj = std::move(kva);
    return in;
}

Tensor CudaBackend::index_queries(const Tensor& x, Tensor& iq, const IndexerWeight& iw, const float* freqs,
                                  const int64_t* pos, int T, const EntryFormat& f) {
    const int nh = iw.n_heads, hd = iw.head_dim;
    Tensor wts = linear_.run(x, iw.weights_proj);
    index_rope_qdq(iq.f32(), T, nh, pos, freqs, f);
    scale_round_bf16(wts.f32(), static_cast<int64_t>(T) * nh,
                     static_cast<float>(std::pow(hd, -0.5) * std::pow(nh, -0.5)));
    return wts;
}

void CudaBackend::index_rope_qdq(float* x, int64_t rows, int heads, const int64_t* pos, const float* freqs,
                                 const EntryFormat& f) {
    const int hd = f.dim, rd = cfg_.rope_head_dim;
    const int64_t rs = static_cast<int64_t>(heads) * hd;
    if (format_.index_rotation) {  // the Hadamard rotation between RoPE and the QDQ
        rope(x, rows, heads, rs, hd, hd - rd, pos, freqs, rd, false);
        hadamard_rows(x, rows * heads, hd, hd);
        qdq_rows(x, rows * heads, hd, f.quant_dims, f.block, qdq_kind(f));
    } else {
        rope_qdq(x, rows, heads, rs, hd, hd - rd, pos, freqs, rd, false, f.quant_dims, f.block, qdq_kind(f));
    }
}

Tensor CudaBackend::sparse_attend(const Tensor& q, const AttentionWeight& w, const KeyRefs& kr, bool key_rows,
                                  const float* freqs, const int64_t* pos) {
    const int64_t T = q.dim(0);
    const int H = cfg_.n_heads, D = cfg_.head_dim, rd = cfg_.rope_head_dim;
    Tensor o = empty(DType::F32, {T, H, D});
    const float scale = static_cast<float>(std::pow(D, -0.5));
    if (key_rows) {
        sparse_attention_rows(q.f32(), T, H, D, scale, weights_.f32(w.attn_sink), kr.keys, kr.nkeys, kr.maxk, o.f32());
    } else if (numerics_ == Numerics::Fast && sparse_attention_mma_supported(H, D, kr.win, kr.comp)) {
        // Tensor cores, prefill and decode (few rows split their keys over CTAs, with a scratch for the parts, and
        // the merge of the parts also rotates back).
        auto ws = device_alloc(sparse_attention_mma_workspace(T, H, D, kr.maxk));
        sparse_attention_mma(q.f32(), T, H, D, scale, weights_.f32(w.attn_sink), kr, o.f32(), ws.get(),
                             launch_folds_ ? OutputRope{pos, freqs, rd} : OutputRope{});
        if (launch_folds_) return o;
    } else {
        sparse_attention(q.f32(), T, H, D, scale, weights_.f32(w.attn_sink), kr, o.f32(), numerics_ == Numerics::Fast);
    }
    rope(o.f32(), T, H, static_cast<int64_t>(H) * D, D, D - rd, pos, freqs, rd, true);
    return o;
}

Tensor CudaBackend::project_queries(const Tensor& qr, const AttentionWeight& w, const float* freqs, const int64_t* pos,
                                    int T) {
    return queries_of(linear_.run(qr, w.wq_b), freqs, pos, T);
}

Tensor CudaBackend::queries_of(Tensor q, const float* freqs, const int64_t* pos, int T) {
    const int H = cfg_.n_heads, D = cfg_.head_dim, rd = cfg_.rope_head_dim;
    if (format_.query_head_norm) head_norm_bf16(q.f32(), static_cast<int64_t>(T) * H, D, eps());
    rope(q.f32(), T, H, static_cast<int64_t>(H) * D, D, D - rd, pos, freqs, rd, false);
    return q;
}

Tensor CudaBackend::window_kv(const Tensor& x, const AttentionWeight& w, const float* freqs, const int64_t* pos,
                              const EntryFormat& f) {
    return window_kv_of(linear_.run(x, w.wkv), w, freqs, pos, f);
}

Tensor CudaBackend::window_kv_of(const Tensor& projected, const AttentionWeight& w, const float* freqs,
                                 const int64_t* pos, const EntryFormat& f) {
    return norm_rope_qdq(projected, w.kv_norm, pos, freqs, f);
}

void CudaBackend::store_window(const Tensor& kv_proj, const AttentionWeight& w, AttentionPlanner& plan,
                               const StateSection& sec, const int64_t* pos, const float* freqs) {
    const PagedSeqs* paged = launch_folds_ ? plan.paged_rows() : nullptr;
    if (!paged) {
        plan.store_rows(window_kv_of(kv_proj, w, freqs, pos, sec.format), sec);
        return;
    }
    const PagedRowStore store{sec.format, *paged, paged_section(sec)};
    norm_rope_qdq(kv_proj, w.kv_norm, pos, freqs, sec.format, &store);
}

Tensor CudaBackend::index_keys(const Tensor& x, const Tensor& w, const int64_t* pos, const float* freqs,
                               const EntryFormat& f) {
    if (!format_.index_rotation) return norm_rope_qdq(x, w, pos, freqs, f);
    Tensor k = rms_norm(x, w);
    index_rope_qdq(k.f32(), k.dim(0), 1, pos, freqs, f);
    return k;
}

Tensor CudaBackend::norm_rope_qdq(const Tensor& x, const Tensor& w, const int64_t* pos, const float* freqs,
                                  const EntryFormat& f, const PagedRowStore* store) {
    OpTimer op_(*this, "norm_rope_qdq");
    const int D = static_cast<int>(x.dim(-1)), rd = cfg_.rope_head_dim;
    const int64_t rows = x.numel() / D;
    Tensor y = empty(DType::F32, x.shape());
    if (launch_folds_) {
        rms_norm_rope_qdq(x.f32(), rows, D, weights_.f32(w), eps(), y.f32(), pos, freqs, D - rd, rd, f.quant_dims,
                          f.block, qdq_kind(f), store);
    } else {
        cuda::rms_norm(x.f32(), rows, D, weights_.f32(w), eps(), y.f32());
        rope_qdq(y.f32(), rows, 1, D, D, D - rd, pos, freqs, rd, false, f.quant_dims, f.block, qdq_kind(f));
        if (store) paged_store_entries(y.f32(), rows, store->f, store->p, store->sec);
    }
    return y;
}

Tensor CudaBackend::project_output(Tensor& o, const AttentionWeight& w, int T) {
    const int H = cfg_.n_heads, D = cfg_.head_dim;
    // Grouped low-rank output projection: wo_a per head group (bf16), then wo_b.
    const int G = cfg_.o_groups, R = cfg_.o_lora_rank, GD = H / G * D;
    Tensor oa = empty(DType::F32, {T, static_cast<int64_t>(G) * R});
    const uint16_t* wo_a = static_cast<const uint16_t*>(weights_.raw(w.wo_a.w));
    if (numerics_ == Numerics::Reference) {
        grouped_linear_bf16(o.f32(), T, G, R, GD, wo_a, oa.f32());
    } else if (numerics_ == Numerics::Fast && routing_tile_rows(static_cast<int64_t>(T) * G, G) != 8) {
        // Prefill: the groups as one strided batched GEMM on the tensor cores (cuBLAS, bf16, fp32 sums).
        grouped_linear_cublas(o.f32(), T, G, R, GD, wo_a, oa.f32());
    } else {  // rows (t, g) of length GD through group g's [R, GD] block: a routed GEMM with G "experts"
        const GroupRouting& gr = group_routing(T, G);
        const void* const* tp = weights_.group_table(wo_a, G, R, GD);
        ExpertTable groups{tp, reinterpret_cast<const uint8_t* const*>(tp + G)};
        const int64_t rows = static_cast<int64_t>(T) * G;
        Routed routed;
        routed.row_expert = static_cast<const int32_t*>(gr.sel.get());
        routed.routing = gr.routing;
        LinearWeight wg;
        wg.kind = LinearWeight::Kind::BF16;
        wg.out = R;
        wg.in = GD;
        wg.w = Tensor::view(DType::BF16, {R, GD}, wo_a, Device::CUDA);
        // o holds bf16 values (as the prefill's bf16 GEMM takes them): the bf16 tensor cores' products are exact.
        Tensor oa_rows = linear_.run(o.reshaped({rows, GD}), wg, &groups, &routed, /*bf16_acts=*/true);
        oa = oa_rows.reshaped({T, static_cast<int64_t>(G) * R});
    }
    return linear_.run(oa, w.wo_b);
}

// Row (t, g) goes to group g: the tile table depends on T alone, so it is built once per T (expert_tiles on the
// device) and kept.
const CudaBackend::GroupRouting& CudaBackend::group_routing(int T, int G) {
    GroupRouting& gr = group_routing_[{T, G}];
    if (gr.sel) return gr;
    std::vector<int32_t> sel(static_cast<size_t>(T) * G);
    for (size_t i = 0; i < sel.size(); ++i) sel[i] = static_cast<int32_t>(i % G);
    gr.sel = upload(sel).keep;
    const int64_t rows = static_cast<int64_t>(T) * G;
    LinearRouting& r = gr.routing;
    r.tile_rows = routing_tile_rows(rows, G);
    // Every group gets exactly T rows, so exactly G * ceil(T / tile_rows) tiles (a tight bound sizes the GEMV's grid).
    r.max_tiles = static_cast<unsigned>(G * ((T + r.tile_rows - 1) / r.tile_rows));
    gr.row_map = device_alloc(sizeof(int32_t) * static_cast<size_t>(rows));
    gr.tiles = device_alloc(sizeof(int32_t) * 4 * r.max_tiles);
    gr.n_tiles = device_alloc(sizeof(int32_t));
    expert_tiles(static_cast<const int32_t*>(gr.sel.get()), rows, G, r.tile_rows,
                 static_cast<int32_t*>(gr.row_map.get()), static_cast<int32_t*>(gr.tiles.get()),
                 static_cast<int32_t*>(gr.n_tiles.get()));
    r.row_map = static_cast<const int32_t*>(gr.row_map.get());
    r.tiles = static_cast<const int32_t*>(gr.tiles.get());
    r.n_tiles = static_cast<const int32_t*>(gr.n_tiles.get());
    return gr;
}

}  // namespace peregrine::cuda
