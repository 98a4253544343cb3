// Attention block of DeepSeek-V4.1 and V4: projections, sliding-window K=V, compressor, indexer and the
// sparse attention with sink, following the official reference's arithmetic and index order.
#include "ops/attention_plan.h"
#include "ops/rounded_math.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/linear.h"
#include "tensor/quant.h"
#include "util/error.h"
#include "util/thread_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace peregrine::cpu {

// State entries are packed (kv/entry_format.h); the values written were QDQ'd already, so packing them is
// exact, and a value it would change is a bug worth stopping for.
static void store_entry(const StateSection& sec, const float* x, uint8_t* dst) {
    if (!encode_entry(sec.format, x, dst))
        fail("state entry (kind {}, dim {}) does not hold its values exactly", sec.format.kind, sec.format.dim);
}
static std::vector<float> load_entry(const StateSection& sec, const uint8_t* src) {
    std::vector<float> v(static_cast<size_t>(sec.format.dim));
    decode_entry(sec.format, src, v.data());
    return v;
}
// Quantise-dequantise x to the values an entry of format f holds (the model's QDQ before a store).
static void qdq_entry(const EntryFormat& f, float* x) {
    switch (f.kind) {
        case kEntryFp8: qdq_fp8(x, f.quant_dims, f.block); break;
        case kEntryFp4E4m3: qdq_fp4_e4m3(x, f.dim, f.block); break;
        default: qdq_fp4_ue8m0(x, f.dim, f.block); break;
    }
}

// ---------------------------------------------------------------------------------------------------
// Compressor: pools `ratio` consecutive tokens into one latent with a per-channel softmax gate. Tokens go
// through the same state machine the reference uses for decode (equivalent to its prefill pooling), so a
// sequence can be continued from any point; the carry is snapshotted into each page it completes.
// Emits (group index, latent before RoPE as bf16-normalised values).
struct Emitted {
    int row;
    int64_t group;
    std::vector<float> latent;
};

static std::vector<Emitted> run_compressor(const ModelConfig& cfg, const StateLayout& layout,
                                           const CompressorWeight& cw, size_t carry_offset, const Tensor& x,
                                           ForwardBatch& batch, Backend& be) {
    const int ratio = cw.ratio, d = cw.head_dim, coff = cw.overlap ? 2 : 1, width = coff * d;
    const float eps = static_cast<float>(cfg.norm_eps);
    std::vector<Emitted> out;
    if (ratio == 1) {  // one latent per token: a plain bf16 projection and norm
        Tensor kv = be.linear(x, cw.wkv);
        for (auto& s : batch.seqs)
            for (int i = 0; i < s.n_tokens; ++i) {
                Emitted e{s.row0 + i, s.start_pos + i, std::vector<float>(static_cast<size_t>(d))};
                rms_norm_row(kv.f32() + static_cast<int64_t>(s.row0 + i) * d, cw.norm, d, eps, e.latent.data());
                out.push_back(std::move(e));
            }
        return out;
    }
    Tensor kv = be.linear(x, cw.wkv), score = be.linear(x, cw.wgate);  // fp32
    const int slots = coff * ratio;
    for (auto& s : batch.seqs) {
        float* kv_state = reinterpret_cast<float*>(s.state->carry.get() + carry_offset);
        float* sc_state = kv_state + static_cast<size_t>(slots) * width;
        for (int i = 0; i < s.n_tokens; ++i) {
            const int64_t pos = s.start_pos + i, row = s.row0 + i;
            const int slot = static_cast<int>(pos % ratio) + (cw.overlap ? ratio : 0);
            const float* kr = kv.f32() + row * width;
            const float* sr = score.f32() + row * width;
            for (int c = 0; c < width; ++c) {
                kv_state[slot * width + c] = kr[c];
                sc_state[slot * width + c] =
                    cw.ape.empty() ? sr[c] : sr[c] + cw.ape.data<float>()[(pos % ratio) * width + c];
            }
            if ((pos + 1) % ratio == 0) {
                // Gather the members: overlap uses the previous window's first halves and this window's second.
                const int n = cw.overlap ? 2 * ratio : ratio;
                std::vector<float> pooled(static_cast<size_t>(d));
                std::vector<float> p(static_cast<size_t>(n));
                for (int c = 0; c < d; ++c) {
                    auto kv_at = [&](int j) {
                        return cw.overlap ? (j < ratio ? kv_state[j * width + c] : kv_state[j * width + d + c])
                                          : kv_state[j * width + c];
                    };
                    auto sc_at = [&](int j) {
                        return cw.overlap ? (j < ratio ? sc_state[j * width + c] : sc_state[j * width + d + c])
                                          : sc_state[j * width + c];
                    };
                    float mx = -INFINITY;
                    for (int j = 0; j < n; ++j) mx = std::max(mx, sc_at(j));
                    float sum = 0.0f;
                    for (int j = 0; j < n; ++j) sum += (p[j] = exp_cr(sc_at(j) - mx));
                    float acc = 0.0f;
                    for (int j = 0; j < n; ++j) acc += kv_at(j) * (p[j] / sum);
                    pooled[c] = round_bf16(acc);
                }
                Emitted e{static_cast<int>(row), pos / ratio, std::vector<float>(static_cast<size_t>(d))};
                rms_norm_row(pooled.data(), cw.norm, d, eps, e.latent.data());
                out.push_back(std::move(e));
                if (cw.overlap) {  // this window becomes the previous one
                    std::memcpy(kv_state, kv_state + ratio * width, sizeof(float) * static_cast<size_t>(ratio * width));
                    std::memcpy(sc_state, sc_state + ratio * width, sizeof(float) * static_cast<size_t>(ratio * width));
                }
            }
            if ((pos + 1) % layout.page_tokens == 0) {  // snapshot the carry as of this page's end
                std::memcpy(layout.snapshot(*s.state, pos / layout.page_tokens) + carry_offset, kv_state,
                            sizeof(float) * static_cast<size_t>(2 * slots * width));
            }
            if (s.speculative && i + 1 < s.n_tokens)  // as of this position, for a cut after rejected drafts
                std::memcpy(s.state->step_carries.at(static_cast<size_t>(i + 1)).get() + carry_offset, kv_state,
                            sizeof(float) * static_cast<size_t>(2 * slots * width));
        }
    }
    return out;
}

// ---------------------------------------------------------------------------------------------------
// Online-softmax attention of one query head over a key list (blocks of 64, probabilities rounded to
// bf16 before P.V, sink added unscaled to the denominator), as the official sparse_attn kernel.
static void sparse_attend(const float* q, const std::vector<const float*>& keys, int D, float scale, float sink,
                          float* out) {
    constexpr int kBlock = 64;
    std::vector<double> acc(static_cast<size_t>(D), 0.0);
    std::vector<float> acc_f(static_cast<size_t>(D), 0.0f);
    float m = -1e30f, sum = 0.0f;
    const int n = static_cast<int>(keys.size());
    float s[kBlock], p[kBlock];
    for (int b0 = 0; b0 < n; b0 += kBlock) {
        const int b1 = std::min(n, b0 + kBlock);
        float bmax = -INFINITY;
        for (int j = b0; j < b1; ++j) {
            s[j - b0] = keys[j] ? dot_exact(q, keys[j], D) * scale : -INFINITY;
            bmax = std::max(bmax, s[j - b0]);
        }
        const float m_new = std::max(m, bmax);
        const float rescale = exp_cr(m - m_new);
        // The block's probabilities summed in double and rounded once: the official kernel sums them in its
        // threads' order, its reference port exactly; an fp32 sum in index order flipped bf16 outputs (one row of
        // 160 on the demo model, carried on through the window to every later row).
        double bsum = 0.0;
        for (int j = b0; j < b1; ++j) bsum += (p[j - b0] = exp_cr(s[j - b0] - m_new));
        sum = sum * rescale + static_cast<float>(bsum);
        for (int c = 0; c < D; ++c) {
            double pv = 0.0;
            for (int j = b0; j < b1; ++j)
                if (keys[j]) pv += static_cast<double>(round_bf16(p[j - b0])) * keys[j][c];
            acc_f[c] = acc_f[c] * rescale + static_cast<float>(pv);
        }
        m = m_new;
    }
    sum += exp_cr(sink - m);
    for (int c = 0; c < D; ++c) out[c] = round_bf16(acc_f[c] / sum);
}

// ---------------------------------------------------------------------------------------------------
Tensor CpuBackend::attention(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                             ForwardBatch& batch, StepScratch& scratch_base) {
    auto& scratch = static_cast<CpuScratch&>(scratch_base);
    const int T = batch.rows(), H = cfg_.n_heads, D = cfg_.head_dim, rd = cfg_.rope_head_dim, W = cfg_.window_size;
    const Rope& rope = rope_for(info);
    const LayerStateLayout& L = layout_.layers.at(static_cast<size_t>(info.layer));
    auto rows = row_infos(batch);

    std::vector<int64_t> positions(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) positions[static_cast<size_t>(t)] = rows[t].pos;
    Tensor qr = rms_norm(linear(x, w.wq_a), w.q_norm);
    Tensor q = project_queries(x, qr, w, rope, positions);

    // Sliding-window K=V, stored per token.
    Tensor kv = window_kv(x, w, rope, positions, L.window.format);
    for (int t = 0; t < T; ++t) {
        SeqState& st = *rows[t].seq->state;
        store_entry(L.window, kv.f32() + static_cast<int64_t>(t) * D,
                    layout_.entry<uint8_t>(st, L.window, rows[t].pos));
    }

    // Indexer keys at group position gpos: RoPE, the format's rotation, the keys' QDQ; stored.
    auto store_index_key = [&](float* k, const BatchSeq& s, int64_t group) {
        const int hd = L.index_k.format.dim;
        rope.apply(k + hd - rd, group * info.ratio);
        if (format_.index_rotation) hadamard_bf16(k, hd);
        qdq_entry(L.index_k.format, k);
        store_entry(L.index_k, k, layout_.entry<uint8_t>(*s.state, L.index_k, group));
    };

    // Compressed entries (and, for key owners, indexer keys from the latents).
    if (info.compresses) {
        auto emitted = run_compressor(cfg_, layout_, *w.compressor, L.carry_offset, x, batch, *this);
        for (auto& e : emitted) {
            SeqState& st = *rows[e.row].seq->state;
            const int64_t gpos = e.group * info.ratio;
            if (info.owns_index_k) {
                const IndexerWeight& iw = *w.indexer;
                Tensor lat = Tensor::view(DType::F32, {1, D}, e.latent.data());
                Tensor k = rms_norm(linear(lat, iw.wk), iw.k_norm);
                store_index_key(k.f32(), *rows[e.row].seq, e.group);
            }
            float* lat = e.latent.data();
            rope.apply(lat + D - rd, gpos);
            qdq_entry(L.comp.format, lat);
            store_entry(L.comp, lat, layout_.entry<uint8_t>(st, L.comp, e.group));
        }
    }

    // Which compressed entries each row attends to.
    std::vector<std::vector<int32_t>> comp_list(static_cast<size_t>(T));
    if (info.ratio > 0) {
        const int ratio = info.ratio;
        if (info.has_indexer) {
            const IndexerWeight& iw = *w.indexer;
            const int nh = iw.n_heads, hd = iw.head_dim;
            const StateSection& ks = layout_.layers.at(static_cast<size_t>(info.index_k_source)).index_k;
            if (info.index_compressor) {  // the indexer's own compressor turns tokens into keys
                auto emitted = run_compressor(cfg_, layout_, *iw.compressor, L.index_carry_offset, x, batch, *this);
                for (auto& e : emitted) store_index_key(e.latent.data(), *rows[e.row].seq, e.group);
            }
            Tensor iq = linear(qr, iw.wq_b);
            Tensor wts = linear(x, iw.weights_proj);
            const float wscale = static_cast<float>(std::pow(hd, -0.5) * std::pow(nh, -0.5));
            for (int t = 0; t < T; ++t) {
                for (int h = 0; h < nh; ++h) {
                    float* qh = iq.f32() + (static_cast<int64_t>(t) * nh + h) * hd;
                    rope.apply(qh + hd - rd, rows[t].pos);
                    if (format_.index_rotation) hadamard_bf16(qh, hd);
                    qdq_entry(ks.format, qh);
                }
                for (int h = 0; h < nh; ++h) wts.f32()[t * nh + h] = round_bf16(wts.f32()[t * nh + h] * wscale);
            }
            // Each sequence's keys, decoded once for all its rows.
            std::vector<std::vector<float>> seq_keys(batch.seqs.size());
            parallel_for(static_cast<int64_t>(batch.seqs.size()), [&](int64_t s0, int64_t s1) {
                for (int64_t si = s0; si < s1; ++si) {
                    const BatchSeq& s = batch.seqs[static_cast<size_t>(si)];
                    const int64_t width = (s.start_pos + s.n_tokens) / ratio;
                    if (s.n_tokens <= 0 || width == 0) continue;
                    auto& dk = seq_keys[static_cast<size_t>(si)];
                    dk.resize(static_cast<size_t>(width * hd));
                    for (int64_t j = 0; j < width; ++j)
                        decode_entry(ks.format, layout_.entry<uint8_t>(*s.state, ks, j),
                                     dk.data() + j * hd);
                }
            });
            parallel_for(T, [&](int64_t t0, int64_t t1) {
                for (int64_t t = t0; t < t1; ++t) {
                    const BatchSeq& s = *rows[t].seq;
                    const int64_t pos = rows[t].pos, end = s.start_pos + s.n_tokens;
                    const int64_t width = end / ratio, visible = (pos + 1) / ratio;
                    auto& list = comp_list[static_cast<size_t>(t)];
                    if (width == 0) continue;
                    std::vector<float> score(static_cast<size_t>(width));
                    for (int64_t j = 0; j < width; ++j) {
                        if (j >= visible) {
                            score[j] = -INFINITY;
                            continue;
                        }
                        const float* k = seq_keys[static_cast<size_t>(rows[t].seq - batch.seqs.data())].data() + j * hd;
                        float acc = 0.0f;
                        for (int h = 0; h < nh; ++h) {
                            float d = round_bf16(dot_exact(iq.f32() + (t * nh + h) * hd, k, hd));
                            acc += round_bf16(std::max(d, 0.0f) * wts.f32()[t * nh + h]);
                        }
                        score[j] = round_bf16(acc);
                    }
                    if (info.candidate_source) {  // level 1: best blocks of the candidate source
                        const int bs = cfg_.candidate_block_size;
                        const int64_t nb = (width + bs - 1) / bs, last = visible >= 1 ? (visible - 1) / bs : -1;
                        std::vector<float> bscore(static_cast<size_t>(nb), -INFINITY);
                        for (int64_t j = 0; j < width; ++j) bscore[j / bs] = std::max(bscore[j / bs], score[j]);
                        if (last >= 0 && last < nb) bscore[last] = INFINITY;
                        auto top = topk_desc(bscore.data(), static_cast<int>(nb), cfg_.candidate_topk_blocks);
                        auto& mask = scratch.candidates[static_cast<size_t>(t)];
                        mask.assign(static_cast<size_t>(width), 0);
                        for (int32_t b : top)
                            if (bscore[b] > -INFINITY)
                                for (int64_t j = b * bs; j < std::min<int64_t>(width, (b + 1) * bs); ++j) mask[j] = 1;
                    } else if (info.uses_candidates) {  // level 2: only inside the candidate blocks
                        const auto& mask = scratch.candidates[static_cast<size_t>(t)];
                        for (int64_t j = 0; j < width; ++j)
                            if (j >= static_cast<int64_t>(mask.size()) || !mask[j]) score[j] = -INFINITY;
                    }
                    const int k = static_cast<int>(std::min<int64_t>(iw.topk, width));
                    auto sel = topk_desc(score.data(), static_cast<int>(width), k);
                    if (format_.sorted_selection) std::sort(sel.begin(), sel.end());
                    for (int32_t j : sel) list.push_back(j < visible ? j : -1);
                }
            });
            scratch.topk = comp_list;  // for the layers after it that reuse it
        } else if (info.reuses_selection) {
            comp_list = scratch.topk;
        } else {  // every visible entry
            for (int t = 0; t < T; ++t) {
                const BatchSeq& s = *rows[t].seq;
                const int64_t visible = (rows[t].pos + 1) / ratio;
                const int64_t width = is_prefill(s) ? (s.start_pos + s.n_tokens) / ratio : visible;
                for (int64_t j = 0; j < width; ++j) comp_list[t].push_back(j < visible ? static_cast<int32_t>(j) : -1);
            }
        }
    }

    // Sparse attention with sink, then the inverse rotation of the output.
    const LayerStateLayout& CL =
        layout_.layers.at(static_cast<size_t>(info.comp_source >= 0 ? info.comp_source : info.layer));
    Tensor o = Tensor::zeros(DType::F32, {T, H, D});
    const float scale = static_cast<float>(std::pow(D, -0.5));
    parallel_for(T, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            SeqState& st = *rows[t].seq->state;
            std::vector<std::vector<float>> vals;  // the row's keys, decoded
            std::vector<const float*> keys;
            auto add = [&](const StateSection& sec, int64_t idx) {
                if (idx < 0) {
                    keys.push_back(nullptr);
                    return;
                }
                vals.push_back(load_entry(sec, layout_.entry<uint8_t>(st, sec, idx)));
                keys.push_back(vals.back().data());
            };
            for (int64_t p : window_list(*rows[t].seq, rows[t].pos, W, format_.ring_before_full)) add(L.window, p);
            for (int32_t j : comp_list[static_cast<size_t>(t)]) add(CL.comp, j);
            for (int h = 0; h < H; ++h)
                sparse_attend(q.f32() + (t * H + h) * D, keys, D, scale, w.attn_sink.data<float>()[h],
                              o.f32() + (t * H + h) * D);
        }
    });
    return project_output(o, w, rope, positions);
}

Tensor CpuBackend::project_queries(const Tensor& x, const Tensor& qr, const AttentionWeight& w, const Rope& rope,
                                   const std::vector<int64_t>& pos) {
    const int H = cfg_.n_heads, D = cfg_.head_dim, rd = cfg_.rope_head_dim;
    Tensor q = linear(qr, w.wq_b);
    parallel_for(static_cast<int64_t>(pos.size()), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
            for (int h = 0; h < H; ++h) {
                float* qh = q.f32() + (t * H + h) * D;
                if (format_.query_head_norm) {  // unweighted, in bf16 arithmetic
                    float ss = 0.0f;
                    for (int c = 0; c < D; ++c) ss += round_bf16(qh[c] * qh[c]);
                    float mean = round_bf16(ss / static_cast<float>(D));
                    float r = round_bf16(1.0f / std::sqrt(round_bf16(mean + eps())));
                    for (int c = 0; c < D; ++c) qh[c] = round_bf16(qh[c] * r);
                }
                rope.apply(qh + D - rd, pos[static_cast<size_t>(t)]);
            }
    });
    return q;
}

Tensor CpuBackend::window_kv(const Tensor& x, const AttentionWeight& w, const Rope& rope,
                             const std::vector<int64_t>& pos, const EntryFormat& format) {
    const int D = cfg_.head_dim, rd = cfg_.rope_head_dim;
    Tensor kv = rms_norm(linear(x, w.wkv), w.kv_norm);
    for (size_t t = 0; t < pos.size(); ++t) {
        float* k = kv.f32() + static_cast<int64_t>(t) * D;
        rope.apply(k + D - rd, pos[t]);
        qdq_entry(format, k);
    }
    return kv;
}

Tensor CpuBackend::project_output(Tensor& o, const AttentionWeight& w, const Rope& rope,
                                  const std::vector<int64_t>& pos) {
    const int T = static_cast<int>(pos.size()), H = cfg_.n_heads, D = cfg_.head_dim, rd = cfg_.rope_head_dim;
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h) rope.apply(o.f32() + (static_cast<int64_t>(t) * H + h) * D + D - rd, pos[t], true);
    const int G = cfg_.o_groups, R = cfg_.o_lora_rank, GD = H / G * D;
    Tensor oa = Tensor::zeros(DType::F32, {T, G * R});
    parallel_for(static_cast<int64_t>(G) * R, [&](int64_t n0, int64_t n1) {
        std::vector<float> wr(static_cast<size_t>(GD));
        for (int64_t n = n0; n < n1; ++n) {
            const int64_t g = n / R;
            for (int k = 0; k < GD; ++k) wr[k] = bf16_to_f32(w.wo_a.w.data<uint16_t>()[n * GD + k]);
            for (int t = 0; t < T; ++t)
                oa.f32()[static_cast<int64_t>(t) * G * R + n] =
                    round_bf16(dot_exact(o.f32() + (static_cast<int64_t>(t) * G + g) * GD, wr.data(), GD));
        }
    });
    return linear(oa, w.wo_b);
}

// ---------------------------------------------------------------------------------------------------
// DSpark.

void CpuBackend::store_window_kv(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                                 ForwardBatch& batch) {
    const int D = cfg_.head_dim;
    auto rows = row_infos(batch);
    std::vector<int64_t> positions;
    for (auto& r : rows) positions.push_back(r.pos);
    const LayerStateLayout& L = layout_.layers.at(static_cast<size_t>(info.layer));
    Tensor kv = window_kv(x, w, rope_for(info), positions, L.window.format);
    for (size_t t = 0; t < rows.size(); ++t) {
        SeqState& st = *rows[t].seq->state;
        store_entry(L.window, kv.f32() + static_cast<int64_t>(t) * D,
                    layout_.entry<uint8_t>(st, L.window, rows[t].pos));
    }
}

Tensor CpuBackend::draft_attention(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                                   const std::vector<const SeqState*>& states, const std::vector<int64_t>& pos,
                                   bool chain) {
    const int N = static_cast<int>(states.size()), T = static_cast<int>(x.dim(0)), B = T / N;
    const int H = cfg_.n_heads, D = cfg_.head_dim, W = cfg_.window_size;
    PEREGRINE_CHECK(N > 0 && B * N == T && pos.size() == states.size(), "draft attention: blocks of equal length");
    const Rope& rope = rope_for(info);
    const DraftRows rows = draft_rows(pos, B, chain);
    const int first = rows.first, R = B - first;
    const Tensor xq = chain ? gather_rows(x, rows.q_rows) : x;
    Tensor qr = rms_norm(linear(xq, w.wq_a), w.q_norm);
    Tensor q = project_queries(xq, qr, w, rope, rows.q_positions);
    const LayerStateLayout& L = layout_.layers.at(static_cast<size_t>(info.layer));
    Tensor kv = window_kv(x, w, rope, rows.positions, L.window.format);
    // The block's K=V as stored window entries would give it back (the RoPE dims rounded to bf16).
    std::vector<std::vector<float>> block(static_cast<size_t>(T));
    std::vector<uint8_t> entry(L.window.entry_bytes);
    for (int r = 0; r < T; ++r) {
        store_entry(L.window, kv.f32() + static_cast<int64_t>(r) * D, entry.data());
        block[static_cast<size_t>(r)] = load_entry(L.window, entry.data());
    }
    Tensor o = Tensor::zeros(DType::F32, {N * R, H, D});
    const float scale = static_cast<float>(std::pow(D, -0.5));
    for (int j = 0; j < N; ++j) {
        const SeqState& state = *states[static_cast<size_t>(j)];
        const int64_t p0 = pos[static_cast<size_t>(j)];
        for (int i = first; i < B; ++i) {
            // Keys: the stored window (draft_window_keys), then the block's rows.
            std::vector<std::vector<float>> vals;
            std::vector<const float*> keys;
            for (int64_t p : draft_window_keys(p0, p0 + 1 + i, W, state.window_floor, chain))
                vals.push_back(load_entry(L.window, layout_.entry<uint8_t>(state, L.window, p)));
            for (auto& v : vals) keys.push_back(v.data());
            for (int k = 0; k < (chain ? i + 1 : B); ++k) keys.push_back(block[static_cast<size_t>(j * B + k)].data());
            for (int h = 0; h < H; ++h) {
                const int64_t r = (static_cast<int64_t>(j * R + i - first) * H + h) * D;
                sparse_attend(q.f32() + r, keys, D, scale, w.attn_sink.data<float>()[h], o.f32() + r);
            }
        }
    }
    return project_output(o, w, rope, rows.q_positions);
}

void CpuBackend::add_into(Tensor& y, const Tensor& x) {
    PEREGRINE_CHECK(y.numel() == x.numel(), "add_into: {} and {} values", y.numel(), x.numel());
    float* a = y.f32();
    const float* b = x.f32();
    for (int64_t i = 0; i < y.numel(); ++i) a[i] += b[i];
}

}  // namespace peregrine::cpu
