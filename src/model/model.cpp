#include "model/model.h"
#include "model/model_weights.h"
#include "model/variant.h"
#include "ops/sampling.h"
#include "util/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace peregrine {

namespace {

// Decoder SWA bounded replay: the step's rows at positions from their sequence's replay_from, as a batch of their
// own whose window below replay_from is absent; `keep` gets their rows in `batch`. False: no row is left out and
// none sees a window position below its replay_from.
bool replay_batch(const ForwardBatch& batch, int W, ForwardBatch& out, std::vector<int>& keep) {
    bool cut = false;
    for (const BatchSeq& s : batch.seqs) cut |= s.replay_from > 0 && s.replay_from > s.start_pos - W + 1;
    if (!cut) return false;
    out.mode = batch.mode;
    for (const BatchSeq& s : batch.seqs) {
        const int skip = static_cast<int>(std::clamp<int64_t>(s.replay_from - s.start_pos, 0, s.n_tokens));
        if (skip == s.n_tokens) continue;
        BatchSeq r = s;
        r.start_pos = s.start_pos + skip;
        r.n_tokens = s.n_tokens - skip;
        r.row0 = out.rows();
        r.window_floor = std::max(s.window_floor, s.replay_from);
        out.seqs.push_back(r);
        for (int i = skip; i < s.n_tokens; ++i) {
            keep.push_back(s.row0 + i);
            out.token_ids.push_back(batch.token_ids[static_cast<size_t>(s.row0 + i)]);
        }
    }
    return true;
}

// Rows `keep` of a host array of T rows.
template <class V>
V gather_host_rows(const V& v, const std::vector<int>& keep, int T) {
    if (v.empty()) return v;
    const size_t n = v.size() / static_cast<size_t>(T);
    V out;
    out.reserve(keep.size() * n);
    for (int r : keep) {
        const auto first = v.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(r) * n);
        out.insert(out.end(), first, first + static_cast<ptrdiff_t>(n));
    }
    return out;
}

}  // namespace

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
    replay_layer_ = 0;
    for (const AttentionLayerInfo& a : attn_info_)
        if (a.compresses || a.owns_index_k || a.index_compressor || a.candidate_source) replay_layer_ = a.layer + 1;
    layout_ = make_state_layout(v.state_spec(cfg_), opts.page_tokens);
    batch_invariant_ = opts.batch_invariant;
    if (opts.device == "cpu") {
        backend_ = make_cpu_backend(cfg_, format_, layout_);
    } else if (opts.device == "cuda") {
#ifdef PEREGRINE_HAVE_CUDA
        backend_ = make_cuda_backend(cfg_, format_, layout_, opts.engram_placement, opts.gpu, opts.batch_invariant);
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
        s.window_floor = std::max(s.window_floor, s.state ? s.state->window_floor : 0);
        s.decode_keys = s.decode_keys || batch_invariant_;
        PEREGRINE_CHECK(s.state && s.state->n_cached == s.start_pos,
                        "sequence state holds {} tokens, step starts at {}", s.state ? s.state->n_cached : -1,
                        s.start_pos);
        PEREGRINE_CHECK(static_cast<int64_t>(s.state->pages.size()) >= layout_.pages_for(s.start_pos + s.n_tokens),
                        "sequence needs {} pages, has {}", layout_.pages_for(s.start_pos + s.n_tokens),
                        s.state->pages.size());
        s.state->tokens.resize(static_cast<size_t>(s.start_pos));
        for (int i = 0; i < s.n_tokens; ++i)
            s.state->tokens.push_back(batch.token_ids[static_cast<size_t>(s.row0 + i)]);
        s.state->step_carries_from = -1;
        if (s.speculative) {  // the carry before the step; every compressor writes its part after each token
            PEREGRINE_CHECK(static_cast<int>(s.state->step_carries.size()) > s.n_tokens && s.replay_from == 0,
                            "a speculative step needs a carry slot per position (and no decoder replay)");
            if (layout_.carry_bytes > 0)
                be.state_memory().copy(s.state->step_carries[0].get(), s.state->carry.get(), layout_.carry_bytes);
            s.state->step_carries_from = s.start_pos;
        }
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
    ForwardBatch replay;  // decoder SWA bounded replay: the rows the layers from replay_layer_ run over
    std::vector<int> rows = logit_rows;
    // Consecutive layers with nothing of the model's between them, which the backend runs as one (the CUDA backend
    // as one graph at decode), under the step they were gathered with.
    std::vector<DecoderLayerRef> run;
    ForwardBatch* run_step = &batch;
    auto flush = [&] {
        if (!run.empty()) be.decoder_layers(run, *run_step, *scratch, h, pre);
        run.clear();
    };
    for (int l = 0; l < cfg_.n_layers; ++l) {
        std::vector<int> keep;
        if (l == replay_layer_ && replay_batch(batch, cfg_.window_size, replay, keep)) {
            PEREGRINE_CHECK(!ep_, "decoder SWA bounded replay does not run with expert parallelism");
            flush();
            if (keep.empty()) {  // none of the step's rows reaches the later layers (nor DSpark's windows)
                PEREGRINE_CHECK(rows.empty(), "a logit row skips the layers after the last KV source");
                main_hidden.clear();
                break;
            }
            // A scratch of its own even when every row stays: the backend's page tables carry the window floors.
            scratch = be.narrow_step(*scratch, keep);
            if (static_cast<int>(keep.size()) < T) {
                std::vector<int> at(static_cast<size_t>(T), -1);
                for (size_t i = 0; i < keep.size(); ++i) at[static_cast<size_t>(keep[i])] = static_cast<int>(i);
                for (int& row : rows) {
                    PEREGRINE_CHECK(row >= 0 && row < T && at[static_cast<size_t>(row)] >= 0,
                                    "logit row {} skips the layers after the last KV source", row);
                    row = at[static_cast<size_t>(row)];
                }
                h = be.gather_rows(h, keep);
                pre = be.gather_rows(pre, keep);
                for (Tensor& m : main_hidden) m = be.gather_rows(m, keep);
                for (auto& r : engram_rows_by_layer) r = gather_host_rows(r, keep, T);
                engram_windows = gather_host_rows(engram_windows, keep, T);
            }
        }
        ForwardBatch& step = replay.seqs.empty() ? batch : replay;
        BlockWeight& b = w_.layers[static_cast<size_t>(l)];
        const bool dspark_target = w_.dspark && std::find(cfg_.dspark_target_layer_ids.begin(),
                                                          cfg_.dspark_target_layer_ids.end(),
                                                          l) != cfg_.dspark_target_layer_ids.end();
        if (b.engram || dspark_target) flush();
        if (b.engram) {
            size_t li = static_cast<size_t>(std::find(cfg_.engram_layer_ids.begin(), cfg_.engram_layer_ids.end(), l) -
                                            cfg_.engram_layer_ids.begin());
            if (deferred) be.engram_hashed(h, *b.engram, engram_hash(*engram_, static_cast<int>(li)), engram_windows);
            else be.engram(h, *b.engram, engram_rows_by_layer[li]);
        }
        if (dspark_target) main_hidden.push_back(be.hc_mean(h));  // DSpark reads the target layers' attention inputs
        const AttentionLayerInfo& info = attn_info_[static_cast<size_t>(l)];
        if (ep_)
            decoder_layer_ops(be, b, format_.single_pass_mhc,
                              {[&](const Tensor& x) { return be.attention(x, b.attn, info, step, *scratch); },
                               [&](const Tensor& x) { return ep_->moe(be, x, b.ffn, step.token_ids); }},
                              h, pre);
        else
            run_step = &step, run.push_back({&b, &info});
    }
    flush();
    if (w_.dspark && !main_hidden.empty()) {  // feed the DSpark stage windows from the backbone's hidden states
        const DSparkWeight& d = *w_.dspark;
        Tensor main_x = be.rms_norm(be.linear(be.concat_cols(main_hidden), d.main_proj), d.main_norm);
        for (int st = 0; st < cfg_.n_mtp_layers; ++st)
            be.store_window_kv(main_x, d.stages[static_cast<size_t>(st)].attn, stage_info(st),
                               replay.seqs.empty() ? batch : replay);
    }
    if (w_.mtp) {
        PEREGRINE_CHECK(replay.seqs.empty(), "the MTP layer reads every row's hidden state");
        feed_mtp(batch, h);
    }
    for (auto& s : batch.seqs) {
        s.state->n_cached = s.start_pos + s.n_tokens;
        if (s.speculative && layout_.carry_bytes > 0)  // the carry after the step's last token (BatchSeq::speculative)
            be.state_memory().copy(s.state->step_carries[static_cast<size_t>(s.n_tokens)].get(), s.state->carry.get(),
                                   layout_.carry_bytes);
    }

    // Final collapse of the requested rows, norm and head.
    if (rows.empty()) return Tensor::zeros(DType::F32, {0, cfg_.vocab_size});
    for (int row : rows) PEREGRINE_CHECK(row >= 0 && row < h.dim(0), "logit row {} out of range", row);
    Tensor hs = be.gather_rows(h, rows), ps = be.gather_rows(pre, rows);
    // Single-pass mHC collapses with the last sublayer's pre mix; a model with a head mix collapses with it.
    Tensor x = w_.hc_head ? be.rms_norm(be.hc_head(hs, *w_.hc_head), w_.norm) : be.collapse_norm(hs, ps, w_.norm);
    return be.logits(x, w_.head, logits_to_host);
}

std::vector<DraftResult> Model::draft(const std::vector<const SeqState*>& seqs, const std::vector<int32_t>& anchors,
                                      const DraftChooser& choose, int max_drafts) {
    PEREGRINE_CHECK(can_draft(), "this model has no DSpark head or MTP layer");
    PEREGRINE_CHECK(!seqs.empty() && seqs.size() == anchors.size(), "draft: one anchor per sequence");
    if (max_drafts <= 0) max_drafts = default_drafts();
    if (has_mtp()) return draft_mtp(seqs, anchors, choose, max_drafts);
    PEREGRINE_CHECK(max_drafts <= cfg_.dspark_block_size, "{} drafts: the DSpark head drafts {} at a time", max_drafts,
                    cfg_.dspark_block_size);
    return draft_dspark(seqs, anchors, choose);
}

std::vector<int32_t> Model::choose_drafts(int i, const Tensor& logits, const DraftChooser& choose,
                                          std::vector<DraftResult>& out) {
    const int N = static_cast<int>(out.size()), vocab = cfg_.vocab_size;
    std::vector<int32_t> chosen;
    if (choose) {
        chosen = choose(i, logits);
    } else {  // greedy, keeping the logits
        const Tensor host = logits.device() == Device::CPU ? logits : backend_->to_host_copy(logits);
        for (int j = 0; j < N; ++j) {
            const float* row = host.f32() + static_cast<int64_t>(j) * vocab;
            auto& l = out[static_cast<size_t>(j)].logits;
            l.insert(l.end(), row, row + vocab);
            chosen.push_back(argmax(row, vocab));
        }
    }
    PEREGRINE_CHECK(static_cast<int>(chosen.size()) == N, "draft chooser: {} ids for {} sequences", chosen.size(),
                    N);
    return chosen;
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
