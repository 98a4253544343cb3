#pragma once
// The CUDA backend's device copies of a model's parameters, made on first use and kept for the backend's life:
// stored bytes as they are, small parameters as floats, lookup tables, the routed experts' pointer tables, RoPE
// frequencies, and the Engram tables (in device memory, or in pinned host memory the GPU reads over the bus).
#include "io/model_config.h"
#include "ops/backend.h"
#include "ops/cuda/kernels.h"

#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace peregrine::cuda {

enum class EngramPlacement { Device, Host };

// A MoE layer's routed experts as device tables of weight and scale pointers.
struct ExpertTables {
    std::shared_ptr<void> keep;
    ExpertTable w1, w2, w3;
    const ExpertWeight* first = nullptr;  // the first expert held (formats and shapes)
    bool aligned16 = false;  // every weight and scale array 16-byte aligned (vector and cp.async loads)
};

class WeightCache {
public:
    WeightCache(const ModelConfig& cfg, const ModelFormat& format, EngramPlacement engram)
        : cfg_(cfg), format_(format), engram_(engram) {}
    WeightCache(const WeightCache&) = delete;
    WeightCache& operator=(const WeightCache&) = delete;

    // The stored bytes (a tensor already on the device is its own copy).
    const void* raw(const Tensor& t);
    // A BF16/F32 parameter as floats.
    const float* f32(const Tensor& t);
    // Host tables of int64 / int32 values, keyed by their address.
    const int64_t* i64(const int64_t* host, size_t n);
    const int32_t* i32(const std::vector<int32_t>& host);
    // A linear's device view: its format, shapes and stored weights and scales.
    LinearDev linear(const LinearWeight& w);
    // The layer's routed experts (those this rank holds; the others are null, never routed to here).
    const ExpertTables& experts(const MoEWeight& w);
    // RoPE frequencies of an attention layer (its theta, YaRN or not).
    const float* rope(const AttentionLayerInfo& info);
    // An Engram layer's table and scales where its placement puts them, and q_weight * k_weight as floats.
    std::pair<const uint8_t*, const uint8_t*> engram_table(const EngramWeight& w);
    const float* engram_gate(const EngramWeight& w);
    // The pointer table of G groups of a grouped weight [G * R, GD] (wo_a as a routed GEMM's experts).
    const void* const* group_table(const uint16_t* w, int G, int R, int GD);
    // Device copies made so far.
    size_t entries() const {
        return raw_.size() + f32_.size() + tables_.size() + engram_gate_.size() + groups_.size() + experts_.size() +
               ropes_.size();
    }

private:
    ModelConfig cfg_;
    ModelFormat format_;
    EngramPlacement engram_;
    std::unordered_map<const void*, std::shared_ptr<void>> raw_, f32_, tables_, engram_gate_, groups_;
    std::unordered_map<const void*, ExpertTables> experts_;
    std::map<std::pair<double, bool>, std::shared_ptr<void>> ropes_;
};

}  // namespace peregrine::cuda
