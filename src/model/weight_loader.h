#pragma once
// Finds, validates and wraps checkpoint tensors (no copies, except wo_a, which the reference dequantises to bf16
// at load), or makes them up at sane magnitudes for synthetic models; and the blocks every release of the family
// shares, loaded from their names. The model variants (deepseek_v41.cpp, deepseek_v4.cpp) add what is theirs.
#include "io/model_config.h"
#include "io/safetensors.h"
#include "ops/weights.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace peregrine {

// One made-up tensor, enough to make it again on its own (synthetic_tensor).
struct SyntheticTensor {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    uint64_t seed = 0;
    size_t nbytes() const;
};

// The values of a synthetic tensor: deterministic in its seed (and, for hash routes, cfg's expert count).
Tensor synthetic_tensor(const ModelConfig& cfg, const SyntheticTensor& t);
// Every tensor synthetic_model_weights makes, in its order and with its seed, without making any
// (model_weights.cpp): a checkpoint of it can be written one tensor at a time.
std::vector<SyntheticTensor> synthetic_inventory(const ModelConfig& cfg, uint64_t seed);

class WeightLoader {
public:
    // Every tensor is checked for presence, dtype and shape before use; errors name the tensor and file.
    WeightLoader(const ModelConfig& cfg, const SafeTensors& st) : cfg_(cfg), st_(st) {}
    // Synthetic weights: every tensor is made up (released formats, deterministic in seed) instead of read.
    WeightLoader(const ModelConfig& cfg, uint64_t seed) : cfg_(cfg), st_(empty_), synthetic_(true), seed_(seed) {}
    // The synthetic tensors listed instead of made: each goes to `inventory` with its seed, and the weights
    // returned have shapes but no data.
    WeightLoader(const ModelConfig& cfg, uint64_t seed, std::vector<SyntheticTensor>* inventory)
        : cfg_(cfg), st_(empty_), synthetic_(true), seed_(seed), inventory_(inventory) {}

    Tensor tensor(const std::string& name, DType dtype, std::vector<int64_t> shape);
    // An engram table [rows, width]. A synthetic model's engram layers share one, made once at the config's largest
    // row count: the release's two (203 GB) fit neither one GPU nor the host memory of one GPU machine.
    Tensor engram_table(const std::string& name, DType dtype, int64_t rows, int64_t width);
    // A norm or small parameter stored as BF16 or F32.
    Tensor param(const std::string& name, std::vector<int64_t> shape);
    // Block-scaled e4m3 weights [out, in] with ue8m0 tile scales.
    LinearWeight fp8(const std::string& name, int out, int in);
    // Packed e2m1 weights [out, in / 2] with ue8m0 scales per 32 inputs.
    LinearWeight fp4(const std::string& name, int out, int in);
    LinearWeight dense(const std::string& name, int out, int in, LinearWeight::Kind kind);
    // An FP8 weight dequantised to a bf16 copy (wo_a: the reference runs that einsum in bf16).
    LinearWeight fp8_as_bf16(const std::string& name, int out, int in);
    const ModelConfig& config() const { return cfg_; }

private:
    Tensor synthetic(const std::string& name, DType dtype, std::vector<int64_t> shape);

    const ModelConfig& cfg_;
    SafeTensors empty_;
    const SafeTensors& st_;
    bool synthetic_ = false;
    uint64_t seed_ = 0;
    std::vector<SyntheticTensor>* inventory_ = nullptr;
    std::map<DType, Tensor> engram_tables_;  // synthetic: the one table and its scales
};

// The blocks every release has, under the prefix p ("layers.3.", "mtp.0.").
HcWeight load_hc(WeightLoader& L, const std::string& p, const std::string& site, int n_mix, int width);
// A compressor of `ratio` tokens into latents of head_dim; overlap: two windows (coff 2); ape: a learned position
// bias of the scores.
CompressorWeight load_compressor(WeightLoader& L, const std::string& p, int ratio, int head_dim, bool overlap,
                                 bool ape);
ExpertWeight load_expert(WeightLoader& L, const std::string& p, bool fp4);
// Norms, mHC, the attention projections and the MoE of one block (what every layer and draft stage has); hash:
// routed by token id (gate.tid2eid) instead of a gate bias.
BlockWeight load_block_core(WeightLoader& L, const std::string& p, int n_experts, int top_k, bool hash);
// The indexer's query projection and head weights.
IndexerWeight load_indexer(WeightLoader& L, const std::string& p);
// Layer `layer`'s engram (its table is the index-th of engram_num_embeddings).
EngramWeight load_engram(WeightLoader& L, const std::string& p, size_t index);

}  // namespace peregrine
