// DeepSeek-V4's MTP layer as a drafter. Its input at a position is the backbone's final hidden state there beside
// the next token's embedding, so its entry for hidden state t exists once token t+1 is fed: it is kept at position
// t+1, in the page of the token it embeds (pages shared by a prefix hold only entries their own tokens decide), and
// attends there, one position on (RoPE is relative: the same scores). The hidden state of a sequence's last position
// waits in its carry (StateLayout::hidden_offset) for the token after it, and so follows page snapshots and cuts.
//
// Drafting chains the layer: draft i+1 comes from the layer's output hidden state after draft i, as SGLang's EAGLE
// steps reuse V4's one MTP layer.
#include "model/model.h"
#include "util/error.h"

namespace peregrine {

namespace {

// The layer's input [T, hc, dim]: bf16(e_proj(enorm(embed(ids))) + h_proj(hnorm(hidden))) on every copy, as an
// expansion with unit post mix and identity comb (the copies' sum, rounded once).
Tensor mtp_input(Backend& be, const ModelWeights& w, const std::vector<int32_t>& ids, const Tensor& hidden, int hc) {
    const int64_t T = static_cast<int64_t>(ids.size()), D = hidden.dim(-1);
    const MtpWeight& m = *w.mtp;
    Tensor e = be.linear(be.rms_norm(be.hc_mean(be.embed(w.embed, ids)), m.enorm), m.e_proj);
    Tensor h = be.linear(be.rms_norm(hidden, m.hnorm), m.h_proj).reshaped({T, hc, D});
    Tensor post = Tensor::zeros(DType::F32, {T, hc}), comb = Tensor::zeros(DType::F32, {T, hc, hc});
    for (int64_t t = 0; t < T; ++t)
        for (int i = 0; i < hc; ++i) {
            post.f32()[t * hc + i] = 1.0f;
            comb.f32()[(t * hc + i) * hc + i] = 1.0f;
        }
    HcMix unit;
    unit.post = be.from_host_copy(post);
    unit.comb = be.from_host_copy(comb);
    return be.hc_expand(e, h, unit);
}

}  // namespace

AttentionLayerInfo Model::mtp_info() const {
    AttentionLayerInfo a;
    a.layer = cfg_.n_layers;
    a.rope_theta = cfg_.rope_theta;  // window-only: base theta, no YaRN
    return a;
}

void Model::feed_mtp(ForwardBatch& batch, const Tensor& h) {
    Backend& be = *backend_;
    StateMemory& mem = be.state_memory();
    const size_t row_bytes = layout_.hidden_bytes;
    const int T = batch.rows(), hc = cfg_.hc_mult;
    // Row r's hidden state before its token: the row before, or for a sequence's first row the one in its carry.
    std::vector<int> before(static_cast<size_t>(T));
    for (const BatchSeq& s : batch.seqs)
        for (int i = 0; i < s.n_tokens; ++i) before[static_cast<size_t>(s.row0 + i)] = s.row0 + std::max(i - 1, 0);
    Tensor prev = be.gather_rows(h, before);
    auto row = [&](const Tensor& t, int r) { return reinterpret_cast<uint8_t*>(t.f32()) + r * row_bytes; };
    for (const BatchSeq& s : batch.seqs)
        mem.copy(row(prev, s.row0), s.state->carry.get() + layout_.hidden_offset, row_bytes);
    Tensor x = mtp_input(be, w_, batch.token_ids, prev, hc);
    const BlockWeight& b = w_.mtp->block;
    HcMix am = be.hc_mixes(x, b.hc_attn);
    be.store_window_kv(be.collapse_norm(x, am.pre, b.attn_norm), b.attn, mtp_info(), batch);
    // The last position's hidden state waits in the carry; so does each page's last in the page's snapshot, and in
    // a speculative step each position's in the carry as of it (the first and last are copies of the carry).
    for (const BatchSeq& s : batch.seqs) {
        for (int i = 0; i < s.n_tokens; ++i) {
            const int64_t pos = s.start_pos + i;
            if ((pos + 1) % layout_.page_tokens == 0)
                mem.copy(layout_.snapshot(*s.state, pos / layout_.page_tokens) + layout_.hidden_offset,
                         row(h, s.row0 + i), row_bytes);
            if (s.speculative && i + 1 < s.n_tokens)
                mem.copy(s.state->step_carries[static_cast<size_t>(i + 1)].get() + layout_.hidden_offset,
                         row(h, s.row0 + i), row_bytes);
        }
        mem.copy(s.state->carry.get() + layout_.hidden_offset, row(h, s.row0 + s.n_tokens - 1), row_bytes);
    }
}

std::vector<DraftResult> Model::draft_mtp(const std::vector<const SeqState*>& seqs, const std::vector<int32_t>& anchors,
                                          const DraftChooser& choose, int max_drafts) {
    Backend& be = *backend_;
    const MtpWeight& m = *w_.mtp;
    const int N = static_cast<int>(seqs.size()), vocab = cfg_.vocab_size, hc = cfg_.hc_mult;
    std::vector<int64_t> pos;
    Tensor hidden = be.from_host_copy(Tensor::zeros(DType::F32, {N, hc, cfg_.dim}));
    auto row = [&](const Tensor& t, int r) { return reinterpret_cast<uint8_t*>(t.f32()) + r * layout_.hidden_bytes; };
    for (int j = 0; j < N; ++j) {
        const SeqState& s = *seqs[static_cast<size_t>(j)];
        PEREGRINE_CHECK(s.n_cached > 0, "draft needs a fed sequence");
        pos.push_back(s.n_cached - 1);
        be.state_memory().copy(row(hidden, j), s.carry.get() + layout_.hidden_offset, layout_.hidden_bytes);
    }
    std::vector<DraftResult> out(static_cast<size_t>(N));
    std::vector<Tensor> attn_inputs;              // the chain's attention inputs so far: row i's [N, dim] at i
    std::vector<bool> ended(static_cast<size_t>(N), false);
    for (int j = 0; j < N; ++j) out[static_cast<size_t>(j)].ids.push_back(anchors[static_cast<size_t>(j)]);
    std::vector<int32_t> last(anchors);  // each chain's newest token (row i's)
    const AttentionLayerInfo info = mtp_info();
    for (int i = 0; i < max_drafts; ++i) {
        // Row i of each chain through the layer: its attention also reads the chain's earlier rows (their inputs
        // kept, every other op of the layer is row by row), so the earlier rows are not computed again.
        Tensor x = mtp_input(be, w_, last, hidden, hc);
        const int B = i + 1;
        auto attend = [&](const Tensor& a) {
            attn_inputs.push_back(a);
            Tensor all = B == 1 ? a : be.concat_cols(attn_inputs);  // [N, B * dim]: row j = sequence j's chain
            return be.draft_attention(all.reshaped({int64_t{N} * B, cfg_.dim}), m.block.attn, info, seqs, pos, true);
        };
        Tensor pre;  // V4's mHC: each sublayer collapses with its own mix
        decoder_layer_ops(be, m.block, false, {attend, [&](const Tensor& a) { return be.moe(a, m.block.ffn, last); }},
                          x, pre);
        hidden = x;
        Tensor logits = be.logits(be.rms_norm(be.hc_head(hidden, m.hc_head), m.norm), w_.head, false);
        const std::vector<int32_t> chosen = choose_drafts(i, logits, choose, out);
        bool any = false;
        for (int j = 0; j < N; ++j) {
            int32_t id = chosen[static_cast<size_t>(j)];
            if (ended[static_cast<size_t>(j)] || id < 0) {
                ended[static_cast<size_t>(j)] = true;
                id = last[static_cast<size_t>(j)];  // the chain runs on for the others; this one's rows are unused
            } else {
                PEREGRINE_CHECK(id < vocab, "draft token {} out of range", id);
                out[static_cast<size_t>(j)].ids.push_back(id);
                any = true;
            }
            last[static_cast<size_t>(j)] = id;
        }
        if (!any) break;
    }
    return out;
}

}  // namespace peregrine
