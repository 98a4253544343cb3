#pragma once
// The model's hyper-parameters, as a release's config.json gives them (the keys every release shares are read by
// config_reader.h; each model variant reads its own and its defaults: src/model/, a file per variant).
#include <cstdint>
#include <string>
#include <vector>

namespace peregrine {

enum class ModelArch { DeepseekV41, DeepseekV4 };

struct ModelConfig {
    ModelArch arch = ModelArch::DeepseekV41;
    std::string model_type;

    int vocab_size = 0;
    int dim = 0;
    int n_layers = 0;       // backbone layers
    int n_mtp_layers = 0;   // DSpark stages (V4.1) or MTP layers (V4)
    int n_heads = 0;
    int head_dim = 0;
    int rope_head_dim = 0;
    int q_lora_rank = 0;
    int o_groups = 0;
    int o_lora_rank = 0;
    int window_size = 0;
    std::vector<int> compress_ratios;  // per layer, MTP/DSpark stages included

    // V4.1 cross-layer sharing and the two-level indexer
    std::vector<int> kv_source_layers;
    std::vector<int> index_source_layers;
    int candidate_source_layer = -1;
    int candidate_topk_blocks = 0;
    int candidate_block_size = 0;

    int index_n_heads = 0;
    int index_head_dim = 0;
    int index_topk = 0;

    double rope_theta = 10000.0;
    double compress_rope_theta = 160000.0;
    int original_seq_len = 0;  // YaRN: original_max_position_embeddings (0 = off)
    double rope_factor = 1.0;
    double beta_fast = 32.0;
    double beta_slow = 1.0;
    double norm_eps = 1e-6;

    int n_routed_experts = 0;
    int n_activated_experts = 0;
    int n_shared_experts = 0;
    int moe_inter_dim = 0;
    std::string score_func = "sqrtsoftplus";
    double route_scale = 1.0;
    double swiglu_limit = 0.0;
    bool norm_topk_prob = true;
    int n_hash_layers = 0;  // V4: the first layers route by token id

    int hc_mult = 4;
    int hc_sinkhorn_iters = 20;
    double hc_eps = 1e-6;

    // Engram (V4.1)
    std::vector<int> engram_layer_ids;
    std::vector<int64_t> engram_num_embeddings;
    int engram_max_ngram_size = 0;
    int engram_n_heads = 0;
    int engram_head_dim = 0;
    int64_t engram_vocab_size = 0;
    int engram_pad_id = 2;
    int engram_compressed_vocab_size = 0;

    // DSpark (V4.1)
    int dspark_block_size = 0;
    int dspark_noise_token_id = 0;
    std::vector<int> dspark_target_layer_ids;
    int dspark_markov_rank = 0;
    int dspark_n_routed_experts = 0;
    int dspark_n_activated_experts = 0;

    // Quantisation
    int weight_block = 32;  // fp8 weight scale tile (32x32 in V4.1, 128x128 in V4)
    int act_block = 32;     // activation quantisation block before fp8/fp4 GEMMs
    bool fp4_experts = true;

    int max_position_embeddings = 0;
    int bos_token_id = 0;
    int eos_token_id = 1;
    int image_token_id = -1;

    int total_layers() const { return n_layers + n_mtp_layers; }
    int ratio(int layer) const { return compress_ratios.at(static_cast<size_t>(layer)); }
    bool is_engram_layer(int layer) const;
    // Field by field: a config.json written for a configuration must read back as exactly it.
    bool operator==(const ModelConfig&) const = default;
};

}  // namespace peregrine
