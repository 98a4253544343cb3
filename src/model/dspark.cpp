// DeepSeek-V4.1's DSpark head: a block of draft tokens after a sequence's last fed position, from stages that attend
// over their own window (fed from the backbone's hidden states in Model::forward) and the block itself, each draft
// token's logits biased by a Markov term of the token before it, with a confidence per position.
#include "model/model.h"
#include "util/error.h"

namespace peregrine {

namespace {

// The Markov bias rows [n, vocab] for tokens `ids`: markov_head(markov_embed[id]) in fp32 on the bf16 head rows.
Tensor markov_bias(Backend& be, const DSparkWeight& w, const std::vector<int32_t>& ids) {
    const int64_t V = w.markov_head.dim(0), R = w.markov_head.dim(1), n = static_cast<int64_t>(ids.size());
    Tensor e = Tensor::zeros(DType::F32, {n, R});
    for (int64_t j = 0; j < n; ++j) {
        const int32_t id = ids[static_cast<size_t>(j)];
        PEREGRINE_CHECK(id >= 0 && id < w.markov_embed.dim(0), "markov bias: token id {} out of range", id);
        for (int64_t k = 0; k < R; ++k) e.f32()[j * R + k] = bf16_to_f32(w.markov_embed.data<uint16_t>()[id * R + k]);
    }
    LinearWeight head;
    head.kind = LinearWeight::Kind::F32;
    head.out = static_cast<int>(V);
    head.in = static_cast<int>(R);
    head.w = w.markov_head;
    return be.linear(be.from_host_copy(e), head);
}

// Raw confidence logits [rows] (host) of the collapsed block rows x [rows, dim] beside the Markov embeddings of
// `ids` (the token before each row).
Tensor confidence(Backend& be, const DSparkWeight& w, const Tensor& x, const std::vector<int32_t>& ids) {
    const int64_t n = x.dim(0), R = w.markov_embed.dim(1);
    Tensor m = Tensor::zeros(DType::F32, {n, R});
    for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < R; ++k)
            m.f32()[i * R + k] = bf16_to_f32(w.markov_embed.data<uint16_t>()[ids.at(static_cast<size_t>(i)) * R + k]);
    return be.to_host_copy(be.linear(be.concat_cols({x, be.from_host_copy(m)}), w.confidence)).reshaped({n});
}

}  // namespace

AttentionLayerInfo Model::stage_info(int stage) const {
    AttentionLayerInfo a;
    a.layer = cfg_.n_layers + stage;
    a.rope_theta = cfg_.rope_theta;  // window-only: base theta, no YaRN
    return a;
}

std::vector<DraftResult> Model::draft_dspark(const std::vector<const SeqState*>& seqs,
                                             const std::vector<int32_t>& anchors, const DraftChooser& choose) {
    const DSparkWeight& d = *w_.dspark;
    Backend& be = *backend_;
    const int B = cfg_.dspark_block_size, vocab = cfg_.vocab_size, N = static_cast<int>(seqs.size());
    // Sequence j's block: rows [j * B, (j + 1) * B), the anchor then noise tokens, after its last fed position.
    std::vector<int32_t> ids;
    std::vector<int64_t> pos;
    for (int j = 0; j < N; ++j) {
        PEREGRINE_CHECK(seqs[static_cast<size_t>(j)]->n_cached > 0, "draft needs a fed sequence");
        pos.push_back(seqs[static_cast<size_t>(j)]->n_cached - 1);
        ids.push_back(anchors[static_cast<size_t>(j)]);
        ids.insert(ids.end(), static_cast<size_t>(B - 1), cfg_.dspark_noise_token_id);
    }
    Tensor h = be.embed(w_.embed, ids);
    Tensor pre = be.first_stream_mix(N * B);
    for (int st = 0; st < cfg_.n_mtp_layers; ++st) {  // the pre_mix chain runs on across the stages
        const BlockWeight& b = d.stages[static_cast<size_t>(st)];
        const AttentionLayerInfo info = stage_info(st);
        decoder_layer_ops(be, b, format_.single_pass_mhc,
                          {[&](const Tensor& x) { return be.draft_attention(x, b.attn, info, seqs, pos, false); },
                           [&](const Tensor& x) { return be.moe(x, b.ffn, ids); }},
                          h, pre);
    }
    Tensor x = be.hc_collapse(h, pre);
    Tensor xn = be.rms_norm(x, d.norm);
    std::vector<DraftResult> out(static_cast<size_t>(N));
    std::vector<int32_t> last(anchors);  // each sequence's token before the next position
    std::vector<bool> ended(static_cast<size_t>(N), false);
    for (int j = 0; j < N; ++j) out[static_cast<size_t>(j)].ids.push_back(anchors[static_cast<size_t>(j)]);
    for (int i = 0; i < B; ++i) {  // each draft token biases the next position's logits
        std::vector<int> rows;
        for (int j = 0; j < N; ++j) rows.push_back(j * B + i);
        Tensor logits = be.logits(be.gather_rows(xn, rows), w_.head, false);
        be.add_into(logits, markov_bias(be, d, last));
        const std::vector<int32_t> chosen = choose_drafts(i, logits, choose, out);
        for (int j = 0; j < N; ++j) {
            const int32_t id = chosen[static_cast<size_t>(j)];
            if (ended[static_cast<size_t>(j)] || id < 0) {
                ended[static_cast<size_t>(j)] = true;
                continue;
            }
            PEREGRINE_CHECK(id < vocab, "draft token {} out of range", id);
            out[static_cast<size_t>(j)].ids.push_back(id);
            last[static_cast<size_t>(j)] = id;
        }
    }
    // The token before each position (past an early end: the last one, its confidence is not used).
    std::vector<int32_t> prev;
    for (const DraftResult& r : out)
        for (int i = 0; i < B; ++i) prev.push_back(r.ids[std::min(static_cast<size_t>(i), r.ids.size() - 1)]);
    Tensor conf = confidence(be, d, x, prev);
    for (int j = 0; j < N; ++j)
        out[static_cast<size_t>(j)].confidence.assign(conf.f32() + static_cast<int64_t>(j) * B,
                                                     conf.f32() + static_cast<int64_t>(j + 1) * B);
    return out;
}

}  // namespace peregrine
