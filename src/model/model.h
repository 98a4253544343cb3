#pragma once
// DeepSeek-V4.1 / V4 written once against the ops backends: embedding, hyper-connected blocks (engram,
// attention, MoE), final collapse and head. What differs between the releases comes from their variant
// (variant.h); sequences carry their state in pages that kv owns (kv/sequence_state.h).
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/engram_hash.h"
#include "model/expert_parallel.h"
#include "model/variant.h"
#include "ops/backend.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace peregrine {

struct ModelOptions {
    std::string device = "cpu";
    int gpu = 0;  // cuda: which GPU
    int page_tokens = 16;
    std::string engram_placement = "device";  // cuda: engram tables in "device" or pinned "host" memory
    // Batch-invariant outputs: every row lists its attention keys as the official code does when the sequence is fed
    // one token a step (BatchSeq::decode_keys), so a sequence's logits are that feeding's, bit for bit, however it
    // was cut into steps and whatever ran beside it (prefill chunks, prefix hits, preemption, speculation); cuda
    // computes with exact numerics. Off: the official code's lists, whose roundings depend on the step's shape where
    // the window has not filled.
    bool batch_invariant = false;
};

// A DSpark draft block: ids = [anchor, d1..] (B drafts unless the chooser ended the block early), raw confidence
// logits [B], and with the greedy chooser the block's logits [B, vocab] (Markov bias of the chosen ids included).
struct DraftResult {
    std::vector<int32_t> ids;
    std::vector<float> logits;
    std::vector<float> confidence;
};

class Model {
public:
    // Loads config.json and the safetensors checkpoint from `dir`, validating every tensor first.
    static std::unique_ptr<Model> load(const std::string& dir, const ModelOptions& opts = {});
    // A model with made-up weights in the released formats (benchmarks at real dimensions); its engram layers (if
    // the config has them) share one table.
    static std::unique_ptr<Model> synthetic(const ModelConfig& cfg, const ModelOptions& opts = {}, uint64_t seed = 1);

    const ModelConfig& config() const { return cfg_; }
    const ModelFormat& format() const { return format_; }
    const StateLayout& layout() const { return layout_; }
    const std::vector<AttentionLayerInfo>& layer_roles() const { return attn_info_; }
    const std::string& dir() const { return dir_; }
    Backend& backend() { return *backend_; }
    const ModelWeights& weights() const { return w_; }

    // One forward step. Every sequence's pages must cover start_pos + n_tokens positions and its state must
    // hold exactly start_pos tokens. Returns fp32 logits [logit_rows.size(), vocab] for the given rows, in host
    // memory, or with logits_to_host false where the backend samples them (Backend::sample).
    // Rows at positions below their sequence's replay_from (decoder SWA bounded replay) stop after the layers up
    // to the last KV source; a logit row must not be one of them.
    Tensor forward(ForwardBatch& batch, const std::vector<int>& logit_rows, bool logits_to_host = true);
    // The first layer after the last one that writes state other layers read (KV source); n_layers when every
    // layer is one (V4): decoder SWA bounded replay has nothing to skip.
    int replay_layer() const { return replay_layer_; }

    // Drafting, with V4.1's DSpark head or V4's MTP layer: up to max_drafts tokens (0: default_drafts()) after each
    // sequence's last fed position in one pass, given its anchor (the token sampled for the next position). Reads
    // the state, changes none. `choose(i, logits)` picks every sequence's draft i from the position's logits
    // [sequences, vocab] (in device memory where the backend samples there) or ends a sequence's drafts with -1;
    // greedy when absent. The ids are the anchor and the drafts; DSpark's confidence has its block's full length
    // (DSpark's logits include the Markov bias of the chosen ids; MTP has no confidence).
    using DraftChooser = std::function<std::vector<int32_t>(int i, const Tensor& logits)>;
    bool has_dspark() const { return w_.dspark.has_value(); }
    bool has_mtp() const { return w_.mtp.has_value(); }
    bool can_draft() const { return has_dspark() || has_mtp(); }
    // DSpark: its block; MTP: 3 (SGLang's V4 recipe chains its one layer three steps).
    int default_drafts() const { return has_dspark() ? cfg_.dspark_block_size : 3; }
    std::vector<DraftResult> draft(const std::vector<const SeqState*>& seqs, const std::vector<int32_t>& anchors,
                                   const DraftChooser& choose = nullptr, int max_drafts = 0);

    // Expert parallelism: this model is one rank of `ep`'s group; it drops the routed experts of the
    // backbone's MoE layers that the rank does not hold (DSpark's stay whole). Every rank then runs each
    // forward step together with the others: a rank with nothing to run calls idle_step().
    void set_expert_parallel(std::shared_ptr<ExpertParallel> ep);
    ExpertParallel* expert_parallel() const { return ep_.get(); }
    // One step with no rows of this rank's own: takes part in every MoE layer's exchange.
    void idle_step();

private:
    Model() = default;
    // The variant's format, roles and state layout, and the backend (after the config and weights).
    void set_up(const ModelOptions& opts);
    AttentionLayerInfo stage_info(int stage) const;
    AttentionLayerInfo mtp_info() const;
    std::vector<DraftResult> draft_dspark(const std::vector<const SeqState*>& seqs,
                                          const std::vector<int32_t>& anchors, const DraftChooser& choose);
    std::vector<DraftResult> draft_mtp(const std::vector<const SeqState*>& seqs, const std::vector<int32_t>& anchors,
                                       const DraftChooser& choose, int max_drafts);
    // Every sequence's draft i from the position's logits [sequences, vocab]: the chooser's, or else greedy (the
    // logits kept in `out`).
    std::vector<int32_t> choose_drafts(int i, const Tensor& logits, const DraftChooser& choose,
                                       std::vector<DraftResult>& out);
    // The MTP layer's window entries of a step's rows (h: the backbone's final hidden states, mtp.cpp).
    void feed_mtp(ForwardBatch& batch, const Tensor& h);

    std::string dir_;
    ModelConfig cfg_;
    SafeTensors st_;
    ModelWeights w_;
    ModelFormat format_;
    StateLayout layout_;
    std::vector<AttentionLayerInfo> attn_info_;
    int replay_layer_ = 0;
    bool batch_invariant_ = false;
    std::optional<EngramTables> engram_;
    std::unique_ptr<Backend> backend_;
    std::shared_ptr<ExpertParallel> ep_;
};

// DeepSeek-V4.1-Flash's dimensions with `layers` layers that cover its attention roles in order: window
// only, ratio-2 source (compressor + indexer), ratio-2 reuse, ratio-1 source (+ candidate blocks), ratio-1
// reuse, then ratio-1 layers with a re-indexing layer every fourth. From 21 layers, the release's own layout
// (KV sources 2, 8, 14, 20; index sources also 24..36; candidate blocks at 20) over its first `layers` layers.
// No engram, no DSpark stages.
ModelConfig synthetic_v41_flash_config(int layers, int n_routed_experts = 384);
// DeepSeek-V4-Flash's dimensions with `layers` layers in its pattern: two window-only layers, then CSA (ratio 4,
// indexer) and HCA (ratio 128) in turn; the first three route by token id. No MTP layer.
ModelConfig synthetic_v4_flash_config(int layers, int n_routed_experts = 256);
// V4.1-Flash's engram layers (1 and 14, those of cfg's layers) with the release's hashing and table row counts
// (384,006,168 and 384,016,682 rows of 256 bytes: 98 GB each).
void add_synthetic_engram(ModelConfig& cfg);
// V4.1-Flash's DSpark head: 3 stages of 128 experts (top-3), blocks of 5, Markov rank 256, reading the last three
// of cfg's layers (the release reads 37-39 of 40).
void add_synthetic_dspark(ModelConfig& cfg);
// The synthetic models by name, as serve --synthetic and synth-checkpoint take them; experts 0: the release's
// count (384 for V4.1-Flash, 256 for V4-Flash).
inline constexpr const char* synthetic_presets() { return "v41-flash, v4-flash"; }
ModelConfig synthetic_preset_config(const std::string& preset, int layers, int n_routed_experts = 0);


}  // namespace peregrine
