// Synthetic models for benchmarks: a release's configuration cut to a few layers, weights made up.
#include "model/model.h"
#include "model/model_weights.h"
#include "util/error.h"

#include <algorithm>

namespace peregrine {

namespace {

// What V4-Flash and V4.1-Flash share: vocabulary, attention shapes, RoPE, routing, hyper-connections.
ModelConfig flash_family(int layers, int n_routed_experts) {
    ModelConfig c;
    c.vocab_size = 129280;
    c.n_layers = layers;
    c.n_heads = 64;
    c.head_dim = 512;
    c.rope_head_dim = 64;
    c.o_groups = 8;
    c.o_lora_rank = 1024;
    c.window_size = 128;
    c.index_head_dim = 128;
    c.index_topk = 512;
    c.rope_theta = 10000;
    c.compress_rope_theta = 160000;
    c.original_seq_len = 65536;
    c.rope_factor = 16;
    c.beta_fast = 32;
    c.beta_slow = 1;
    c.n_routed_experts = n_routed_experts;
    c.n_activated_experts = 6;
    c.n_shared_experts = 1;
    c.score_func = "sqrtsoftplus";
    c.route_scale = 1.5;
    c.swiglu_limit = 10.0;
    c.norm_topk_prob = true;
    c.hc_mult = 4;
    c.hc_sinkhorn_iters = 20;
    c.hc_eps = 1e-6;
    c.fp4_experts = true;
    c.max_position_embeddings = 1048576;
    return c;
}

}  // namespace

ModelConfig synthetic_v41_flash_config(int layers, int n_routed_experts) {
    PEREGRINE_CHECK(layers >= 1 && layers <= 40, "synthetic V4.1-Flash: 1..40 layers, not {}", layers);
    PEREGRINE_CHECK(n_routed_experts >= 6, "synthetic V4.1-Flash: at least 6 routed experts (top-6 routing)");
    ModelConfig c = flash_family(layers, n_routed_experts);
    c.arch = ModelArch::DeepseekV41;
    c.model_type = "deepseek_v41";
    c.dim = 5120;
    c.q_lora_rank = 1280;
    c.index_n_heads = 32;
    c.candidate_topk_blocks = 2048;
    c.candidate_block_size = 8;
    c.norm_eps = 1e-20;
    c.moe_inter_dim = 2304;
    c.weight_block = 32;
    c.act_block = 32;
    if (layers > 20) {  // the release's layout over its first layers: the last KV source (20) among them
        for (int l = 0; l < layers; ++l) {
            c.compress_ratios.push_back(l < 2 ? 0 : l < 20 ? 2 : 1);
            if (l >= 2 && l <= 20 && (l - 2) % 6 == 0) c.kv_source_layers.push_back(l);
            if ((l >= 2 && l <= 20 && (l - 2) % 6 == 0) || (l > 20 && l % 4 == 0 && l < 40))
                c.index_source_layers.push_back(l);
        }
        c.candidate_source_layer = 20;
        return c;
    }
    for (int l = 0; l < layers; ++l) {
        const int ratio = l == 0 ? 0 : l <= 2 ? 2 : 1;
        c.compress_ratios.push_back(ratio);
        if (l == 1 || l == 3) c.kv_source_layers.push_back(l);
        if (l == 1 || l == 3 || (l >= 5 && (l - 5) % 4 == 0)) c.index_source_layers.push_back(l);
    }
    c.candidate_source_layer = layers > 3 ? 3 : -1;
    return c;
}

ModelConfig synthetic_v4_flash_config(int layers, int n_routed_experts) {
    PEREGRINE_CHECK(layers >= 1 && layers <= 43, "synthetic V4-Flash: 1..43 layers, not {}", layers);
    PEREGRINE_CHECK(n_routed_experts >= 6, "synthetic V4-Flash: at least 6 routed experts (top-6 routing)");
    ModelConfig c = flash_family(layers, n_routed_experts);
    c.arch = ModelArch::DeepseekV4;
    c.model_type = "deepseek_v4";
    c.dim = 4096;
    c.q_lora_rank = 1024;
    c.index_n_heads = 64;
    c.norm_eps = 1e-6;
    c.moe_inter_dim = 2048;
    c.n_hash_layers = std::min(layers, 3);
    c.weight_block = 128;
    c.act_block = 128;
    for (int l = 0; l < layers; ++l) c.compress_ratios.push_back(l < 2 ? 0 : l % 2 == 0 ? 4 : 128);
    return c;
}

void add_synthetic_engram(ModelConfig& c) {
    PEREGRINE_CHECK(c.arch == ModelArch::DeepseekV41, "engram layers are V4.1's");
    for (int l : {1, 14})
        if (l < c.n_layers) c.engram_layer_ids.push_back(l);
    PEREGRINE_CHECK(!c.engram_layer_ids.empty(), "V4.1-Flash's engram layers are 1 and 14: give at least 2 layers");
    c.engram_max_ngram_size = 4;
    c.engram_n_heads = 8;
    c.engram_head_dim = 256;
    c.engram_vocab_size = 16000000;
    c.engram_pad_id = 2;
    c.engram_compressed_vocab_size = 99092;
    c.engram_num_embeddings.clear();
    for (const auto& layer : engram_primes(c)) {  // the release's row counts follow from its primes
        int64_t rows = 0;
        for (int64_t p : layer) rows += p;
        c.engram_num_embeddings.push_back(rows);
    }
}

void add_synthetic_dspark(ModelConfig& c) {
    PEREGRINE_CHECK(c.arch == ModelArch::DeepseekV41, "the DSpark head is V4.1's");
    c.n_mtp_layers = 3;
    c.compress_ratios.resize(static_cast<size_t>(c.n_layers));
    c.compress_ratios.insert(c.compress_ratios.end(), 3, 0);  // the stages are window-only
    c.dspark_block_size = 5;
    c.dspark_noise_token_id = 128799;
    c.dspark_target_layer_ids.clear();
    for (int l = std::max(0, c.n_layers - 3); l < c.n_layers; ++l) c.dspark_target_layer_ids.push_back(l);
    c.dspark_markov_rank = 256;
    c.dspark_n_routed_experts = 128;
    c.dspark_n_activated_experts = 3;
}

ModelConfig synthetic_preset_config(const std::string& preset, int layers, int n_routed_experts) {
    if (preset == "v41-flash") return synthetic_v41_flash_config(layers, n_routed_experts ? n_routed_experts : 384);
    if (preset == "v4-flash") return synthetic_v4_flash_config(layers, n_routed_experts ? n_routed_experts : 256);
    fail("unknown synthetic preset '{}' (known: {})", preset, synthetic_presets());
}

std::unique_ptr<Model> Model::synthetic(const ModelConfig& cfg, const ModelOptions& opts, uint64_t seed) {
    std::unique_ptr<Model> m(new Model());
    m->dir_ = "<synthetic>";
    m->cfg_ = cfg;
    m->w_ = synthetic_model_weights(cfg, seed);
    if (!cfg.engram_layer_ids.empty()) m->engram_ = synthetic_engram_tables(cfg);
    m->set_up(opts);
    return m;
}

}  // namespace peregrine
