#include "io/model_config.h"
#include "util/error.h"
#include "util/file.h"

#include <algorithm>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace peregrine {

using json = nlohmann::json;

namespace {

// Reads keys with a path prefix for messages; missing required keys name the file.
struct Reader {
    const json& j;
    const std::string& path;

    bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
    template <typename T>
    T get(const char* k) const {
        if (!has(k)) fail("'{}' lacks the required key '{}'", path, k);
        try {
            return j[k].get<T>();
        } catch (const json::exception& e) {
            fail("'{}': key '{}' has the wrong type: {}", path, k, e.what());
        }
    }
    template <typename T>
    T get(const char* k, T dflt) const {
        return has(k) ? get<T>(k) : dflt;
    }
};

void read_common(const Reader& r, ModelConfig& c) {
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
        Reader rs{r.j["rope_scaling"], r.path};
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

void read_quantization(const json& q, const std::string& path, ModelConfig& c) {
    Reader r{q, path};
    std::string method = r.get<std::string>("quant_method", "fp8");
    if (method != "fp8") fail("'{}': unsupported quant_method '{}' (expected fp8)", path, method);
    auto blk = r.get<std::vector<int>>("weight_block_size", {c.weight_block, c.weight_block});
    if (blk.size() != 2 || blk[0] != blk[1] || (blk[0] != 32 && blk[0] != 128))
        fail("'{}': unsupported weight_block_size (expected [32,32] or [128,128])", path);
    c.weight_block = blk[0];
    std::string scale_fmt = r.get<std::string>("scale_fmt", "ue8m0");
    if (scale_fmt != "ue8m0") fail("'{}': unsupported scale_fmt '{}' (expected ue8m0)", path, scale_fmt);
}

void validate(const ModelConfig& c, const std::string& path) {
    auto need = [&](bool ok, const char* what) {
        if (!ok) fail("'{}': invalid model configuration: {}", path, what);
    };
    need(c.vocab_size > 0 && c.dim > 0 && c.n_layers > 0 && c.n_heads > 0, "sizes must be positive");
    need(static_cast<int>(c.compress_ratios.size()) >= c.n_layers + c.n_mtp_layers,
         "compress_ratios needs one entry per layer (MTP/DSpark stages included)");
    need(c.head_dim > c.rope_head_dim && c.rope_head_dim % 2 == 0, "head_dim/qk_rope_head_dim");
    need(c.o_groups > 0 && c.n_heads % c.o_groups == 0, "num_attention_heads must divide into o_groups");
    need(c.n_activated_experts > 0 && c.n_activated_experts <= c.n_routed_experts, "num_experts_per_tok");
    need(c.score_func == "sqrtsoftplus" || c.score_func == "softmax" || c.score_func == "sigmoid", "scoring_func");
    need(c.dim % c.act_block == 0, "hidden_size must be a multiple of the activation quantisation block");
    need(c.hc_mult > 0, "hc_mult");
    if (c.is_v41()) {
        for (int l : c.kv_source_layers) need(l >= 0 && l < c.n_layers, "kv_source_layer_ids out of range");
        for (int l : c.index_source_layers) need(l >= 0 && l < c.n_layers, "index_source_layer_ids out of range");
        need(c.engram_layer_ids.size() == c.engram_num_embeddings.size(), "engram_num_embeddings per engram layer");
    }
}

}  // namespace

bool ModelConfig::is_engram_layer(int layer) const {
    return std::find(engram_layer_ids.begin(), engram_layer_ids.end(), layer) != engram_layer_ids.end();
}

std::string ModelConfig::describe() const {
    return fmt::format("{} ({}): {} layers + {} {} stages, hidden {}, {} heads x {}, {} experts top-{}, vocab {}",
                       is_v41() ? "DeepSeek-V4.1" : "DeepSeek-V4", model_type, n_layers, n_mtp_layers,
                       is_v41() ? "DSpark" : "MTP", dim, n_heads, head_dim, n_routed_experts, n_activated_experts,
                       vocab_size);
}

ModelConfig parse_model_config(const std::string& text, const std::string& path) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        fail("'{}' is not valid JSON: {}", path, e.what());
    }
    if (!j.is_object()) fail("'{}' is not a JSON object", path);
    std::string model_type = j.value("model_type", "");
    std::string archs;
    if (j.contains("architectures") && j["architectures"].is_array())
        for (auto& a : j["architectures"]) archs += (archs.empty() ? "" : ",") + a.get<std::string>();

    ModelConfig c;
    c.model_type = model_type;
    if (model_type == "deepseek_v41") {
        c.arch = ModelArch::DeepseekV41;
        if (!j.contains("text_config")) fail("'{}': model_type deepseek_v41 without text_config", path);
        const json& t = j["text_config"];
        Reader r{t, path};
        c.weight_block = 32;
        c.act_block = 32;
        read_common(r, c);
        c.kv_source_layers = r.get<std::vector<int>>("kv_source_layer_ids");
        c.index_source_layers = r.get<std::vector<int>>("index_source_layer_ids");
        c.candidate_source_layer = r.get<int>("candidate_source_layer_id", -1);
        c.candidate_topk_blocks = r.get<int>("candidate_topk_blocks", 0);
        c.candidate_block_size = r.get<int>("candidate_block_size", 1);
        c.engram_layer_ids = r.get<std::vector<int>>("engram_layer_ids", {});
        c.engram_num_embeddings = r.get<std::vector<int64_t>>("engram_num_embeddings", {});
        c.engram_max_ngram_size = r.get<int>("engram_max_ngram_size", 0);
        c.engram_n_heads = r.get<int>("engram_n_heads", 0);
        c.engram_head_dim = r.get<int>("engram_head_dim", 0);
        c.engram_vocab_size = r.get<int64_t>("engram_vocab_size", 0);
        c.engram_pad_id = r.get<int>("engram_pad_token_id", 2);
        c.engram_compressed_vocab_size = r.get<int>("engram_compressed_vocab_size", 0);
        c.dspark_block_size = r.get<int>("dspark_block_size", 0);
        c.dspark_noise_token_id = r.get<int>("dspark_noise_token_id", 0);
        c.dspark_target_layer_ids = r.get<std::vector<int>>("dspark_target_layer_ids", {});
        c.dspark_markov_rank = r.get<int>("dspark_markov_rank", 0);
        c.dspark_n_routed_experts = r.get<int>("dspark_n_routed_experts", 0);
        c.dspark_n_activated_experts = r.get<int>("dspark_num_experts_per_tok", 0);
        c.image_token_id = j.value("image_token_id", -1);
        if (j.contains("quantization_config")) read_quantization(j["quantization_config"], path, c);
        if (t.contains("bos_token_id") || j.contains("bos_token_id"))
            c.bos_token_id = t.value("bos_token_id", j.value("bos_token_id", 0));
    } else if (model_type == "deepseek_v4") {
        c.arch = ModelArch::DeepseekV4;
        Reader r{j, path};
        c.weight_block = 128;
        c.act_block = 128;
        read_common(r, c);
        c.n_hash_layers = r.get<int>("num_hash_layers", 0);
        if (j.contains("quantization_config")) read_quantization(j["quantization_config"], path, c);
        std::string expert_dtype = r.get<std::string>("expert_dtype", "fp4");
        if (expert_dtype != "fp4") fail("'{}': unsupported expert_dtype '{}' (expected fp4)", path, expert_dtype);
    } else {
        fail("'{}': unsupported architecture (model_type '{}', architectures '{}'); Peregrine serves deepseek_v41 "
             "(DeepseekV41ForCausalLM) and deepseek_v4 (DeepseekV4ForCausalLM)",
             path, model_type, archs);
    }
    validate(c, path);
    return c;
}

ModelConfig load_model_config(const std::string& model_dir) {
    std::string path = model_dir + "/config.json";
    if (!file_exists(path)) fail("no config.json in '{}'", model_dir);
    return parse_model_config(read_file(path), path);
}

}  // namespace peregrine
