// Attention block on the GPU, step for step the reference's (cpu/attention.cpp): the host works out which
// state entries each row reads or writes (page addresses, window lists, group emissions), the device does
// all arithmetic, top-k selections included, so no data comes back to the host.
#include "ops/attention_plan.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/paged_state.h"
#include "util/error.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace peregrine::cuda {

// A step with a sequence this long runs the compressor over its tokens in parallel (compressor_parallel); shorter
// ones (decode) run them in order per channel (compressor_batch), which is cheaper for a token or a few.
constexpr int64_t kParallelCompressorTokens = 32;

struct CudaBackend::Emitted {
    Tensor latent;               // [n, d] normalised, before RoPE
    std::vector<int> rows;       // row that completed each group
    std::vector<int64_t> group;  // group index
    int n() const { return static_cast<int>(rows.size()); }
};

CudaBackend::Emitted CudaBackend::run_compressor(const CompressorWeight& cw, size_t carry_offset, const Tensor& x,
                                                 ForwardBatch& batch) {
    const int ratio = cw.ratio, d = cw.head_dim;
    Emitted out;
    if (ratio == 1) {
        Tensor kv = linear_.run(x, cw.wkv);
        for (auto& s : batch.seqs)
            for (int i = 0; i < s.n_tokens; ++i) {
                out.rows.push_back(s.row0 + i);
                out.group.push_back(s.start_pos + i);
            }
        // rows are emitted in sequence order; the latents follow the same order
        std::vector<int> order(out.rows.begin(), out.rows.end());
        Tensor kv_sorted = gather_rows(kv, order);
        out.latent = rms_norm(kv_sorted, cw.norm);
        return out;
    }
    // x is the attention norm's output (bf16 values): the fp32 projections take the bf16 tensor cores.
    auto [kv, score] = linear_.run_pair(x, cw.wkv, cw.wgate, true);
    for (auto& s : batch.seqs)
        for (int i = 0; i < s.n_tokens; ++i)
            if ((s.start_pos + i + 1) % ratio == 0) {
                out.rows.push_back(s.row0 + i);
                out.group.push_back((s.start_pos + i) / ratio);
            }
    Tensor pooled = empty(DType::F32, {std::max(out.n(), 1), d});
    const float* ape = cw.ape.empty() ? nullptr : weights_.f32(cw.ape);
    if (numerics_ == Numerics::Fast) {
        // One launch for every sequence; their carries stay in device memory. The kernel finds sequence s's
        // carry at a signed float offset from the first one's (they are separate allocations).
        std::vector<int64_t> meta;
        std::vector<float*> snap;
        float* carry_base = nullptr;
        int emit_base = 0;
        for (auto& s : batch.seqs) {
            if (s.n_tokens == 0) continue;
            float* carry = device_carry(*s.state) + carry_offset / sizeof(float);
            if (!carry_base) carry_base = carry;
            const int64_t state_off = (static_cast<int64_t>(reinterpret_cast<intptr_t>(carry)) -
                                       static_cast<int64_t>(reinterpret_cast<intptr_t>(carry_base))) /
                                      static_cast<int64_t>(sizeof(float));
            meta.insert(meta.end(), {s.start_pos, s.n_tokens, s.row0, emit_base, state_off,
                                     static_cast<int64_t>(snap.size())});
            for (int i = 0; i < s.n_tokens; ++i) {
                const int64_t pos = s.start_pos + i;
                if ((pos + 1) % ratio == 0) ++emit_base;
                float* p = nullptr;
                if ((pos + 1) % layout_.page_tokens == 0) {
                    uint8_t* page = layout_.page_ptr(s.state->pool,
                                                     s.state->pages.at(static_cast<size_t>(pos / layout_.page_tokens)));
                    p = reinterpret_cast<float*>(page + layout_.snapshot_offset + carry_offset);
                }
                snap.push_back(p);
            }
        }
        if (carry_base) {
            const int n_active = static_cast<int>(meta.size() / 6);
            auto meta_d = upload(meta);
            CompressorArgs a;
            a.kv = kv.f32();
            a.score = score.f32();
            a.ape = ape;
            a.ratio = ratio;
            a.d = d;
            a.overlap = cw.overlap ? 1 : 0;
            a.state = carry_base;
            a.pooled = pooled.f32();
            int64_t longest = 0;
            for (int s = 0; s < n_active; ++s) longest = std::max(longest, meta[6 * static_cast<size_t>(s) + 1]);
            if (longest >= kParallelCompressorTokens) {  // prefill: the tokens in parallel too
                const CompressorJobs jobs = compressor_jobs(meta.data(), n_active, ratio, snap.data());
                auto emit_d = upload(jobs.emit), carry_d = upload(jobs.carry);
                auto dest_d = upload(jobs.dest);
                compressor_parallel(a, n_active, meta_d.ptr, emit_d.ptr, static_cast<int64_t>(jobs.emit.size() / 2),
                                    carry_d.ptr, dest_d.ptr, static_cast<int64_t>(jobs.dest.size()));
            } else {  // decode: a token or a few per sequence, one after another per channel
                auto snap_d = upload(snap);
                a.snapshot = snap_d.ptr;
                compressor_batch(a, n_active, meta_d.ptr);
            }
        }
        if (out.n() > 0) out.latent = rms_norm(pooled.reshaped({std::max(out.n(), 1), d}), cw.norm);
        return out;
    }
    int emit_base = 0;
    for (auto& s : batch.seqs) {
        if (s.n_tokens == 0) continue;
        float* state = device_carry(*s.state) + carry_offset / sizeof(float);
        std::vector<float*> snap(static_cast<size_t>(s.n_tokens), nullptr);
        int emits = 0;
        for (int i = 0; i < s.n_tokens; ++i) {
            const int64_t pos = s.start_pos + i;
            if ((pos + 1) % ratio == 0) ++emits;
            if ((pos + 1) % layout_.page_tokens == 0) {
                uint8_t* page =
                    layout_.page_ptr(s.state->pool, s.state->pages.at(static_cast<size_t>(pos / layout_.page_tokens)));
                snap[static_cast<size_t>(i)] = reinterpret_cast<float*>(page + layout_.snapshot_offset + carry_offset);
            }
        }
        auto snap_d = upload(snap);
        CompressorArgs a;
        a.kv = kv.f32();
        a.score = score.f32();
        a.ape = ape;
        a.ratio = ratio;
        a.d = d;
        a.overlap = cw.overlap ? 1 : 0;
        a.state = state;
        a.pooled = pooled.f32();
        a.emit_base = emit_base;
        a.start_pos = s.start_pos;
        a.n_tokens = s.n_tokens;
        a.row0 = s.row0;
        a.snapshot = snap_d.ptr;
        compressor_seq(a);
        emit_base += emits;
    }
    if (out.n() > 0) out.latent = rms_norm(pooled.reshaped({std::max(out.n(), 1), d}), cw.norm);
    return out;
}

Tensor CudaBackend::attention(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                              ForwardBatch& batch, StepScratch& scratch_base) {
    OpTimer op_(*this, "attention");
    auto& scratch = static_cast<CudaScratch&>(scratch_base);
    if (scratch.decode < 0) begin_decode(batch, scratch);
    if (scratch.decode == 1) return attention_decode(x, w, info, scratch);
    const int T = batch.rows(), H = cfg_.n_heads, D = cfg_.head_dim, rd = cfg_.rope_head_dim, W = cfg_.window_size;
    const float* freqs = weights_.rope(info);
    const LayerStateLayout& L = layout_.layers.at(static_cast<size_t>(info.layer));
    auto rows = row_infos(batch);
    std::vector<int64_t> pos_h(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) pos_h[static_cast<size_t>(t)] = rows[static_cast<size_t>(t)].pos;
    auto pos = upload(pos_h);
    auto entry = [&](const RowInfo& r, const StateSection& sec, int64_t idx) {
        SeqState& st = *r.seq->state;
        return layout_.entry<uint8_t>(st.pool, st.pages, sec, idx);
    };
    // Fast numerics list state-entry addresses on the device from the step's page tables (uploaded once per
    // step); Exact lists them on the host.
    const bool device_tables = numerics_ == Numerics::Fast;
    auto paged = [&]() -> const PagedSeqs& {
        if (!scratch.paged_keep) {
            PagedStep p = upload_paged_step(layout_, batch);
            scratch.paged_keep = p.keep;
            scratch.paged = p.seqs;
        }
        return scratch.paged;
    };
    auto entry_table = [&](const StateSection& sec, int ratio, std::vector<int64_t>& rowbase, int64_t& n) {
        AddressTable t = device_entry_table(paged(), batch, sec, ratio, rowbase);
        n = t.n;
        return DevArray<const uint8_t*>{t.keep, t.table};
    };

    phase("attn.q+kv projections");
    AttentionInputs in = attention_inputs(x, w, info, freqs, pos.ptr, T);
    Tensor &q = in.q, &kv = in.kv;

    // Sliding-window K=V, stored per token (packed: kv/entry_format.h).
    if (device_tables) {
        paged_store_entries(kv.f32(), T, L.window.format, paged(), paged_section(L.window));
    } else {
        std::vector<uint8_t*> dst(static_cast<size_t>(T));
        for (int t = 0; t < T; ++t)
            dst[static_cast<size_t>(t)] =
                entry(rows[static_cast<size_t>(t)], L.window, rows[static_cast<size_t>(t)].pos);
        auto dd = upload(dst);
        store_entries(kv.f32(), T, L.window.format, dd.ptr);
    }

    // Compressed entries (and, for key owners, indexer keys from the latents).
    if (info.compresses) {
        phase("attn.compressor");
        Emitted e = run_compressor(*w.compressor, L.carry_offset, x, batch);
        const int n = e.n();
        if (n > 0) {
            std::vector<int64_t> gpos(static_cast<size_t>(n));
            for (int i = 0; i < n; ++i) gpos[static_cast<size_t>(i)] = e.group[static_cast<size_t>(i)] * info.ratio;
            auto gp = upload(gpos);
            if (info.owns_index_k) {
                const IndexerWeight& iw = *w.indexer;
                Tensor k = rms_norm(linear_.run(e.latent, iw.wk), iw.k_norm);
                index_rope_qdq(k.f32(), n, 1, gp.ptr, freqs, L.index_k.format);
                std::vector<uint8_t*> dst(static_cast<size_t>(n));
                for (int i = 0; i < n; ++i)
                    dst[static_cast<size_t>(i)] = entry(rows[static_cast<size_t>(e.rows[static_cast<size_t>(i)])],
                                                        L.index_k, e.group[static_cast<size_t>(i)]);
                auto dd = upload(dst);
                store_entries(k.f32(), n, L.index_k.format, dd.ptr);
            }
            const EntryFormat& cf = L.comp.format;
            rope_qdq(e.latent.f32(), n, 1, D, D, D - rd, gp.ptr, freqs, rd, false, cf.quant_dims, cf.block,
                     qdq_kind(cf));
            std::vector<uint8_t*> dst(static_cast<size_t>(n));
            for (int i = 0; i < n; ++i)
                dst[static_cast<size_t>(i)] = entry(rows[static_cast<size_t>(e.rows[static_cast<size_t>(i)])], L.comp,
                                                    e.group[static_cast<size_t>(i)]);
            auto dd = upload(dst);
            store_entries(e.latent.f32(), n, L.comp.format, dd.ptr);
        }
    }

    // Which compressed entries each row attends to: sel [T, kmax] (-1: none) and counts [T] on the device.
    const int32_t* sel = nullptr;
    const int32_t* nsel = nullptr;
    int kmax = 0;
    std::shared_ptr<void> sel_keep, nsel_keep;
    if (info.ratio > 0) {
        const int ratio = info.ratio;
        // Per row: width (entries of its sequence at the end of this step) and visible entries.
        std::vector<int64_t> width_h(static_cast<size_t>(T)), visible_h(static_cast<size_t>(T));
        int64_t max_width = 0;
        for (int t = 0; t < T; ++t) {
            const BatchSeq& s = *rows[static_cast<size_t>(t)].seq;
            width_h[static_cast<size_t>(t)] = (s.start_pos + s.n_tokens) / ratio;
            visible_h[static_cast<size_t>(t)] = (rows[static_cast<size_t>(t)].pos + 1) / ratio;
            max_width = std::max(max_width, width_h[static_cast<size_t>(t)]);
        }
        if (info.has_indexer) {
            phase("attn.indexer+topk");
            const IndexerWeight& iw = *w.indexer;
            const int nh = iw.n_heads, hd = iw.head_dim;
            const StateSection& ks = layout_.layers.at(static_cast<size_t>(info.index_k_source)).index_k;
            if (info.index_compressor) {  // the indexer's own compressor turns tokens into keys
                Emitted e = run_compressor(*iw.compressor, L.index_carry_offset, x, batch);
                const int n = e.n();
                if (n > 0) {
                    std::vector<int64_t> gpos(static_cast<size_t>(n));
                    for (int i = 0; i < n; ++i) gpos[static_cast<size_t>(i)] = e.group[static_cast<size_t>(i)] * ratio;
                    auto gp = upload(gpos);
                    index_rope_qdq(e.latent.f32(), n, 1, gp.ptr, freqs, L.index_k.format);
                    std::vector<uint8_t*> dst(static_cast<size_t>(n));
                    for (int i = 0; i < n; ++i)
                        dst[static_cast<size_t>(i)] = entry(rows[static_cast<size_t>(e.rows[static_cast<size_t>(i)])],
                                                            L.index_k, e.group[static_cast<size_t>(i)]);
                    auto dd = upload(dst);
                    store_entries(e.latent.f32(), n, L.index_k.format, dd.ptr);
                }
            }
            Tensor& iq = in.iq;
            Tensor wts = index_queries(x, iq, iw, freqs, pos.ptr, T, ks.format);

            // Key addresses per sequence.
            std::vector<int64_t> keybase(static_cast<size_t>(T));
            DevArray<const uint8_t*> keys_d;
            int64_t n_keys = 0;
            if (device_tables) {
                keys_d = entry_table(ks, ratio, keybase, n_keys);
            } else {
                std::vector<const uint8_t*> keys_h;
                for (auto& s : batch.seqs) {
                    const int64_t base = static_cast<int64_t>(keys_h.size()), wseq = (s.start_pos + s.n_tokens) / ratio;
                    for (int64_t j = 0; j < wseq; ++j)
                        keys_h.push_back(layout_.entry<uint8_t>(s.state->pool, s.state->pages, ks, j));
                    for (int i = 0; i < s.n_tokens; ++i) keybase[static_cast<size_t>(s.row0 + i)] = base;
                }
                keys_d = upload(keys_h);
                n_keys = static_cast<int64_t>(keys_h.size());
            }
            auto width_d = upload(width_h), visible_d = upload(visible_h), keybase_d = upload(keybase);
            const bool fast = numerics_ == Numerics::Fast;
            const bool stream = fast && index_scores_stream_supported(nh, hd);
            // Sequences with many rows this step (prefill) score on the tensor cores in tiles of 64 rows sharing
            // their keys (decoded to bf16 once); the others (decode) stream their keys.
            constexpr int kMmaMinRows = 16, kMmaTileRows = 64;
            const bool mma = stream && index_scores_mma_supported(nh, hd);
            std::shared_ptr<void> kb;
            for (auto& s : batch.seqs)
                if (mma && s.n_tokens >= kMmaMinRows && max_width > 0 && !kb) {
                    kb = device_alloc(sizeof(uint16_t) * static_cast<size_t>(std::max<int64_t>(n_keys, 1) * hd));
                    gather_keys_bf16(keys_d.ptr, n_keys, ks.format, static_cast<uint16_t*>(kb.get()));
                }

            // Scores [rows, max_width], the candidate blocks and the top-k run over chunks of rows, so that the score
            // matrix stays bounded (a 64K-token prefill against 64K entries would otherwise need 16 GiB). Rows are
            // independent throughout, so the chunking changes no result.
            const int64_t stride = std::max<int64_t>(max_width, 1);
            int64_t chunk = std::max<int64_t>(1, index_score_bytes_ / (stride * 4));
            if (chunk >= kMmaTileRows) chunk = chunk / kMmaTileRows * kMmaTileRows;
            chunk = std::min<int64_t>(chunk, T);
            Tensor scores = empty(DType::F32, {std::max<int64_t>(chunk, 1), stride});
            auto qb = kb ? device_alloc(sizeof(uint16_t) * static_cast<size_t>(chunk) * nh * hd) : nullptr;
            const int bs = cfg_.candidate_block_size;
            const int64_t max_nb = std::max<int64_t>(info.candidate_source ? (max_width + bs - 1) / bs : 1, 1);
            Tensor bscore, bsel;
            int64_t mstride = 0;
            if (info.candidate_source) {
                bscore = empty(DType::F32, {std::max<int64_t>(chunk, 1), max_nb});
                bsel = empty(DType::I32, {std::max<int64_t>(chunk, 1), max_nb});
                mstride = candidate_mask_stride(std::max<int64_t>(max_width, 1), bs);
                scratch.mask = device_alloc(static_cast<size_t>(T * mstride));
                scratch.mask_width = width_d.keep;
                scratch.mask_stride = mstride;
            } else if (info.uses_candidates &&
                       !scratch.mask) {  // no candidate source ran: nothing is a candidate
                scratch.mask = device_alloc(4);
                scratch.mask_width = upload(std::vector<int64_t>(static_cast<size_t>(T), 0)).keep;
                scratch.mask_stride = 0;
            }
            kmax = iw.topk;
            sel_keep = device_alloc(sizeof(int32_t) * static_cast<size_t>(T) * kmax);
            nsel_keep = device_alloc(sizeof(int32_t) * static_cast<size_t>(T));
            auto tmp = device_alloc(sizeof(int32_t) * static_cast<size_t>(std::max<int64_t>(chunk, 1)) * kmax);
            const bool sorted = format_.sorted_selection;
            const bool fast_topk = fast && (sorted || static_cast<size_t>(kmax) * 8 <= 48 * 1024);
            for (int64_t r0 = 0; r0 < T; r0 += chunk) {
                const int64_t r1 = std::min<int64_t>(T, r0 + chunk), nr = r1 - r0;
                const int64_t *wd = width_d.ptr + r0, *vd = visible_d.ptr + r0, *kbase = keybase_d.ptr + r0;
                const float* iq_c = iq.f32() + r0 * nh * hd;
                const float* wts_c = wts.f32() + r0 * nh;
                if (stream) {
                    std::vector<int64_t> tiles;  // (first row in the chunk, rows, first key in kb, keys)
                    std::vector<int32_t> stream_rows;
                    for (auto& s : batch.seqs) {
                        const int64_t a = std::max<int64_t>(s.row0, r0), b = std::min<int64_t>(s.row0 + s.n_tokens, r1);
                        if (s.n_tokens <= 0 || a >= b) continue;
                        const int64_t wseq = (s.start_pos + s.n_tokens) / ratio;
                        if (kb && s.n_tokens >= kMmaMinRows) {
                            for (int64_t r = a; r < b; r += kMmaTileRows)
                                tiles.insert(tiles.end(), {r - r0, std::min<int64_t>(kMmaTileRows, b - r),
                                                           keybase[static_cast<size_t>(s.row0)], wseq});
                        } else {
                            for (int64_t r = a; r < b; ++r) stream_rows.push_back(static_cast<int32_t>(r - r0));
                        }
                    }
                    if (!tiles.empty() && max_width > 0) {
                        to_bf16(iq_c, nr * nh * hd, static_cast<uint16_t*>(qb.get()));
                        auto tiles_d = upload(tiles);
                        index_scores_mma(static_cast<const uint16_t*>(qb.get()), wts_c, nh, tiles_d.ptr,
                                         static_cast<int>(tiles.size() / 4), static_cast<const uint16_t*>(kb.get()), vd,
                                         max_width, scores.f32());
                    }
                    if (!stream_rows.empty()) {
                        auto rows_d = upload(stream_rows);
                        index_scores_stream(iq_c, wts_c, rows_d.ptr, static_cast<int>(stream_rows.size()), nh, hd, wd,
                                            vd, kbase, keys_d.ptr, ks.format, max_width, scores.f32());
                    }
                } else {
                    index_scores(iq_c, wts_c, nr, nh, hd, wd, vd, kbase, keys_d.ptr, ks.format, max_width,
                                 scores.f32());
                }
                if (info.candidate_source) {
                    (fast ? candidate_blocks_fast : candidate_blocks)(
                        scores.f32(), nr, max_width, wd, vd, bs, cfg_.candidate_topk_blocks, bscore.f32(),
                        bsel.data<int32_t>(), max_nb, static_cast<uint8_t*>(scratch.mask.get()) + r0 * mstride,
                        mstride);
                } else if (info.uses_candidates) {
                    apply_candidates(scores.f32(), nr, max_width, wd,
                                     static_cast<const uint8_t*>(scratch.mask.get()) + r0 * scratch.mask_stride,
                                     static_cast<const int64_t*>(scratch.mask_width.get()) + r0, scratch.mask_stride,
                                     bs);
                }
                (fast_topk ? topk_rows_fast : topk_rows)(scores.f32(), nr, max_width, wd, vd, kmax, sorted,
                                                         static_cast<int32_t*>(tmp.get()),
                                                         static_cast<int32_t*>(sel_keep.get()) + r0 * kmax,
                                                         static_cast<int32_t*>(nsel_keep.get()) + r0);
            }
            scratch.topk = sel_keep;  // for the layers after it that reuse it
            scratch.topk_count = nsel_keep;
            scratch.topk_k = kmax;
        } else if (info.reuses_selection) {
            sel_keep = scratch.topk;
            nsel_keep = scratch.topk_count;
            kmax = sel_keep ? scratch.topk_k : 0;
        } else {  // every visible entry
            std::vector<int32_t> counts(static_cast<size_t>(T));
            for (int t = 0; t < T; ++t) {
                const BatchSeq& s = *rows[static_cast<size_t>(t)].seq;
                counts[static_cast<size_t>(t)] = static_cast<int32_t>(
                    is_prefill(s) ? width_h[static_cast<size_t>(t)] : visible_h[static_cast<size_t>(t)]);
                kmax = std::max(kmax, counts[static_cast<size_t>(t)]);
            }
            if (device_tables) {
                sel_keep = device_alloc(sizeof(int32_t) * static_cast<size_t>(T) * std::max(kmax, 1));
                nsel_keep = device_alloc(sizeof(int32_t) * static_cast<size_t>(T));
                paged_all_entries(paged(), ratio, T, kmax, static_cast<int32_t*>(sel_keep.get()),
                                  static_cast<int32_t*>(nsel_keep.get()));
            } else {
                std::vector<int32_t> list(static_cast<size_t>(T) * std::max(kmax, 1), -1);
                for (int t = 0; t < T; ++t)
                    for (int32_t j = 0; j < counts[static_cast<size_t>(t)]; ++j)
                        list[static_cast<size_t>(t) * kmax + j] = j < visible_h[static_cast<size_t>(t)] ? j : -1;
                auto l = upload(list);
                auto c = upload(counts);
                sel_keep = l.keep;
                nsel_keep = c.keep;
            }
        }
        if (sel_keep && kmax > 0) {
            sel = static_cast<const int32_t*>(sel_keep.get());
            nsel = static_cast<const int32_t*>(nsel_keep.get());
        } else {
            kmax = 0;
        }
    }

    phase("attn.sparse attention");
    // Key lists: the window entries, then the selected compressed entries.
    const LayerStateLayout& CL =
        layout_.layers.at(static_cast<size_t>(info.comp_source >= 0 ? info.comp_source : info.layer));
    DevArray<const uint8_t*> win_d, comp_d;
    DevArray<int32_t> nwin_d;
    std::vector<int64_t> compbase(static_cast<size_t>(T), 0);
    // Prefill-sized steps decode the keys they can see to bf16 rows once, so that the attention kernel gathers rows
    // instead of decoding every key in every query's CTA. Worth it when a row serves many queries (a prefill's rows
    // serve up to W + top-k each); not for decode batches, which would decode whole contexts for one query each.
    const EntryFormat& comp_format = CL.comp.present() ? CL.comp.format : L.window.format;
    constexpr int kRowsFrom = 256, kMinReuse = 8;
    int64_t decoded_rows = 0;
    for (const BatchSeq& s : batch.seqs)
        if (s.n_tokens > 0) decoded_rows += window_rows_of(s, W) + (sel ? (s.start_pos + s.n_tokens) / info.ratio : 0);
    const bool key_rows = device_tables && T >= kRowsFrom && decoded_rows * kMinReuse <= int64_t{T} * (W + kmax) &&
                          sparse_attention_rows_enabled() && sparse_attention_rows_supported(H, D) &&
                          L.window.format.dim == D && comp_format.dim == D;
    const int64_t row_bytes = 2 * static_cast<int64_t>(D);
    std::shared_ptr<void> win_rows, comp_rows;
    if (device_tables) {
        WindowTable wt;
        if (key_rows) {
            WindowRows wr = device_window_rows(paged(), batch, L.window, W, format_.ring_before_full);
            wt = wr.table;
            win_rows = wr.rows;
        } else {
            wt = device_window_table(paged(), L.window, T, W, format_.ring_before_full);
        }
        win_d = {wt.win.keep, wt.win.table};
        nwin_d = {wt.nwin_keep, wt.nwin};
        int64_t n_comp = 0;
        if (sel) comp_d = entry_table(CL.comp, info.ratio, compbase, n_comp);
        if (sel && key_rows) {
            comp_rows = device_alloc(static_cast<size_t>(std::max<int64_t>(n_comp, 1) * row_bytes));
            gather_keys_bf16(comp_d.ptr, n_comp, CL.comp.format, static_cast<uint16_t*>(comp_rows.get()));
        }
    } else {
        std::vector<const uint8_t*> win(static_cast<size_t>(T) * W, nullptr);
        std::vector<int32_t> nwin(static_cast<size_t>(T));
        for (int t = 0; t < T; ++t) {
            auto list = window_list(*rows[static_cast<size_t>(t)].seq, rows[static_cast<size_t>(t)].pos, W,
                                    format_.ring_before_full);
            nwin[static_cast<size_t>(t)] = static_cast<int32_t>(list.size());
            for (size_t j = 0; j < list.size(); ++j)
                if (list[j] >= 0)
                    win[static_cast<size_t>(t) * W + j] = entry(rows[static_cast<size_t>(t)], L.window, list[j]);
        }
        std::vector<const uint8_t*> comp_addr;
        if (sel) {
            for (auto& s : batch.seqs) {
                const int64_t base = static_cast<int64_t>(comp_addr.size()),
                              wseq = (s.start_pos + s.n_tokens) / info.ratio;
                for (int64_t j = 0; j < wseq; ++j)
                    comp_addr.push_back(layout_.entry<uint8_t>(s.state->pool, s.state->pages, CL.comp, j));
                for (int i = 0; i < s.n_tokens; ++i) compbase[static_cast<size_t>(s.row0 + i)] = base;
            }
        }
        win_d = upload(win);
        nwin_d = upload(nwin);
        comp_d = upload(comp_addr);
    }
    auto compbase_d = upload(compbase);
    const int maxk = W + kmax;
    auto keys = device_alloc(sizeof(uint8_t*) * static_cast<size_t>(T) * maxk);
    auto nkeys = device_alloc(sizeof(int32_t) * static_cast<size_t>(T));
    build_keys(T, win_d.ptr, nwin_d.ptr, W, sel, nsel, kmax, comp_d.ptr, compbase_d.ptr,
               static_cast<const uint8_t**>(keys.get()), static_cast<int32_t*>(nkeys.get()), maxk,
               static_cast<const uint8_t*>(comp_rows.get()), row_bytes);

    // Sparse attention with sink, then the inverse rotation of the output.
    KeyRefs kr;
    kr.keys = static_cast<const uint8_t* const*>(keys.get());
    kr.nkeys = static_cast<const int32_t*>(nkeys.get());
    kr.nwin = nwin_d.ptr;
    kr.maxk = maxk;
    kr.win = L.window.format;
    kr.comp = comp_format;
    Tensor o = sparse_attend(q, w, kr, key_rows);
    phase("attn.output projection");
    return project_output(o, w, freqs, pos.ptr, T);
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
    in.kv = window_kv_of(kva, w, freqs, pos, T, layout_.layers.at(static_cast<size_t>(info.layer)).window.format);
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

Tensor CudaBackend::sparse_attend(const Tensor& q, const AttentionWeight& w, const KeyRefs& kr, bool key_rows) {
    const int64_t T = q.dim(0);
    const int H = cfg_.n_heads, D = cfg_.head_dim;
    Tensor o = empty(DType::F32, {T, H, D});
    const float scale = static_cast<float>(std::pow(D, -0.5));
    if (key_rows) {
        sparse_attention_rows(q.f32(), T, H, D, scale, weights_.f32(w.attn_sink), kr.keys, kr.nkeys, kr.maxk, o.f32());
    } else if (numerics_ == Numerics::Fast && sparse_attention_mma_supported(H, D, kr.win, kr.comp)) {
        // Tensor cores, prefill and decode (few rows split their keys over CTAs, with a scratch for the parts).
        auto ws = device_alloc(sparse_attention_mma_workspace(T, H, D, kr.maxk));
        sparse_attention_mma(q.f32(), T, H, D, scale, weights_.f32(w.attn_sink), kr, o.f32(), ws.get());
    } else {
        sparse_attention(q.f32(), T, H, D, scale, weights_.f32(w.attn_sink), kr, o.f32(), numerics_ == Numerics::Fast);
    }
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
                              int T, const EntryFormat& f) {
    return window_kv_of(linear_.run(x, w.wkv), w, freqs, pos, T, f);
}

Tensor CudaBackend::window_kv_of(const Tensor& projected, const AttentionWeight& w, const float* freqs,
                                 const int64_t* pos, int T, const EntryFormat& f) {
    const int D = cfg_.head_dim, rd = cfg_.rope_head_dim;
    Tensor kv = rms_norm(projected, w.kv_norm);
    rope_qdq(kv.f32(), T, 1, D, D, D - rd, pos, freqs, rd, false, f.quant_dims, f.block, qdq_kind(f));
    return kv;
}

Tensor CudaBackend::project_output(Tensor& o, const AttentionWeight& w, const float* freqs, const int64_t* pos, int T) {
    const int H = cfg_.n_heads, D = cfg_.head_dim, rd = cfg_.rope_head_dim;
    rope(o.f32(), T, H, static_cast<int64_t>(H) * D, D, D - rd, pos, freqs, rd, true);
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
