// DeepSeek-V4.1's DSpark head: a block of draft tokens after a sequence's last fed position, from stages that attend
// over their own window (fed from the backbone's hidden states in Model::forward) and the block itself, each draft
// token's logits biased by a Markov term of the token before it, with a confidence per position.
#include "model/model.h"
#include "ops/sampling.h"
#include "util/error.h"

namespace peregrine {

namespace {

// The Markov bias row for token `id`: markov_head(markov_embed[id]) in fp32 on the bf16 head rows, host [vocab].
Tensor markov_bias(Backend& be, const DSparkWeight& w, int32_t id) {
    const int64_t V = w.markov_head.dim(0), R = w.markov_head.dim(1);
    PEREGRINE_CHECK(id >= 0 && id < w.markov_embed.dim(0), "markov bias: token id {} out of range", id);
    Tensor e = Tensor::zeros(DType::F32, {1, R});
    for (int64_t k = 0; k < R; ++k) e.f32()[k] = bf16_to_f32(w.markov_embed.data<uint16_t>()[id * R + k]);
    LinearWeight head;
    head.kind = LinearWeight::Kind::F32;
    head.out = static_cast<int>(V);
    head.in = static_cast<int>(R);
    head.w = w.markov_head;
    return be.to_host_copy(be.linear(be.from_host_copy(e), head)).reshaped({V});
}

// Raw confidence logits [B] (host) of the collapsed block rows x [B, dim] beside the Markov embeddings of `ids`.
Tensor confidence(Backend& be, const DSparkWeight& w, const Tensor& x, const std::vector<int32_t>& ids) {
    const int64_t B = x.dim(0), R = w.markov_embed.dim(1);
    Tensor m = Tensor::zeros(DType::F32, {B, R});
    for (int64_t i = 0; i < B; ++i)
        for (int64_t k = 0; k < R; ++k)
            m.f32()[i * R + k] = bf16_to_f32(w.markov_embed.data<uint16_t>()[ids.at(static_cast<size_t>(i)) * R + k]);
    return be.to_host_copy(be.linear(be.concat_cols({x, be.from_host_copy(m)}), w.confidence)).reshaped({B});
}

}  // namespace

AttentionLayerInfo Model::stage_info(int stage) const {
    AttentionLayerInfo a;
    a.layer = cfg_.n_layers + stage;
    a.rope_theta = cfg_.rope_theta;  // window-only: base theta, no YaRN
    return a;
}

DraftResult Model::draft(const SeqState& s, int32_t anchor, const DraftChooser& choose) {
    PEREGRINE_CHECK(w_.dspark.has_value(), "this model has no DSpark head");
    PEREGRINE_CHECK(s.n_cached > 0, "draft needs a fed sequence");
    const DSparkWeight& d = *w_.dspark;
    Backend& be = *backend_;
    const int B = cfg_.dspark_block_size, vocab = cfg_.vocab_size;
    const int64_t pos = s.n_cached - 1;
    std::vector<int32_t> ids(static_cast<size_t>(B), cfg_.dspark_noise_token_id);
    ids[0] = anchor;
    Tensor h = be.embed(w_.embed, ids);
    Tensor pre = be.first_stream_mix(B);
    for (int st = 0; st < cfg_.n_mtp_layers; ++st) {  // the pre_mix chain runs on across the stages
        const BlockWeight& b = d.stages[static_cast<size_t>(st)];
        decoder_layer_ops(be, b, format_.single_pass_mhc,
                          {[&](const Tensor& x) { return be.dspark_attention(x, b.attn, stage_info(st), s, pos); },
                           [&](const Tensor& x) { return be.moe(x, b.ffn, ids); }},
                          h, pre);
    }
    Tensor x = be.hc_collapse(h, pre);
    Tensor logits = be.logits(be.rms_norm(x, d.norm), w_.head);
    DraftResult r;
    r.ids.push_back(anchor);
    r.logits.resize(static_cast<size_t>(B) * vocab);
    for (int i = 0; i < B; ++i) {  // each draft token biases the next position's logits
        Tensor bias = markov_bias(be, d, r.ids.back());
        float* row = logits.f32() + static_cast<int64_t>(i) * vocab;
        for (int v = 0; v < vocab; ++v) row[v] += bias.f32()[v];
        std::copy(row, row + vocab, r.logits.begin() + static_cast<int64_t>(i) * vocab);
        const int32_t id = choose ? choose(i, row) : argmax(row, vocab);
        if (id < 0) break;
        PEREGRINE_CHECK(id < vocab, "draft token {} out of range", id);
        r.ids.push_back(id);
    }
    std::vector<int32_t> prev(r.ids.begin(), r.ids.end());  // the token before each position (past an early end:
    prev.resize(static_cast<size_t>(B), r.ids.back());         // the last one, its confidence is not used)
    Tensor conf = confidence(be, d, x, prev);
    r.confidence.assign(conf.f32(), conf.f32() + B);
    return r;
}

}  // namespace peregrine
