#pragma once
// The coarse operations the model is written against. Each backend (cpu/: the readable reference,
// cuda/: fused and fast) implements them for a batch of sequences whose new tokens are packed as rows.
#include "io/model_config.h"
#include "kv/sequence_state.h"
#include "kv/state_layout.h"
#include "kv/state_memory.h"
#include "ops/device_sampler.h"
#include "ops/diagnostics.h"
#include "ops/forward_batch.h"
#include "ops/model_format.h"
#include "ops/weights.h"
#include "util/error.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace peregrine {

// One engram layer's n-gram hashing for backends that hash on their side (deferred ids); model/engram_hash.h
// owns the tables, ops/engram_hash_math.h holds the arithmetic.
struct EngramHash {
    int max_ngram = 0, n_heads = 0;
    const int64_t* primes = nullptr;       // [(max_ngram - 1) * n_heads]
    const int64_t* offsets = nullptr;      // the same layout
    const int64_t* multipliers = nullptr;  // [max_ngram]
    const std::vector<int32_t>* token_map = nullptr;  // token id -> compressed id
    int64_t pad = 0;                                  // compressed id where a window reaches before the sequence
};

// How one attention layer gets its compressed KV and its top-k selection.
struct AttentionLayerInfo {
    int layer = 0;
    int ratio = 0;               // 0: sliding window only
    bool compresses = false;     // runs its own compressor and owns the compressed entries
    int comp_source = -1;        // layer whose compressed entries it attends to
    bool has_indexer = false;    // computes its own top-k selection
    bool owns_index_k = false;   // turns its compressed latents into indexer keys (V4.1)
    bool index_compressor = false;  // its indexer turns tokens into keys with a compressor of its own (V4)
    int index_k_source = -1;     // layer whose indexer keys it scores against (its own, or an earlier owner's)
    bool candidate_source = false;  // builds the level-1 candidate blocks
    bool uses_candidates = false;   // restricted to the candidate blocks
    bool reuses_selection = false;  // no indexer: the latest index source's selection
    bool attend_all_compressed = false;  // no indexer: every visible entry
    double rope_theta = 10000.0;
    bool yarn = false;
};

// Mixing coefficients of a hyper-connection site (fp32): pre [T,hc], post [T,hc], comb [T,hc,hc].
struct HcMix {
    Tensor pre, post, comb;
};

// Routing of a MoE layer's rows: pair p = t*top_k + k goes to expert experts[p] with weight weights[p]
// (backend tensors: I32 [T*top_k] and F32 [T*top_k]).
struct MoeRoute {
    Tensor experts, weights;
};

// A decoder layer to run: its weights and its attention role.
struct DecoderLayerRef {
    const BlockWeight* block;
    const AttentionLayerInfo* info;
};

// Cross-layer results of one forward step (selected indices, candidate blocks), backend-specific.
struct StepScratch {
    virtual ~StepScratch() = default;
};

class Backend {
public:
    explicit Backend(const ModelFormat& format) : format_(format) {}
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    const ModelFormat& format() const { return format_; }

    virtual std::unique_ptr<StepScratch> begin_step(const ForwardBatch& batch) = 0;
    // The scratch of a batch of rows `rows` of this step (decoder SWA bounded replay): the cross-layer results so
    // far, of those rows.
    virtual std::unique_ptr<StepScratch> narrow_step(StepScratch& scratch, const std::vector<int>& rows) = 0;
    // Makes the calling thread use this backend's device (a thread that drives a model on one of several GPUs).
    virtual void bind_thread() {}

    // Its roles beside the compute ops: the memory state pages and carries live in (host memory for the CPU
    // backend, device memory for CUDA), its sampler, and what tools can ask of it (null: nothing).
    virtual StateMemory& state_memory() = 0;
    virtual DeviceSampler& sampler() = 0;
    virtual Diagnostics* diagnostics() { return nullptr; }

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
    // rms_norm(hc_collapse(h, pre), w): a sublayer's input (one kernel on the GPU).
    virtual Tensor collapse_norm(const Tensor& h, const Tensor& pre, const Tensor& w) {
        return rms_norm(hc_collapse(h, pre), w);
    }
    // Mean over the hc copies -> [T, dim] bf16 (DSpark inputs).
    virtual Tensor hc_mean(const Tensor& h) = 0;

    virtual Tensor attention(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                             ForwardBatch& batch, StepScratch& scratch) = 0;
    virtual Tensor moe(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids) = 0;
    // Consecutive decoder layers with nothing of the model's between them (an engram runs before a run): each
    // decoder_layer_ops with attention() and moe(batch.token_ids). A backend may run them its own way (the CUDA
    // backend replays a decode step's run of layers as one graph).
    virtual void decoder_layers(const std::vector<DecoderLayerRef>& layers, ForwardBatch& batch, StepScratch& scratch,
                                Tensor& h, Tensor& pre);
    // moe() in three parts, so that expert parallelism can move the pairs between ranks in between:
    // the router; the routed experts over pair rows xp [P, dim] (row p through expert experts[p], its
    // routing weight applied before w2; fp32 [P, dim]; with the reference's arithmetic a row's result does not
    // depend on the other rows); and the combine: bf16(sum of row t's pairs ye[t*top_k + k] in ascending expert order +
    // shared expert of x[t]).
    virtual MoeRoute moe_route(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids) = 0;
    virtual Tensor moe_experts(const Tensor& xp, const MoEWeight& w, const Tensor& experts, const Tensor& weights) = 0;
    virtual Tensor moe_combine(const Tensor& x, const MoEWeight& w, const Tensor& ye, const Tensor& experts) = 0;
    // Copies between host memory and the memory this backend computes in (the CPU backend's is the host).
    virtual Tensor to_host_copy(const Tensor& t) = 0;
    virtual Tensor from_host_copy(const Tensor& host) = 0;

    // DSpark: [T, a] ++ [T, b] ++ ... along columns.
    virtual Tensor concat_cols(const std::vector<Tensor>& parts) = 0;
    // Stores this layer's window K=V of rows `x` (kv_norm(wkv(x)), RoPE, fp8) at each row's position
    // (a DSpark stage's window is fed from the backbone's hidden states).
    virtual void store_window_kv(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                                 ForwardBatch& batch) = 0;
    // A drafter's attention for blocks of equal length, rows [j * B, (j + 1) * B) sequence j's at positions
    // pos[j]+1.., over its stored window (positions <= pos[j], draft_window_keys) and its block: a DSpark stage's
    // whole block (no causal mask inside; [T] rows out); with `chain` (V4's MTP layer) the block is the chain so far
    // and only its last row queries, over the chain's rows ([N] rows out: row j sequence j's row B - 1).
    virtual Tensor draft_attention(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                                   const std::vector<const SeqState*>& states, const std::vector<int64_t>& pos,
                                   bool chain) = 0;
    // y += x elementwise (fp32, one shape; y where logits() leaves them).
    virtual void add_into(Tensor& y, const Tensor& x) = 0;
    virtual Tensor linear(const Tensor& x, const LinearWeight& w) = 0;
    // fp32 logits [rows, vocab] of already normalised rows, in host memory (or, with to_host false, where
    // the backend samples them: device memory when sampler().on_device()).
    virtual Tensor logits(const Tensor& x, const LinearWeight& head, bool to_host = true) = 0;

    // Engram over windows [T, max_ngram] of token ids (each row's own, then the ones before it; kNoToken before
    // the sequence's start), hashed by the backend: the path for deferred ids (DeviceSampler::takes_deferred_ids).
    static constexpr int32_t kNoToken = INT32_MIN;
    virtual void engram_hashed(Tensor& h, const EngramWeight& w, const EngramHash& hash,
                               const std::vector<int32_t>& windows) {
        (void)h, (void)w, (void)hash, (void)windows;
        fail("this backend hashes no engram windows");
    }

protected:
    ModelFormat format_;
};

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& cfg, const ModelFormat& format, const StateLayout& layout);
// Only in builds with the CUDA backend (PEREGRINE_HAVE_CUDA). engram_placement: "device" or "host" (the
// engram tables in pinned host memory, read by the GPU directly); exact: Numerics::Exact whatever
// PEREGRINE_CUDA_NUMERICS says.
std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& cfg, const ModelFormat& format,
                                           const StateLayout& layout, const std::string& engram_placement = "device",
                                           int gpu = 0, bool exact = false);
// Whether a CUDA device is usable in this process (false in builds without the backend), and why not.
bool cuda_device_available(std::string* why = nullptr);

// A decoder layer's hyper-connected sublayers: mixes, collapse + norm, attention, expand, mixes, collapse + norm, FFN,
// expand. h [T, hc, dim] in and out; pre in: the previous sublayer's pre (single-pass mHC collapses a sublayer's
// input with it), out: this layer's FFN pre.
struct LayerBlocks {
    std::function<Tensor(const Tensor&)> attention, ffn;
};
void decoder_layer_ops(Backend& be, const BlockWeight& b, bool single_pass_mhc, const LayerBlocks& blocks, Tensor& h,
                       Tensor& pre);

}  // namespace peregrine
