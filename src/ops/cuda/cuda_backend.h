#pragma once
// The CUDA backend: activations are F32 tensors in device memory holding bf16-rounded values, state pages
// live in device memory with the reference's float layout, weights are uploaded on first use in their
// stored formats. Every op keeps the reference backend's quantisation and rounding points (src/ops/cpu):
// the fast kernels (default) sum in fp32 in their own order, on tensor cores where the operands allow, so
// logits agree with the reference to rounding noise; the exact ones are bit-identical to it (see numerics_
// and docs/cuda-backend.md). Logits come back in host memory.
#include "ops/backend.h"
#include "ops/cuda/attention_planner.h"
#include "ops/cuda/cuda_sampler.h"
#include "ops/cuda/device_memory.h"
#include "ops/cuda/graph_runner.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/linear_dispatch.h"
#include "ops/cuda/weight_cache.h"

#include <deque>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>

namespace peregrine::cuda {

class SideStream;  // launch_stream.h

struct CudaScratch : StepScratch {
    // Compressed-entry selection of the most recent index source: [T, k] (-1: none) and counts [T].
    std::shared_ptr<void> topk, topk_count;
    int topk_k = 0;
    // Level-1 candidate mask of the candidate source: [T, mask_stride] bytes (a bit per candidate block), its ratio
    // and (prefill planner) its width per row.
    std::shared_ptr<void> mask;
    std::shared_ptr<const int64_t> mask_width;
    int64_t mask_stride = 0;
    int mask_ratio = 0;
    // Numerics::Fast: the step's page tables on the device (uploaded by the first attention layer).
    std::shared_ptr<void> paged_keep;
    PagedSeqs paged;
    // Decode-form steps (decode and verify steps, attention_decode.cpp), decided by the step's first attention layer:
    // -1 undecided, 0 no, 1 yes;
    // cap bounds every row's position + 1 (the tables are cap / ratio wide); set: the fixed buffers of the step's
    // layer graphs (null: no graphs this step), which `paged` then points into.
    int decode = -1;
    int64_t cap = 0;
    struct DecodeSet* set = nullptr;
};

// Per decode-form step size (rows, sequences): the buffers a step's layer graphs read and write at fixed addresses
// (the step's page tables, copied in by its first layer; the selections and candidate mask that later layers read),
// for positions below cap.
struct DecodeSet {
    int64_t cap = 0;
    std::shared_ptr<void> step;
    size_t step_bytes = 0;
    std::map<int, std::pair<std::shared_ptr<void>, size_t>> slots;  // by StepSlot (attention_planner.h)
};

// State pages and carries in one GPU's memory; copies on the calling thread's stream.
class CudaStateMemory final : public StateMemory {
public:
    explicit CudaStateMemory(int gpu) : gpu_(gpu) {}
    uint8_t* alloc(size_t bytes) override;
    void free(uint8_t* p) override;
    void to_host(const uint8_t* src, size_t bytes, void* dst) override;
    void from_host(uint8_t* dst, const void* src, size_t bytes) override;
    void copy(uint8_t* dst, const uint8_t* src, size_t bytes) override;
    uint8_t* alloc_host(size_t bytes) override;
    void free_host(uint8_t* p) override;
    void page_to_host(const uint8_t* src, size_t bytes, uint8_t* host) override;
    void page_from_host(uint8_t* dst, const uint8_t* host, size_t bytes) override;
    std::function<void()> fence() override;

private:
    int gpu_;
};

class CudaBackend : public Backend, public Diagnostics {
public:
    CudaBackend(const ModelConfig& cfg, const ModelFormat& format, const StateLayout& layout,
                EngramPlacement engram = EngramPlacement::Device, int gpu = 0, bool exact = false);
    ~CudaBackend() override;
    std::string name() const override { return "cuda"; }

    std::unique_ptr<StepScratch> begin_step(const ForwardBatch& batch) override;
    std::unique_ptr<StepScratch> narrow_step(StepScratch& scratch, const std::vector<int>& rows) override;
    void bind_thread() override;
    StateMemory& state_memory() override { return memory_; }
    Tensor first_stream_mix(int T) override;
    Tensor gather_rows(const Tensor& x, const std::vector<int>& rows) override;
    Tensor embed(const Tensor& table, const std::vector<int32_t>& ids) override;
    void engram(Tensor& h, const EngramWeight& w, const std::vector<int64_t>& rows) override;
    HcMix hc_mixes(const Tensor& h, const HcWeight& w) override;
    Tensor hc_collapse(const Tensor& h, const Tensor& pre) override;
    Tensor hc_expand(const Tensor& y, const Tensor& residual, const HcMix& mix) override;
    Tensor hc_head(const Tensor& h, const HcWeight& w) override;
    Tensor rms_norm(const Tensor& x, const Tensor& w) override;
    Tensor collapse_norm(const Tensor& h, const Tensor& pre, const Tensor& w) override;
    Tensor hc_mean(const Tensor& h) override;
    Tensor attention(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info, ForwardBatch& batch,
                     StepScratch& scratch) override;
    Tensor moe(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids) override;
    // Decode steps with graphs (a DecodeSet): the run of layers through its graph (layers_graph), else as the base
    // class.
    void decoder_layers(const std::vector<DecoderLayerRef>& layers, ForwardBatch& batch, StepScratch& scratch,
                        Tensor& h, Tensor& pre) override;
    MoeRoute moe_route(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids) override;
    Tensor moe_experts(const Tensor& xp, const MoEWeight& w, const Tensor& experts, const Tensor& weights) override;
    Tensor moe_combine(const Tensor& x, const MoEWeight& w, const Tensor& ye, const Tensor& experts) override;
    Tensor to_host_copy(const Tensor& t) override;
    Tensor from_host_copy(const Tensor& host) override;
    Tensor concat_cols(const std::vector<Tensor>& parts) override;
    void store_window_kv(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                         ForwardBatch& batch) override;
    Tensor draft_attention(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                           const std::vector<const SeqState*>& states, const std::vector<int64_t>& pos,
                           bool chain) override;
    void add_into(Tensor& y, const Tensor& x) override;
    Tensor linear(const Tensor& x, const LinearWeight& w) override;
    Tensor logits(const Tensor& x, const LinearWeight& head, bool to_host = true) override;
    // Ops after a sampler start() read deferred ids from its output on the device (embedding, hash routing,
    // engram windows hashed here).
    void engram_hashed(Tensor& h, const EngramWeight& w, const EngramHash& hash,
                       const std::vector<int32_t>& windows) override;

    DeviceSampler& sampler() override { return sampler_; }
    Diagnostics* diagnostics() override { return this; }

    // Diagnostics (ops/diagnostics.h): profiling with events per outermost op and per phase inside attention and
    // MoE.
    std::string device_name() const override;
    void set_profiling(bool on) override { profiling_ = on; }
    std::map<std::string, double> profile() override;
    double take_host_wait_ms() override {
        const double ms = host_wait_ms_;
        host_wait_ms_ = 0;
        return ms;
    }
    void set_balanced_routing(bool on) override;
    bool graphs() const override { return graphs_; }
    // Device memory reserved for CUDA graphs' allocations, its high-water mark in this process.
    size_t graph_memory_bytes() const override;
    GraphCensus graph_census() const override { return graph_runner_.census(); }
    // Counting the activation pool's freed but still mapped memory (state allocations can take it back).
    size_t free_memory() const override;
    MemoryUse memory_use(bool reset_peak) override;
    size_t weights_uploaded() const override { return weights_.entries(); }
    size_t weight_bytes_uploaded() const override { return cuda::weight_bytes_uploaded(); }
    std::vector<int> graph_batch_sizes() const override;
    double copy_bandwidth_gbs(size_t bytes, int reps) const override;
    // bf16-valued floats in [-1, 1), then valid codes and scales in every entry.
    void fill_state_random(const PagePool& pool, uint64_t seed) override;

    // Bound on the indexer's score matrix per chunk of query rows (default 1 GiB; env PEREGRINE_INDEX_SCORE_MB
    // at construction for A/B); tests shrink it to check that the chunking changes nothing.
    void set_index_score_bytes(int64_t bytes) { index_score_bytes_ = bytes; }
    // CUDA graphs (on unless env PEREGRINE_CUDA_GRAPHS=0 at construction; or this call): at a batch of
    // graph_bucket() rows (decode sizes) a decode step's layers (attention_decode.cpp), and other steps' MoE blocks,
    // are each captured into a graph after one eager run at that size and replayed from then on (cuda_graphs.cpp).
    // Same kernels on the same inputs: results are bit-identical. Each graph keeps its temporaries' memory, hence the
    // buckets: 1-8, 12, 16, 24, 32 rows.
    static bool graph_bucket(int64_t rows) {
        return (rows >= 1 && rows <= 8) || rows == 12 || rows == 16 || rows == 24 || rows == 32;
    }
    void set_graphs(bool on);
    // Decode layer graphs are captured for positions below a cap, rounded up to a multiple of this (default
    // 2048 tokens): a new cap means new graphs. Tests shrink it.
    void set_graph_cap_tokens(int64_t n) { graph_cap_tokens_ = n; }
    // Decode steps' attention with its tables worked out on the device (attention_decode.cpp; on unless env
    // PEREGRINE_DECODE_TABLES=0 at construction); off: the general path, whose tables the host lists (tests, A/B).
    void set_decode_tables(bool on) { decode_tables_ = on; }
    // The hc mixes of decode-sized steps on a side stream (on by default, Fast numerics); returns the previous setting.
    bool set_side_mixes(bool on);
    // The shared expert of decode-sized MoE blocks on a side stream (on by default, Fast numerics).
    void set_side_shared(bool on) { side_shared_on_ = on; }
    // Graph replays / captures so far (tests, benchmarks).
    int64_t graph_replays() const { return graph_runner_.replays(); }
    int64_t graph_captures() const { return graph_runner_.captures(); }
    int64_t graph_failed_captures() const { return graph_runner_.failed_captures(); }

private:
    friend class OpTimer;
    friend class CudaSampler;
    friend class PrefillPlanner;
    friend class DecodePlanner;
    struct TimedEvent {
        std::string name;
        void* start;
        void* stop;
    };
    int gpu_ = 0;
    bool profiling_ = false, balanced_routing_ = false;
    int64_t index_score_bytes_ = int64_t{1024} << 20;
    int depth_ = 0, open_phase_ = -1;
    std::vector<TimedEvent> events_;
    // Ends the current phase of the outermost op (if any) and starts `name`.
    void phase(const char* name);

    // An attention block's projections of x: its queries q (RoPE'd), its window K=V rows kv (normed, RoPE'd, QDQ'd)
    // and, for an indexer layer, the indexer's projected queries iq (its wq_b rides in the queries' GEMV).
    struct AttentionInputs {
        Tensor q, kv_proj, iq;  // kv_proj: the window K=V's projection (store_window makes the entries)
    };
    AttentionInputs attention_inputs(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                                     const float* freqs, const int64_t* pos, int T);
    // The indexer's queries iq made ready in place (as its keys of format f: index_rope_qdq) and its head weights of
    // x, scaled.
    Tensor index_queries(const Tensor& x, Tensor& iq, const IndexerWeight& iw, const float* freqs, const int64_t* pos,
                         int T, const EntryFormat& f);
    // Indexer keys (or queries) in place, `heads` per row at positions pos: RoPE, the format's rotation, the QDQ
    // to the keys' entry format f.
    void index_rope_qdq(float* x, int64_t rows, int heads, const int64_t* pos, const float* freqs, const EntryFormat& f);
    // rms_norm(x, w), then RoPE at pos and the QDQ to entry format f on its rows (one head of x's width, no
    // rotation): one launch (rms_norm_rope_qdq). Window K=V rows, compressed latents, indexer keys.
    // With `store`, its rows also go into their entries (the window's K=V: store_window).
    Tensor norm_rope_qdq(const Tensor& x, const Tensor& w, const int64_t* pos, const float* freqs,
                         const EntryFormat& f, const PagedRowStore* store = nullptr);
    // The window K=V rows from their projection (kv_norm, RoPE, QDQ) into their entries of `sec`: with the step's
    // paged tables one launch (rms_norm_rope_qdq with a PagedRowStore), else window_kv_of and the planner's store.
    void store_window(const Tensor& kv_proj, const AttentionWeight& w, AttentionPlanner& plan, const StateSection& sec,
                      const int64_t* pos, const float* freqs);
    // Indexer keys of format f from rows x (one key a row) at positions pos: the norm w, then index_rope_qdq's
    // RoPE, rotation and QDQ (norm_rope_qdq where the format has no rotation).
    Tensor index_keys(const Tensor& x, const Tensor& w, const int64_t* pos, const float* freqs, const EntryFormat& f);
    // Sparse attention with sink over each row's key list (kr): the decoded-row kernel (key_rows), the tensor-core
    // one (Fast), or the exact one; o [T, H, D], rotated back (the inverse RoPE at each row's position pos).
    Tensor sparse_attend(const Tensor& q, const AttentionWeight& w, const KeyRefs& kr, bool key_rows,
                         const float* freqs, const int64_t* pos);
    // q = wq_b(qr) per head (with the format's head norm), RoPE at each row's position.
    Tensor project_queries(const Tensor& qr, const AttentionWeight& w, const float* freqs, const int64_t* pos, int T);
    // The same from the wq_b projection already made (head norm, RoPE in place).
    Tensor queries_of(Tensor q, const float* freqs, const int64_t* pos, int T);
    // Window K=V rows: kv_norm(wkv(x)), RoPE, quantise-dequantise to the window entries' format f.
    Tensor window_kv(const Tensor& x, const AttentionWeight& w, const float* freqs, const int64_t* pos,
                     const EntryFormat& f);
    // The same from x's wkv projection already made.
    Tensor window_kv_of(const Tensor& projected, const AttentionWeight& w, const float* freqs, const int64_t* pos,
                        const EntryFormat& f);
    // The output projection of the attention output o: grouped wo_a (bf16), wo_b.
    Tensor project_output(Tensor& o, const AttentionWeight& w, int T);

    // Sequence s's carry in device memory (its slot from the page pool).
    float* device_carry(SeqState& s);
    // Token ids on the device, deferred ones (DeviceSampler::deferred_id) read from the sampler's latest start();
    // kNoToken kept.
    DevArray<int32_t> upload_ids(const std::vector<int32_t>& ids);
    DevArray<int32_t> ids_cache_;  // the latest upload_ids: its host ids and the sampler's generation then
    std::vector<int32_t> ids_cache_host_;
    uint64_t ids_cache_gen_ = 0;
    // Engram from table row ids on the device [T, n_cols].
    void engram_rows_d(Tensor& h, const EngramWeight& w, const int64_t* rows_d);
    // MoE on device ids (moe() uploads them); writes out [T, dim].
    void moe_body(const Tensor& x, const MoEWeight& w, const int32_t* ids_d, Tensor& out);
    // The MoE block through its graph (captured on the second call at this layer and size); false: run it
    // eagerly (first call, or capture not possible).
    bool moe_graph(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids, Tensor& out);
    bool graphs_ = true;
    GraphRunner graph_runner_;
    double host_wait_ms_ = 0;
    // Decode-form steps (attention_decode.cpp): a token or a few drafted ones per sequence, Numerics::Fast. Every
    // table and list the attention block reads is worked out on the device from the step's page tables, so the block
    // uploads nothing and launches the same kernels for any step of (T, S, cap): a run of layers is captured as one
    // graph per T rows and S sequences (layers_graph).
    void begin_decode(const ForwardBatch& batch, CudaScratch& scratch);
    // The attention block's skeleton (attention.cpp) over a planner's tables (attention_planner.h).
    Tensor attend(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info, AttentionPlanner& plan,
                  CudaScratch& scratch);
    // A decode-form step's run of decoder layers through one graph (captured on the second call at this T, S and
    // cap; each attention block through the decode planner, each MoE block as moe_body); false: run it eagerly.
    bool layers_graph(const std::vector<DecoderLayerRef>& layers, CudaScratch& scratch, const std::vector<int32_t>& ids,
                      Tensor& h, Tensor& pre);
    std::map<std::pair<int64_t, int64_t>, std::shared_ptr<DecodeSet>> decode_sets_;
    int64_t graph_cap_tokens_ = 2048;
    bool decode_tables_ = true;

    // Mixing coefficients (hc_mixes / hc_head) by numerics and size: exact kernel, small-T kernels,
    // or the FP64 tensor-core kernel.
    void run_hc_mixes(const Tensor& h, const Tensor& fn, int n_mix, const Tensor& base, const Tensor& scale, int iters,
                      int mode, float* pre, float* post, float* comb);
    bool hc_small_ = true;             // PEREGRINE_HC_SMALL=0: the FP64 tensor-core path below 8 rows too (A/B)
    // hc mixes on a side stream (cuda_backend.cpp); PEREGRINE_HC_SIDE_STREAM=0: on the thread's stream (A/B).
    struct SideMixes;
    SideMixes& side_mixes();
    // Makes this thread's stream wait for the mix in flight: always (t null) or if t is one of its outputs.
    void join_mixes(const Tensor* t);
    bool side_mixes_on_ = true;
    // The grouped wo_a's routing (row (t, g) to group g) at T rows, built once per T; its group tables per weight.
    struct GroupRouting {
        std::shared_ptr<void> sel, row_map, tiles, n_tiles;
        LinearRouting routing;
    };
    const GroupRouting& group_routing(int T, int G);
    std::map<std::pair<int, int>, GroupRouting> group_routing_;
    Numerics numerics_ = Numerics::Fast;  // PEREGRINE_CUDA_NUMERICS (linear_dispatch.h)
    float eps() const { return static_cast<float>(cfg_.norm_eps); }

    MoeRoute route_rows(const Tensor& x, const MoEWeight& w, const int32_t* ids_d);
    Tensor routed_experts(const Tensor& x, int64_t pairs, int per_row, const MoEWeight& w, const int32_t* sel,
                          const float* wsel);
    void shared_expert(const Tensor& x, const MoEWeight& w, Tensor& ys);
    void combine_into(const Tensor& ye, const int32_t* sel, const Tensor& shared, int top_k, Tensor& out);
    // The shared expert of decode-sized MoE blocks on a side stream (moe.cpp); PEREGRINE_SHARED_EXPERT_SIDE_STREAM=0:
    // on the thread's stream (A/B).
    SideStream& side_experts();
    bool side_shared_on_ = true;
    bool launch_folds_ = true;  // PEREGRINE_LAUNCH_FOLDS: the attention block's folded launches (A/B)
    bool use_grouped_fp4(const ExpertWeight& e0, const ExpertTables& tab, const LinearRouting& r);

    ModelConfig cfg_;
    StateLayout layout_;
    CudaStateMemory memory_;
    CudaSampler sampler_;
    WeightCache weights_;
    LinearDispatch linear_;
};

// Scope of one op, timed when profiling and outermost (ops called by other ops count to their caller).
class OpTimer {
public:
    OpTimer(CudaBackend& b, const char* name);
    ~OpTimer();
    OpTimer(const OpTimer&) = delete;
    OpTimer& operator=(const OpTimer&) = delete;

private:
    CudaBackend& b_;
    bool record_ = false;
    size_t index_ = 0;
};

}  // namespace peregrine::cuda
