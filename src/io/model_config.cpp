#include "io/config_reader.h"
#include "util/error.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace peregrine {

void ConfigReader::fail_missing(const char* k) const { fail("'{}' lacks the required key '{}'", path, k); }
void ConfigReader::fail_type(const char* k, const char* what) const {
    fail("'{}': key '{}' has the wrong type: {}", path, k, what);
}

void read_shared_config(const ConfigReader& r, ModelConfig& c) {
    c.vocab_size = r.get<int>("vocab_size");
    c.dim = r.get<int>("hidden_size");
    c.n_layers = r.get<int>("num_hidden_layers");
    c.n_mtp_layers = r.get<int>("num_nextn_predict_layers", 0);
    c.n_heads = r.get<int>("num_attention_heads");
    c.head_dim = r.get<int>("head_dim");
    c.rope_head_dim = r.get<int>("qk_rope_head_dim");
    c.q_lora_rank = r.get<int>("q_lora_rank");
    c.o_groups = r.get<int>("o_groups");
    c.o_lora_rank = r.get<int>("o_lora_rank");
    c.window_size = r.get<int>("sliding_window");
    c.compress_ratios = r.get<std::vector<int>>("compress_ratios");
    c.index_n_heads = r.get<int>("index_n_heads");
    c.index_head_dim = r.get<int>("index_head_dim");
    c.index_topk = r.get<int>("index_topk");
    c.rope_theta = r.get<double>("rope_theta", 10000.0);
    c.compress_rope_theta = r.get<double>("compress_rope_theta", 160000.0);
    if (r.has("rope_scaling")) {
        ConfigReader rs{r.j["rope_scaling"], r.path};
        c.rope_factor = rs.get<double>("factor", 1.0);
        c.beta_fast = rs.get<double>("beta_fast", 32.0);
        c.beta_slow = rs.get<double>("beta_slow", 1.0);
        c.original_seq_len = rs.get<int>("original_max_position_embeddings", 0);
    }
    c.norm_eps = r.get<double>("rms_norm_eps");
    c.n_routed_experts = r.get<int>("n_routed_experts");
    c.n_activated_experts = r.get<int>("num_experts_per_tok");
    c.n_shared_experts = r.get<int>("n_shared_experts", 1);
    c.moe_inter_dim = r.get<int>("moe_intermediate_size");
    c.score_func = r.get<std::string>("scoring_func", "sqrtsoftplus");
    c.route_scale = r.get<double>("routed_scaling_factor", 1.0);
    c.swiglu_limit = r.get<double>("swiglu_limit", 0.0);
    c.norm_topk_prob = r.get<bool>("norm_topk_prob", true);
    c.hc_mult = r.get<int>("hc_mult", 4);
    c.hc_sinkhorn_iters = r.get<int>("hc_sinkhorn_iters", 20);
    c.hc_eps = r.get<double>("hc_eps", 1e-6);
    c.max_position_embeddings = r.get<int>("max_position_embeddings", 0);
    c.bos_token_id = r.get<int>("bos_token_id", 0);
    c.eos_token_id = r.get<int>("eos_token_id", 1);
}

nlohmann::json shared_config_json(const ModelConfig& c) {
    nlohmann::json j;
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.dim;
    j["num_hidden_layers"] = c.n_layers;
    j["num_nextn_predict_layers"] = c.n_mtp_layers;
    j["num_attention_heads"] = c.n_heads;
    j["num_key_value_heads"] = 1;
    j["head_dim"] = c.head_dim;
    j["qk_rope_head_dim"] = c.rope_head_dim;
    j["q_lora_rank"] = c.q_lora_rank;
    j["o_groups"] = c.o_groups;
    j["o_lora_rank"] = c.o_lora_rank;
    j["sliding_window"] = c.window_size;
    j["compress_ratios"] = c.compress_ratios;
    j["index_n_heads"] = c.index_n_heads;
    j["index_head_dim"] = c.index_head_dim;
    j["index_topk"] = c.index_topk;
    j["rope_theta"] = c.rope_theta;
    j["compress_rope_theta"] = c.compress_rope_theta;
    j["rope_scaling"] = {{"factor", c.rope_factor},
                         {"beta_fast", c.beta_fast},
                         {"beta_slow", c.beta_slow},
                         {"original_max_position_embeddings", c.original_seq_len}};
    j["rms_norm_eps"] = c.norm_eps;
    j["n_routed_experts"] = c.n_routed_experts;
    j["num_experts_per_tok"] = c.n_activated_experts;
    j["n_shared_experts"] = c.n_shared_experts;
    j["moe_intermediate_size"] = c.moe_inter_dim;
    j["scoring_func"] = c.score_func;
    j["topk_method"] = "noaux_tc";
    j["routed_scaling_factor"] = c.route_scale;
    j["swiglu_limit"] = c.swiglu_limit;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["hc_mult"] = c.hc_mult;
    j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
    j["hc_eps"] = c.hc_eps;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["bos_token_id"] = c.bos_token_id;
    j["eos_token_id"] = c.eos_token_id;
    j["hidden_act"] = "silu";
    j["tie_word_embeddings"] = false;
    return j;
}

void read_quantization_config(const nlohmann::json& q, const std::string& path, ModelConfig& c) {
    ConfigReader r{q, path};
    std::string method = r.get<std::string>("quant_method", "fp8");
    if (method != "fp8") fail("'{}': unsupported quant_method '{}' (expected fp8)", path, method);
    auto blk = r.get<std::vector<int>>("weight_block_size", {c.weight_block, c.weight_block});
    if (blk.size() != 2 || blk[0] != blk[1] || (blk[0] != 32 && blk[0] != 128))
        fail("'{}': unsupported weight_block_size (expected [32,32] or [128,128])", path);
    c.weight_block = blk[0];
    std::string scale_fmt = r.get<std::string>("scale_fmt", "ue8m0");
    if (scale_fmt != "ue8m0") fail("'{}': unsupported scale_fmt '{}' (expected ue8m0)", path, scale_fmt);
}

void validate_shared_config(const ModelConfig& c, const std::string& path) {
    auto need = [&](bool ok, const char* what) {
        if (!ok) fail("'{}': invalid model configuration: {}", path, what);
    };
    auto positive = [](double v) { return std::isfinite(v) && v > 0.0; };
    need(c.vocab_size > 0 && c.dim > 0 && c.n_layers > 0 && c.n_heads > 0, "sizes must be positive");
    // Upper bounds far above any release, so that products of sizes stay within int.
    need(c.vocab_size <= (1 << 21), "vocab_size must be at most 2^21");
    need(c.dim <= (1 << 15), "hidden_size must be at most 2^15");
    need(c.n_layers <= 512 && c.n_heads <= 512, "num_hidden_layers and num_attention_heads must be at most 512");
    need(c.q_lora_rank <= (1 << 15) && c.o_lora_rank <= (1 << 15), "q_lora_rank and o_lora_rank must be at most 2^15");
    need(c.moe_inter_dim <= (1 << 15), "moe_intermediate_size must be at most 2^15");
    need(c.n_routed_experts <= (1 << 13) && c.n_shared_experts <= 64,
         "n_routed_experts must be at most 2^13 and n_shared_experts at most 64");
    need(c.index_n_heads <= 512 && c.index_head_dim <= 4096 && c.index_topk <= (1 << 20),
         "index_n_heads (at most 512), index_head_dim (4096) and index_topk (2^20)");
    need(c.n_mtp_layers >= 0 && c.n_mtp_layers <= 16, "num_nextn_predict_layers must be within [0, 16]");
    need(static_cast<int>(c.compress_ratios.size()) >= c.n_layers + c.n_mtp_layers,
         "compress_ratios needs one entry per layer (MTP/DSpark stages included)");
    for (int r : c.compress_ratios) need(r >= 0 && r <= (1 << 20), "compress_ratios entries must be within [0, 2^20]");
    need(c.head_dim > c.rope_head_dim && c.rope_head_dim % 2 == 0 && c.head_dim <= 4096, "head_dim/qk_rope_head_dim");
    need(c.q_lora_rank > 0 && c.o_lora_rank > 0, "q_lora_rank and o_lora_rank must be positive");
    need(c.o_groups > 0 && c.n_heads % c.o_groups == 0, "num_attention_heads must divide into o_groups");
    need(c.window_size > 0 && c.window_size <= (1 << 20), "sliding_window must be within [1, 2^20]");
    const bool compressed =
        std::any_of(c.compress_ratios.begin(), c.compress_ratios.end(), [](int r) { return r > 0; });
    if (compressed) {
        need(c.index_topk > 0, "index_topk must be positive");
        need(c.index_n_heads > 0 && c.index_head_dim > 0 && (c.index_head_dim & (c.index_head_dim - 1)) == 0,
             "index_n_heads must be positive and index_head_dim a power of two");
    }
    need(c.moe_inter_dim > 0 && c.n_shared_experts >= 0, "moe_intermediate_size and n_shared_experts");
    need(c.n_activated_experts > 0 && c.n_activated_experts <= c.n_routed_experts, "num_experts_per_tok");
    need(c.score_func == "sqrtsoftplus" || c.score_func == "softmax" || c.score_func == "sigmoid", "scoring_func");
    need(positive(c.route_scale), "routed_scaling_factor must be positive");
    need(std::isfinite(c.swiglu_limit) && c.swiglu_limit >= 0.0, "swiglu_limit must be finite and not negative");
    need(c.dim % c.act_block == 0, "hidden_size must be a multiple of the activation quantisation block");
    need(positive(c.norm_eps) && c.norm_eps < 1.0, "rms_norm_eps must be within (0, 1)");
    need(positive(c.rope_theta) && positive(c.compress_rope_theta),
         "rope_theta and compress_rope_theta must be positive");
    need(positive(c.rope_factor) && positive(c.beta_fast) && positive(c.beta_slow) && c.original_seq_len >= 0,
         "rope_scaling: factor, beta_fast and beta_slow must be positive");
    need(c.hc_mult > 0 && c.hc_mult <= 16, "hc_mult must be within [1, 16]");
    need(c.hc_sinkhorn_iters > 0 && c.hc_sinkhorn_iters <= 1000, "hc_sinkhorn_iters must be within [1, 1000]");
    need(std::isfinite(c.hc_eps) && c.hc_eps >= 0.0, "hc_eps must be finite and not negative");
    need(c.max_position_embeddings >= 0, "max_position_embeddings must not be negative");
    need(c.bos_token_id >= 0 && c.bos_token_id < c.vocab_size && c.eos_token_id >= 0 && c.eos_token_id < c.vocab_size,
         "bos_token_id and eos_token_id must be ids of the vocabulary");
}

bool ModelConfig::is_engram_layer(int layer) const {
    return std::find(engram_layer_ids.begin(), engram_layer_ids.end(), layer) != engram_layer_ids.end();
}

}  // namespace peregrine
