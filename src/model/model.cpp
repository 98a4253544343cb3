#include "model/model.h"
#include "model/model_weights.h"
#include "model/variant.h"
#include "util/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace peregrine {

std::unique_ptr<Model> Model::load(const std::string& dir, const ModelOptions& opts) {
    std::unique_ptr<Model> m(new Model());
    m->dir_ = dir;
    m->cfg_ = load_model_config(dir);
    m->st_ = SafeTensors::open_dir(dir);
    m->w_ = load_model_weights(m->cfg_, m->st_);
    if (!m->cfg_.engram_layer_ids.empty()) m->engram_ = load_engram_tables(m->cfg_, dir);
    m->set_up(opts);
    return m;
}

void Model::set_up(const ModelOptions& opts) {
    const ModelVariant& v = model_variant(cfg_);
    format_ = v.format(cfg_);
    attn_info_ = v.layer_roles(cfg_);
    layout_ = make_state_layout(v.state_spec(cfg_), opts.page_tokens);
    if (opts.device == "cpu") {
        backend_ = make_cpu_backend(cfg_, format_, layout_);
    } else if (opts.device == "cuda") {
#ifdef PEREGRINE_HAVE_CUDA
        backend_ = make_cuda_backend(cfg_, format_, layout_, opts.engram_placement, opts.gpu);
#else
        fail("this build has no CUDA backend (nvcc was not found at configure time); use --device cpu");
#endif
    } else {
        fail("unknown device '{}' (cpu or cuda)", opts.device);
    }
}

Tensor Model::forward(ForwardBatch& batch, const std::vector<int>& logit_rows, bool logits_to_host) {
    const int T = batch.rows();
    Backend& be = *backend_;
    // Deferred ids (the previous step's samples, not yet on the host): backends that cannot take them have them.
    bool deferred = false;
    for (int32_t& id : batch.token_ids)
        if (id < 0) {
            if (be.sampler().takes_deferred_ids()) deferred = true;
            else id = be.sampler().started_id(DeviceSampler::deferred_row(id));
        }
    PEREGRINE_CHECK(batch.mode != BatchMode::decode || batch_mode_of(batch) == BatchMode::decode,
                    "a decode batch feeds one token per sequence, row i for sequence i");
    for (auto& s : batch.seqs) {
        PEREGRINE_CHECK(s.state && s.state->n_cached == s.start_pos,
                        "sequence state holds {} tokens, step starts at {}", s.state ? s.state->n_cached : -1,
                        s.start_pos);
        PEREGRINE_CHECK(static_cast<int64_t>(s.state->pages.size()) >= layout_.pages_for(s.start_pos + s.n_tokens),
                        "sequence needs {} pages, has {}", layout_.pages_for(s.start_pos + s.n_tokens),
                        s.state->pages.size());
        s.state->tokens.resize(static_cast<size_t>(s.start_pos));
        for (int i = 0; i < s.n_tokens; ++i)
            s.state->tokens.push_back(batch.token_ids[static_cast<size_t>(s.row0 + i)]);
    }
    auto scratch = be.begin_step(batch);
    Tensor h = be.embed(w_.embed, batch.token_ids);

    // Engram rows of every row, per engram layer; with deferred ids the backend hashes each row's window of
    // token ids instead (only a row's own token may be deferred: the ones before it were sampled earlier).
    std::vector<std::vector<int64_t>> engram_rows_by_layer;
    std::vector<int32_t> engram_windows;
    if (engram_ && deferred) {
        const int n = engram_->max_ngram;
        engram_windows.assign(static_cast<size_t>(T) * n, Backend::kNoToken);
        for (auto& s : batch.seqs)
            for (int i = 0; i < s.n_tokens; ++i)
                for (int k = 0; k < n && s.start_pos + i - k >= 0; ++k) {
                    const int32_t id = s.state->tokens[static_cast<size_t>(s.start_pos + i - k)];
                    PEREGRINE_CHECK(k == 0 || id >= 0,
                                    "engram window of position {} holds a deferred id {} tokens back", s.start_pos + i,
                                    k);
                    engram_windows[static_cast<size_t>(s.row0 + i) * n + k] = id;
                }
    } else if (engram_) {
        const int nc = engram_->n_cols();
        for (size_t li = 0; li < cfg_.engram_layer_ids.size(); ++li) {
            std::vector<int64_t> rows(static_cast<size_t>(T) * nc);
            for (auto& s : batch.seqs)
                for (int i = 0; i < s.n_tokens; ++i)
                    engram_rows(*engram_, static_cast<int>(li), s.state->tokens, s.start_pos + i,
                                rows.data() + static_cast<size_t>(s.row0 + i) * nc);
            engram_rows_by_layer.push_back(std::move(rows));
        }
    }

    // V4.1's single-pass mHC: a sublayer collapses its input with the previous sublayer's `pre`.
    Tensor pre = be.first_stream_mix(T);
    std::vector<Tensor> main_hidden;
    for (int l = 0; l < cfg_.n_layers; ++l) {
        BlockWeight& b = w_.layers[static_cast<size_t>(l)];
        if (b.engram) {
            size_t li = static_cast<size_t>(std::find(cfg_.engram_layer_ids.begin(), cfg_.engram_layer_ids.end(), l) -
                                            cfg_.engram_layer_ids.begin());
            if (deferred) be.engram_hashed(h, *b.engram, engram_hash(*engram_, static_cast<int>(li)), engram_windows);
            else be.engram(h, *b.engram, engram_rows_by_layer[li]);
        }
        if (w_.dspark && std::find(cfg_.dspark_target_layer_ids.begin(), cfg_.dspark_target_layer_ids.end(), l) !=
                             cfg_.dspark_target_layer_ids.end())
            main_hidden.push_back(be.hc_mean(h));  // DSpark reads the target layers' attention inputs
        const AttentionLayerInfo& info = attn_info_[static_cast<size_t>(l)];
        if (ep_)
            decoder_layer_ops(be, b, format_.single_pass_mhc,
                              {[&](const Tensor& x) { return be.attention(x, b.attn, info, batch, *scratch); },
                               [&](const Tensor& x) { return ep_->moe(be, x, b.ffn, batch.token_ids); }},
                              h, pre);
        else
            be.decoder_layer(b, info, batch, *scratch, h, pre);
    }
    if (w_.dspark) {  // feed the DSpark stage windows from the backbone's hidden states
        const DSparkWeight& d = *w_.dspark;
        Tensor main_x = be.rms_norm(be.linear(be.concat_cols(main_hidden), d.main_proj), d.main_norm);
        for (int st = 0; st < cfg_.n_mtp_layers; ++st)
            be.store_window_kv(main_x, d.stages[static_cast<size_t>(st)].attn, stage_info(st), batch);
    }
    for (auto& s : batch.seqs) s.state->n_cached = s.start_pos + s.n_tokens;

    // Final collapse of the requested rows, norm and head.
    if (logit_rows.empty()) return Tensor::zeros(DType::F32, {0, cfg_.vocab_size});
    for (int row : logit_rows) PEREGRINE_CHECK(row >= 0 && row < T, "logit row {} out of range", row);
    Tensor hs = be.gather_rows(h, logit_rows), ps = be.gather_rows(pre, logit_rows);
    // Single-pass mHC collapses with the last sublayer's pre mix; a model with a head mix collapses with it.
    Tensor x = w_.hc_head ? be.rms_norm(be.hc_head(hs, *w_.hc_head), w_.norm) : be.collapse_norm(hs, ps, w_.norm);
    return be.logits(x, w_.head, logits_to_host);
}

void Model::set_expert_parallel(std::shared_ptr<ExpertParallel> ep) {
    PEREGRINE_CHECK(!ep_, "expert parallelism is already set");
    for (auto& b : w_.layers) ep->keep_local(b.ffn);
    ep_ = std::move(ep);
}

void Model::idle_step() {
    PEREGRINE_CHECK(ep_ != nullptr, "idle_step: no expert parallelism");
    Tensor none = backend_->from_host_copy(Tensor::zeros(DType::F32, {0, cfg_.dim}));
    for (auto& b : w_.layers) ep_->moe(*backend_, none, b.ffn, {});
}

}  // namespace peregrine
