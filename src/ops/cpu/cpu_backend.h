#pragma once
// The readable reference backend: plain loops over float arrays holding bf16 values, threaded with
// parallel_for. Its arithmetic follows DeepSeek's official inference code (see linear.h for GEMMs).
#include "ops/backend.h"
#include "ops/cpu/rope.h"

#include <map>

namespace peregrine::cpu {

struct CpuScratch : StepScratch {
    // Compressed-entry selection of the most recent index source, per row, in attention order (-1: none).
    std::vector<std::vector<int32_t>> topk;
    // Level-1 candidate mask of the candidate source, per row, over compressed positions.
    std::vector<std::vector<uint8_t>> candidates;
};

class CpuBackend : public Backend {
public:
    CpuBackend(const ModelConfig& cfg, const ModelFormat& format, const StateLayout& layout);
    std::string name() const override { return "cpu"; }

    std::unique_ptr<StepScratch> begin_step(const ForwardBatch& batch) override;
    std::unique_ptr<StepScratch> narrow_step(StepScratch& scratch, const std::vector<int>& rows) override;
    StateMemory& state_memory() override { return memory_; }
    DeviceSampler& sampler() override { return sampler_; }
    Tensor first_stream_mix(int T) override;
    Tensor gather_rows(const Tensor& x, const std::vector<int>& rows) override;
    Tensor embed(const Tensor& table, const std::vector<int32_t>& ids) override;
    void engram(Tensor& h, const EngramWeight& w, const std::vector<int64_t>& rows) override;
    HcMix hc_mixes(const Tensor& h, const HcWeight& w) override;
    Tensor hc_collapse(const Tensor& h, const Tensor& pre) override;
    Tensor hc_expand(const Tensor& y, const Tensor& residual, const HcMix& mix) override;
    Tensor hc_head(const Tensor& h, const HcWeight& w) override;
    Tensor rms_norm(const Tensor& x, const Tensor& w) override;
    Tensor hc_mean(const Tensor& h) override;
    Tensor attention(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info, ForwardBatch& batch,
                     StepScratch& scratch) override;
    Tensor moe(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids) override;
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

private:
    const Rope& rope_for(const AttentionLayerInfo& info);
    // q = wq_b(q_norm(wq_a(x))) per head (with the format's head norm), RoPE at each row's position.
    Tensor project_queries(const Tensor& x, const Tensor& qr, const AttentionWeight& w, const Rope& rope,
                           const std::vector<int64_t>& pos);
    // Window K=V rows: kv_norm(wkv(x)), RoPE, quantise-dequantise to the window entries' format.
    Tensor window_kv(const Tensor& x, const AttentionWeight& w, const Rope& rope, const std::vector<int64_t>& pos,
                     const EntryFormat& format);
    // Inverse RoPE of the attention output, grouped wo_a (bf16), wo_b.
    Tensor project_output(Tensor& o, const AttentionWeight& w, const Rope& rope, const std::vector<int64_t>& pos);
    float eps() const { return static_cast<float>(cfg_.norm_eps); }

    ModelConfig cfg_;
    StateLayout layout_;
    HostStateMemory memory_;
    HostSampler sampler_;
    std::map<std::pair<double, bool>, Rope> ropes_;
};

// RMSNorm of one row: w * x * rsqrt(mean(x^2) + eps), rounded to bf16.
void rms_norm_row(const float* x, const float* w, int n, float eps, float* out);
// Same with a bf16/f32 weight tensor.
void rms_norm_row(const float* x, const Tensor& w, int n, float eps, float* out);
// Normalised Walsh-Hadamard transform (natural order) scaled by n^-0.5, rounded to bf16.
void hadamard_bf16(float* x, int n);
// Indices of the k largest values, ties to the lower index, in descending order of value.
std::vector<int32_t> topk_desc(const float* v, int n, int k);
float tensor_value(const Tensor& t, int64_t i);  // element of a BF16/F32 tensor as float

}  // namespace peregrine::cpu
