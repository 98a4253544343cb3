// The prefill planner (attention_planner.h): prefill, mixed and Exact-numerics steps. The host lists what the step's
// rows need: positions, the groups they complete, and either the entries' addresses themselves (Exact) or the step's
// page tables, from which kernels work the addresses out (Fast: uploaded once per step by the first attention layer).
#include "ops/attention_plan.h"
#include "ops/cuda/attention_planner.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/paged_state.h"
#include "util/error.h"

#include <algorithm>

namespace peregrine::cuda {

// A step with a sequence this long runs the compressor over its tokens in parallel (compressor_parallel); shorter
// ones run them in order per channel (compressor_batch), which is cheaper for a token or a few.
constexpr int64_t kParallelCompressorTokens = 32;
// Sequences with this many rows in a step score the indexer on the tensor cores, in tiles of 64 rows that share
// their keys (decoded to bf16 once); the others stream their keys.
constexpr int kMmaMinRows = 16, kMmaTileRows = 64;
// Steps of this many rows decode the keys they can see to bf16 rows once, so that the attention kernel gathers rows
// instead of decoding every key in every query's CTA: when a decoded row serves at least kMinReuse queries on
// average (a prefill's rows serve up to W + top-k each; a decode batch would decode whole contexts for one query).
constexpr int kRowsFrom = 256, kMinReuse = 8;

class PrefillPlanner final : public AttentionPlanner {
public:
    PrefillPlanner(CudaBackend& b, ForwardBatch& batch, CudaScratch& scratch)
        : b_(b), batch_(batch), scratch_(scratch), layout_(b.layout_), T_(batch.rows()),
          device_tables_(b.numerics_ == Numerics::Fast), rows_(row_infos(batch)) {
        std::vector<int64_t> pos(static_cast<size_t>(T_));
        for (int64_t t = 0; t < T_; ++t) pos[static_cast<size_t>(t)] = rows_[static_cast<size_t>(t)].pos;
        pos_ = upload(pos);
    }

    const int64_t* positions() override { return pos_.ptr; }
    const PagedSeqs* paged_rows() override { return device_tables_ ? &paged() : nullptr; }

    void store_rows(const Tensor& x, const StateSection& sec) override {
        if (device_tables_) {
            paged_store_entries(x.f32(), T_, sec.format, paged(), paged_section(sec));
            return;
        }
        std::vector<uint8_t*> dst(static_cast<size_t>(T_));
        for (int64_t t = 0; t < T_; ++t) {
            const RowInfo& r = rows_[static_cast<size_t>(t)];
            dst[static_cast<size_t>(t)] = entry(r, sec, r.pos);
        }
        auto dd = upload(dst);
        store_entries(x.f32(), T_, sec.format, dd.ptr);
    }

    Compressed compress(const CompressorWeight& cw, size_t carry_offset, const Tensor& x) override;

    void store_groups(const Tensor& x, const StateSection& sec, const Compressed& c) override {
        std::vector<uint8_t*> dst(static_cast<size_t>(c.n));
        for (size_t i = 0; i < dst.size(); ++i)
            dst[i] = entry(rows_[static_cast<size_t>(c.rows[i])], sec, c.group[i]);
        auto dd = upload(dst);
        store_entries(x.f32(), c.n, sec.format, dd.ptr);
    }

    Widths widths(int ratio, bool on_device) override {
        Widths w;
        w.width_h.resize(static_cast<size_t>(T_));
        w.visible_h.resize(static_cast<size_t>(T_));
        for (int64_t t = 0; t < T_; ++t) {
            const RowInfo& r = rows_[static_cast<size_t>(t)];
            w.width_h[static_cast<size_t>(t)] = (r.seq->start_pos + r.seq->n_tokens) / ratio;
            w.visible_h[static_cast<size_t>(t)] = (r.pos + 1) / ratio;
            w.max = std::max(w.max, w.width_h[static_cast<size_t>(t)]);
        }
        if (on_device) {
            std::vector<int64_t> both(w.width_h);
            both.insert(both.end(), w.visible_h.begin(), w.visible_h.end());
            auto d = upload(both);
            w.keep = d.keep;
            w.width = d.ptr;
            w.visible = d.ptr + T_;
        }
        return w;
    }

    EntryTable entries(const StateSection& sec, int ratio, const Widths&) override {
        EntryTable e;
        if (device_tables_) {
            AddressTable t = device_entry_table(paged(), batch_, sec, ratio, e.base_h);
            e.table = t.table;
            e.n = t.n;
            e.keep.push_back(t.keep);
        } else {
            e.base_h.resize(static_cast<size_t>(T_));
            std::vector<const uint8_t*> table;
            for (const BatchSeq& s : batch_.seqs) {
                const int64_t base = static_cast<int64_t>(table.size()), n = (s.start_pos + s.n_tokens) / ratio;
                for (int64_t j = 0; j < n; ++j)
                    table.push_back(layout_.entry<uint8_t>(*s.state, sec, j));
                for (int i = 0; i < s.n_tokens; ++i) e.base_h[static_cast<size_t>(s.row0 + i)] = base;
            }
            auto d = upload(table);
            e.table = d.ptr;
            e.n = static_cast<int64_t>(table.size());
            e.keep.push_back(d.keep);
        }
        auto base = upload(e.base_h);
        e.base = base.ptr;
        e.keep.push_back(base.keep);
        return e;
    }

    int64_t chunk_rows(int64_t stride) override {
        int64_t chunk = std::max<int64_t>(1, b_.index_score_bytes_ / (stride * 4));
        if (chunk >= kMmaTileRows) chunk = chunk / kMmaTileRows * kMmaTileRows;
        chunk_ = std::min<int64_t>(chunk, T_);
        return chunk_;
    }

    void score(const IndexQueries& q, int64_t r0, int64_t r1, const Widths& w, const EntryTable& keys,
               const EntryFormat& kf, float* scores) override;

    std::shared_ptr<void> step_buffer(StepSlot, size_t bytes) override { return device_alloc(bytes); }

    uint8_t* make_candidate_mask(int ratio, const Widths& w, int64_t stride) override {
        scratch_.mask = device_alloc(static_cast<size_t>(T_ * stride));
        scratch_.mask_width = std::shared_ptr<const int64_t>(w.keep, w.width);
        scratch_.mask_stride = stride;
        scratch_.mask_ratio = ratio;
        return static_cast<uint8_t*>(scratch_.mask.get());
    }

    CandidateMask candidate_mask(int, const Widths&) override {
        if (!scratch_.mask) {  // no candidate source ran: nothing is a candidate
            scratch_.mask = device_alloc(4);
            auto zeros = upload(std::vector<int64_t>(static_cast<size_t>(T_), 0));
            scratch_.mask_width = std::shared_ptr<const int64_t>(zeros.keep, zeros.ptr);
            scratch_.mask_stride = 0;
        }
        return {static_cast<const uint8_t*>(scratch_.mask.get()), scratch_.mask_width.get(), scratch_.mask_stride};
    }

    Selection all_entries(int ratio, const Widths& w) override;
    KeyTables keys(const StateSection& win, const StateSection& comp, const EntryFormat& comp_format, int ratio,
                   const Widths& w, int k) override;

private:
    CudaBackend& b_;
    ForwardBatch& batch_;
    CudaScratch& scratch_;
    const StateLayout& layout_;
    const int64_t T_;
    const bool device_tables_;  // Fast numerics: entry addresses worked out on the device from the page tables
    std::vector<RowInfo> rows_;
    DevArray<int64_t> pos_;
    int64_t chunk_ = 1;
    bool keys_decoded_ = false;
    std::shared_ptr<void> kb_, qb_;  // tensor-core scoring: the keys decoded to bf16, a chunk's queries in bf16

    const PagedSeqs& paged() {
        if (!scratch_.paged_keep) {
            PagedStep p = upload_paged_step(layout_, batch_);
            scratch_.paged_keep = p.keep;
            scratch_.paged = p.seqs;
        }
        return scratch_.paged;
    }
    uint8_t* entry(const RowInfo& r, const StateSection& sec, int64_t idx) {
        SeqState& st = *r.seq->state;
        return layout_.entry<uint8_t>(st, sec, idx);
    }
};

Compressed PrefillPlanner::compress(const CompressorWeight& cw, size_t carry_offset, const Tensor& x) {
    const int ratio = cw.ratio, d = cw.head_dim;
    Compressed out;
    out.ratio = ratio;
    Tensor pooled;
    if (ratio == 1) {  // every row ends its group
        Tensor kv = b_.linear_.run(x, cw.wkv);
        for (auto& s : batch_.seqs)
            for (int i = 0; i < s.n_tokens; ++i) {
                out.rows.push_back(s.row0 + i);
                out.group.push_back(s.start_pos + i);
            }
        out.pooled = b_.gather_rows(kv, out.rows);  // in the rows' order
    } else {
        // x is the attention norm's output (bf16 values): the fp32 projections take the bf16 tensor cores.
        auto [kv, score] = b_.linear_.run_pair(x, cw.wkv, cw.wgate, true);
        for (auto& s : batch_.seqs)
            for (int i = 0; i < s.n_tokens; ++i)
                if ((s.start_pos + i + 1) % ratio == 0) {
                    out.rows.push_back(s.row0 + i);
                    out.group.push_back((s.start_pos + i) / ratio);
                }
        const int n = static_cast<int>(out.rows.size());
        pooled = empty(DType::F32, {std::max(n, 1), d});
        CompressorArgs a;
        a.kv = kv.f32();
        a.score = score.f32();
        a.ape = cw.ape.empty() ? nullptr : b_.weights_.f32(cw.ape);
        a.ratio = ratio;
        a.d = d;
        a.overlap = cw.overlap ? 1 : 0;
        a.pooled = pooled.f32();
        // Where a token ends a page, its sequence's carry after it goes to the page's snapshot (prefix cache).
        auto snapshot = [&](const BatchSeq& s, int64_t pos) -> float* {
            if ((pos + 1) % layout_.page_tokens != 0) return nullptr;
            return reinterpret_cast<float*>(layout_.snapshot(*s.state, pos / layout_.page_tokens) + carry_offset);
        };
        // A speculative step keeps the carry after each of its tokens but the last (BatchSeq::speculative).
        bool speculative = false;
        auto step_carry = [&](const BatchSeq& s, int i) -> float* {
            if (!s.speculative || i + 1 == s.n_tokens) return nullptr;
            speculative = true;
            return reinterpret_cast<float*>(s.state->step_carries.at(static_cast<size_t>(i + 1)).get() + carry_offset);
        };
        if (device_tables_) {
            // One launch for every sequence; their carries stay in device memory. The kernel finds sequence s's
            // carry at a signed float offset from the first one's (they are separate allocations).
            std::vector<int64_t> meta;
            std::vector<float*> snap, steps;
            float* carry_base = nullptr;
            int emit_base = 0;
            int64_t longest = 0;
            for (auto& s : batch_.seqs) {
                if (s.n_tokens == 0) continue;
                float* carry = b_.device_carry(*s.state) + carry_offset / sizeof(float);
                if (!carry_base) carry_base = carry;
                const int64_t state_off = (static_cast<int64_t>(reinterpret_cast<intptr_t>(carry)) -
                                           static_cast<int64_t>(reinterpret_cast<intptr_t>(carry_base))) /
                                          static_cast<int64_t>(sizeof(float));
                meta.insert(meta.end(), {s.start_pos, s.n_tokens, s.row0, emit_base, state_off,
                                         static_cast<int64_t>(snap.size())});
                longest = std::max<int64_t>(longest, s.n_tokens);
                for (int i = 0; i < s.n_tokens; ++i) {
                    if ((s.start_pos + i + 1) % ratio == 0) ++emit_base;
                    snap.push_back(snapshot(s, s.start_pos + i));
                    steps.push_back(step_carry(s, i));
                }
            }
            if (carry_base) {
                const int n_active = static_cast<int>(meta.size() / 6);
                auto meta_d = upload(meta);
                a.state = carry_base;
                if (longest >= kParallelCompressorTokens) {  // the tokens in parallel too
                    const CompressorJobs jobs = compressor_jobs(meta.data(), n_active, ratio, snap.data(),
                                                                speculative ? steps.data() : nullptr);
                    auto emit_d = upload(jobs.emit), carry_d = upload(jobs.carry);
                    auto dest_d = upload(jobs.dest);
                    compressor_parallel(a, n_active, meta_d.ptr, emit_d.ptr,
                                        static_cast<int64_t>(jobs.emit.size() / 2), carry_d.ptr, dest_d.ptr,
                                        static_cast<int64_t>(jobs.dest.size()));
                } else {  // a token or a few per sequence, one after another per channel
                    auto snap_d = upload(snap);
                    DevArray<float*> steps_d;
                    if (speculative) steps_d = upload(steps);
                    a.snapshot = snap_d.ptr;
                    a.step = steps_d.ptr;
                    compressor_batch(a, n_active, meta_d.ptr);
                }
            }
        } else {  // the reference's order: one sequence at a time
            int emit_base = 0;
            for (auto& s : batch_.seqs) {
                if (s.n_tokens == 0) continue;
                std::vector<float*> snap(static_cast<size_t>(s.n_tokens)), steps(snap.size());
                int emits = 0;
                for (int i = 0; i < s.n_tokens; ++i) {
                    if ((s.start_pos + i + 1) % ratio == 0) ++emits;
                    snap[static_cast<size_t>(i)] = snapshot(s, s.start_pos + i);
                    steps[static_cast<size_t>(i)] = step_carry(s, i);
                }
                auto snap_d = upload(snap);
                DevArray<float*> steps_d;
                if (s.speculative) steps_d = upload(steps);
                a.step = steps_d.ptr;
                a.state = b_.device_carry(*s.state) + carry_offset / sizeof(float);
                a.emit_base = emit_base;
                a.start_pos = s.start_pos;
                a.n_tokens = s.n_tokens;
                a.row0 = s.row0;
                a.snapshot = snap_d.ptr;
                compressor_seq(a);
                emit_base += emits;
            }
        }
        if (n > 0) out.pooled = pooled;
    }
    out.n = static_cast<int64_t>(out.rows.size());
    if (out.n > 0) {
        std::vector<int64_t> gpos(out.group.size());
        for (size_t i = 0; i < gpos.size(); ++i) gpos[i] = out.group[i] * ratio;
        auto gp = upload(gpos);
        out.gpos = gp.ptr;
        out.keep = gp.keep;
    }
    return out;
}

void PrefillPlanner::score(const IndexQueries& q, int64_t r0, int64_t r1, const Widths& w, const EntryTable& keys,
                           const EntryFormat& kf, float* scores) {
    const int nh = q.heads, hd = q.dim;
    const int64_t nr = r1 - r0;
    const float* iq = q.q + r0 * nh * hd;
    const float* wts = q.w + r0 * nh;
    const int64_t *wd = w.width + r0, *vd = w.visible + r0, *kbase = keys.base + r0;
    if (!device_tables_ || !index_scores_stream_supported(nh, hd)) {
        index_scores(iq, wts, nr, nh, hd, wd, vd, kbase, keys.table, kf, w.max, scores);
        return;
    }
    if (!keys_decoded_) {  // once per layer: the keys in bf16 for the tensor cores, if a sequence tiles
        keys_decoded_ = true;
        bool tiles = false;
        for (const BatchSeq& s : batch_.seqs) tiles = tiles || s.n_tokens >= kMmaMinRows;
        if (tiles && w.max > 0 && index_scores_mma_supported(nh, hd)) {
            kb_ = device_alloc(sizeof(uint16_t) * static_cast<size_t>(std::max<int64_t>(keys.n, 1) * hd));
            gather_keys_bf16(keys.table, keys.n, kf, static_cast<uint16_t*>(kb_.get()));
            qb_ = device_alloc(sizeof(uint16_t) * static_cast<size_t>(chunk_) * nh * hd);
        }
    }
    std::vector<int64_t> tiles;  // (first row in the chunk, rows, first key in kb, keys)
    std::vector<int32_t> stream_rows;
    for (const BatchSeq& s : batch_.seqs) {
        const int64_t a = std::max<int64_t>(s.row0, r0), b = std::min<int64_t>(s.row0 + s.n_tokens, r1);
        if (s.n_tokens <= 0 || a >= b) continue;
        if (kb_ && s.n_tokens >= kMmaMinRows) {
            for (int64_t r = a; r < b; r += kMmaTileRows)
                tiles.insert(tiles.end(), {r - r0, std::min<int64_t>(kMmaTileRows, b - r),
                                           keys.base_h[static_cast<size_t>(s.row0)],
                                           w.width_h[static_cast<size_t>(s.row0)]});
        } else {
            for (int64_t r = a; r < b; ++r) stream_rows.push_back(static_cast<int32_t>(r - r0));
        }
    }
    if (!tiles.empty() && w.max > 0) {
        to_bf16(iq, nr * nh * hd, static_cast<uint16_t*>(qb_.get()));
        auto tiles_d = upload(tiles);
        index_scores_mma(static_cast<const uint16_t*>(qb_.get()), wts, nh, tiles_d.ptr,
                         static_cast<int>(tiles.size() / 4), static_cast<const uint16_t*>(kb_.get()), vd, w.max,
                         scores);
    }
    if (!stream_rows.empty()) {
        auto rows_d = upload(stream_rows);
        index_scores_stream(iq, wts, rows_d.ptr, static_cast<int>(stream_rows.size()), nh, hd, wd, vd, kbase,
                            keys.table, kf, w.max, scores);
    }
}

Selection PrefillPlanner::all_entries(int ratio, const Widths& w) {
    // A one-shot prefill's rows take every entry of their sequence up to the step's end (the kernels mask the later
    // ones); the others those they see.
    Selection s;
    std::vector<int32_t> counts(static_cast<size_t>(T_));
    for (int64_t t = 0; t < T_; ++t) {
        const size_t i = static_cast<size_t>(t);
        counts[i] = static_cast<int32_t>(lists_step_width(*rows_[i].seq) ? w.width_h[i] : w.visible_h[i]);
        s.k = std::max(s.k, counts[i]);
    }
    if (device_tables_) {
        s.sel = device_alloc(sizeof(int32_t) * static_cast<size_t>(T_) * std::max(s.k, 1));
        s.count = device_alloc(sizeof(int32_t) * static_cast<size_t>(T_));
        paged_all_entries(paged(), ratio, T_, s.k, static_cast<int32_t*>(s.sel.get()),
                          static_cast<int32_t*>(s.count.get()));
    } else {
        std::vector<int32_t> list(static_cast<size_t>(T_) * std::max(s.k, 1), -1);
        for (int64_t t = 0; t < T_; ++t)
            for (int32_t j = 0; j < counts[static_cast<size_t>(t)]; ++j)
                list[static_cast<size_t>(t) * s.k + j] = j < w.visible_h[static_cast<size_t>(t)] ? j : -1;
        s.sel = upload(list).keep;
        s.count = upload(counts).keep;
    }
    return s;
}

KeyTables PrefillPlanner::keys(const StateSection& win, const StateSection& comp, const EntryFormat& comp_format,
                               int ratio, const Widths& w, int k) {
    const int W = b_.cfg_.window_size, H = b_.cfg_.n_heads, D = b_.cfg_.head_dim;
    const bool ring_before_full = b_.format().ring_before_full;
    KeyTables kt;
    if (!device_tables_) {
        std::vector<const uint8_t*> list(static_cast<size_t>(T_) * W, nullptr);
        std::vector<int32_t> nwin(static_cast<size_t>(T_));
        for (int64_t t = 0; t < T_; ++t) {
            const RowInfo& r = rows_[static_cast<size_t>(t)];
            auto positions = window_list(*r.seq, r.pos, W, ring_before_full);
            nwin[static_cast<size_t>(t)] = static_cast<int32_t>(positions.size());
            for (size_t j = 0; j < positions.size(); ++j)
                if (positions[j] >= 0) list[static_cast<size_t>(t) * W + j] = entry(r, win, positions[j]);
        }
        auto list_d = upload(list);
        auto nwin_d = upload(nwin);
        kt.win = list_d.ptr;
        kt.nwin = nwin_d.ptr;
        kt.keep = {list_d.keep, nwin_d.keep};
        if (k > 0) kt.comp = entries(comp, ratio, w);
        return kt;
    }
    int64_t decoded_rows = 0;  // the rows that decoding the keys would make
    for (const BatchSeq& s : batch_.seqs)
        if (s.n_tokens > 0) decoded_rows += window_rows_of(s, W) + (k > 0 ? (s.start_pos + s.n_tokens) / ratio : 0);
    kt.key_rows = T_ >= kRowsFrom && decoded_rows * kMinReuse <= T_ * (W + k) && sparse_attention_rows_enabled() &&
                  sparse_attention_rows_supported(H, D) && win.format.dim == D && comp_format.dim == D;
    WindowTable wt;
    if (kt.key_rows) {
        WindowRows wr = device_window_rows(paged(), batch_, win, W, ring_before_full);
        wt = wr.table;
        kt.keep.push_back(wr.rows);
    } else {
        wt = device_window_table(paged(), win, T_, W, ring_before_full);
    }
    kt.win = wt.win.table;
    kt.nwin = wt.nwin;
    kt.keep.insert(kt.keep.end(), {wt.win.keep, wt.nwin_keep});
    if (k > 0) kt.comp = entries(comp, ratio, w);
    if (k > 0 && kt.key_rows) {
        auto rows = device_alloc(static_cast<size_t>(std::max<int64_t>(kt.comp.n, 1) * 2 * D));
        gather_keys_bf16(kt.comp.table, kt.comp.n, comp.format, static_cast<uint16_t*>(rows.get()));
        kt.comp_rows = static_cast<const uint8_t*>(rows.get());
        kt.keep.push_back(rows);
    }
    return kt;
}

std::unique_ptr<AttentionPlanner> prefill_planner(CudaBackend& b, ForwardBatch& batch, CudaScratch& scratch) {
    return std::make_unique<PrefillPlanner>(b, batch, scratch);
}

}  // namespace peregrine::cuda
