#pragma once
// The coarse operations the model is written against. Each backend (cpu/: the readable reference,
// cuda/: fused and fast) implements them for a batch of sequences whose new tokens are packed as rows.
#include "io/model_config.h"
#include "ops/sampling.h"
#include "ops/state.h"
#include "ops/weights.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace peregrine {

// One sequence's share of a forward step: rows [row0, row0 + n_tokens) hold its tokens at positions
// start_pos.. ; its state already covers positions < start_pos.
struct BatchSeq {
    SeqState* state = nullptr;
    int64_t start_pos = 0;
    int n_tokens = 0;
    int row0 = 0;
};

struct ForwardBatch {
    std::vector<BatchSeq> seqs;
    std::vector<int32_t> token_ids;  // per row
    int rows() const { return static_cast<int>(token_ids.size()); }
};

// How one attention layer gets its compressed KV and its top-k selection.
struct AttentionLayerInfo {
    int layer = 0;
    int ratio = 0;               // 0: sliding window only
    bool compresses = false;     // runs its own compressor and owns the compressed entries
    int comp_source = -1;        // layer whose compressed entries it attends to
    bool has_indexer = false;    // computes its own top-k selection
    bool owns_index_k = false;   // V4.1: turns its latents into indexer keys
    int index_k_source = -1;     // layer whose indexer keys it scores against
    bool candidate_source = false;  // V4.1: builds the level-1 candidate blocks
    bool uses_candidates = false;   // V4.1: restricted to the candidate blocks
    bool attend_all_compressed = false;  // V4 HCA: every visible entry, no indexer
    double rope_theta = 10000.0;
    bool yarn = false;
};

// Mixing coefficients of a hyper-connection site (fp32): pre [T,hc], post [T,hc], comb [T,hc,hc].
struct HcMix {
    Tensor pre, post, comb;
};

// Cross-layer results of one forward step (selected indices, candidate blocks), backend-specific.
struct StepScratch {
    virtual ~StepScratch() = default;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;

    virtual std::unique_ptr<StepScratch> begin_step(const ForwardBatch& batch) = 0;

    // Memory for state pages (host for the CPU backend, device memory for CUDA).
    virtual uint8_t* alloc_state(size_t bytes) = 0;
    virtual void free_state(uint8_t* p) = 0;
    // Copies bytes of state-page memory to host memory (restoring a sequence's carry from a page snapshot).
    virtual void read_state(const uint8_t* src, size_t bytes, void* dst) = 0;

    // [T, hc] mixing weights that select copy 0 (the first sublayer's collapse in V4.1).
    virtual Tensor first_stream_mix(int T) = 0;
    // Rows `rows` of a [T, ...] activation.
    virtual Tensor gather_rows(const Tensor& x, const std::vector<int>& rows) = 0;

    // h[T, hc, dim] (bf16 values) = embedding rows repeated over the hc copies.
    virtual Tensor embed(const Tensor& table, const std::vector<int32_t>& ids) = 0;
    // Adds the engram lookup to every copy of h; rows [T, n_cols] are table row ids.
    virtual void engram(Tensor& h, const EngramWeight& w, const std::vector<int64_t>& rows) = 0;
    virtual HcMix hc_mixes(const Tensor& h, const HcWeight& w) = 0;
    // sum_i pre[i] * h[i] -> [T, dim] bf16
    virtual Tensor hc_collapse(const Tensor& h, const Tensor& pre) = 0;
    // out[j] = post[j] * y + sum_i comb[i][j] * residual[i] -> [T, hc, dim] bf16
    virtual Tensor hc_expand(const Tensor& y, const Tensor& residual, const HcMix& mix) = 0;
    // V4 final collapse: pre = sigmoid(mixes * scale + base) + eps.
    virtual Tensor hc_head(const Tensor& h, const HcWeight& w) = 0;
    virtual Tensor rms_norm(const Tensor& x, const Tensor& w) = 0;
    // Mean over the hc copies -> [T, dim] bf16 (DSpark inputs).
    virtual Tensor hc_mean(const Tensor& h) = 0;

    virtual Tensor attention(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                             ForwardBatch& batch, StepScratch& scratch) = 0;
    virtual Tensor moe(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids) = 0;

    // DSpark: [T, a] ++ [T, b] ++ ... along columns.
    virtual Tensor concat_cols(const std::vector<Tensor>& parts) = 0;
    // Stores this layer's window K=V of rows `x` (kv_norm(wkv(x)), RoPE, fp8) at each row's position
    // (a DSpark stage's window is fed from the backbone's hidden states).
    virtual void store_window_kv(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                                 ForwardBatch& batch) = 0;
    // A DSpark stage's attention for a draft block at positions pos+1.. over its window (positions <= pos)
    // and the whole block (no causal mask inside the block).
    virtual Tensor dspark_attention(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                                    const SeqState& state, int64_t pos) = 0;
    // Markov bias row for the token `id`: markov_head(markov_embed[id]) in fp32, host memory [vocab].
    virtual Tensor markov_bias(const DSparkWeight& w, int32_t id) = 0;
    // Raw confidence logits [B] (host) of the collapsed block rows x [B, dim] and the Markov embeddings of ids.
    virtual Tensor dspark_confidence(const DSparkWeight& w, const Tensor& x, const std::vector<int32_t>& ids) = 0;
    virtual Tensor linear(const Tensor& x, const LinearWeight& w) = 0;
    // fp32 logits [rows, vocab] of already normalised rows, in host memory (or, with to_host false, where
    // the backend samples them: device memory when samples_on_device()).
    virtual Tensor logits(const Tensor& x, const LinearWeight& head, bool to_host = true) = 0;

    // Whether logits(..., to_host = false) stay on the device and sample() runs there.
    virtual bool samples_on_device() const { return false; }
    // The tokens of `rows` (adjustments, penalties, truncation, seeded draw, logprobs: ops/sampling.h) from
    // logits as logits() returned them. May change the sampled rows of `logits` (their adjustments).
    virtual std::vector<SampleResult> sample(const Tensor& logits, const std::vector<SampleRow>& rows) {
        return sample_rows_host(logits.f32(), static_cast<int>(logits.dim(1)), rows);
    }
    // Rows `rows` of logits as logits() returned them, in host memory [rows.size(), vocab].
    virtual Tensor logits_to_host(const Tensor& logits, const std::vector<int>& rows) {
        const int64_t V = logits.dim(1);
        Tensor out = Tensor::zeros(DType::F32, {static_cast<int64_t>(rows.size()), V});
        for (size_t i = 0; i < rows.size(); ++i)
            std::memcpy(out.f32() + static_cast<int64_t>(i) * V, logits.f32() + rows[i] * V, sizeof(float) * static_cast<size_t>(V));
        return out;
    }
};

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& cfg, const StateLayout& layout);
// Only in builds with the CUDA backend (PEREGRINE_HAVE_CUDA). engram_placement: "device" or "host" (the
// engram tables in pinned host memory, read by the GPU directly).
std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& cfg, const StateLayout& layout,
                                           const std::string& engram_placement = "device");
// Whether a CUDA device is usable in this process (false in builds without the backend), and why not.
bool cuda_device_available(std::string* why = nullptr);

}  // namespace peregrine
