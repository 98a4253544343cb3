// DeepSeek-V4 (model_type deepseek_v4, DeepseekV4ForCausalLM): every compressing layer owns its compressor (ratio 4
// with two overlapping windows and a learned position bias: CSA, with an indexer whose own compressor makes
// Hadamard-rotated keys; ratio 128: HCA, attending to every entry), hash-routed first layers, unweighted per-head
// query norms, mHC collapsing each sublayer with its own mix and a learned head mix, MTP layers. config.json's keys
// are flat; blocks of 128 for weights and activations.
#include "io/config_reader.h"
#include "model/variant.h"
#include "model/weight_loader.h"
#include "util/error.h"

#include <fmt/format.h>

namespace peregrine {

namespace {

class DeepseekV4 final : public ModelVariant {
public:
    ModelArch arch() const override { return ModelArch::DeepseekV4; }
    const char* model_type() const override { return "deepseek_v4"; }
    const char* name() const override { return "DeepSeek-V4"; }
    const char* draft_name() const override { return "MTP layers"; }

    ModelConfig read_config(const nlohmann::json& j, const std::string& path) const override {
        ModelConfig c;
        c.arch = arch();
        c.model_type = model_type();
        ConfigReader r{j, path};
        c.weight_block = 128;
        c.act_block = 128;
        read_shared_config(r, c);
        c.n_hash_layers = r.get<int>("num_hash_layers", 0);
        if (j.contains("quantization_config")) read_quantization_config(j["quantization_config"], path, c);
        std::string expert_dtype = r.get<std::string>("expert_dtype", "fp4");
        if (expert_dtype != "fp4") fail("'{}': unsupported expert_dtype '{}' (expected fp4)", path, expert_dtype);
        validate_shared_config(c, path);
        if (c.n_hash_layers < 0 || c.n_hash_layers > c.n_layers)
            fail("'{}': invalid model configuration: num_hash_layers must be within [0, num_hidden_layers]", path);
        if (c.n_mtp_layers > 1)  // the release has one; drafts past the first reuse it
            fail("'{}': num_nextn_predict_layers {}: DeepSeek-V4 drafts with one MTP layer", path, c.n_mtp_layers);
        if (c.n_mtp_layers > 0 && c.ratio(c.n_layers) != 0)
            fail("'{}': invalid model configuration: the MTP layer attends to its window only (ratio 0)", path);
        return c;
    }

    nlohmann::json config_json(const ModelConfig& c) const override {
        nlohmann::json j = shared_config_json(c);
        j["architectures"] = {"DeepseekV4ForCausalLM"};
        j["model_type"] = model_type();
        j["num_hash_layers"] = c.n_hash_layers;
        j["expert_dtype"] = "fp4";
        j["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                    {"scale_fmt", "ue8m0"}, {"weight_block_size", {c.weight_block, c.weight_block}}};
        j["rope_scaling"]["type"] = "yarn";
        j["torch_dtype"] = "bfloat16";
        return j;
    }

    ModelFormat format(const ModelConfig& c) const override {
        ModelFormat f;
        f.single_pass_mhc = false;
        f.query_head_norm = true;
        f.index_rotation = true;
        f.sorted_selection = false;
        f.ring_before_full = false;
        f.yarn_ramp = YarnRamp::kWidenEmpty;
        f.route_norm = c.score_func != "softmax" ? RouteNorm::kSum : RouteNorm::kNone;
        return f;
    }

    std::vector<AttentionLayerInfo> layer_roles(const ModelConfig& c) const override {
        std::vector<AttentionLayerInfo> out;
        for (int l = 0; l < c.n_layers; ++l) {
            AttentionLayerInfo a;
            a.layer = l;
            a.ratio = c.ratio(l);
            a.yarn = a.ratio > 0 && c.original_seq_len > 0;
            a.rope_theta = a.ratio > 0 ? c.compress_rope_theta : c.rope_theta;
            if (a.ratio > 0) {
                a.compresses = true;
                a.comp_source = l;
                a.has_indexer = a.ratio == 4;
                a.index_compressor = a.has_indexer;
                a.index_k_source = a.has_indexer ? l : -1;
                a.attend_all_compressed = !a.has_indexer;
            }
            out.push_back(a);
        }
        return out;
    }

    // Window K=V and compressed latents: e4m3 over the non-RoPE dims (blocks of 64), the RoPE dims bf16; indexer
    // keys: e2m1 under ue8m0 scales (blocks of 32). Ratio-4 compressors carry two windows.
    StateSpec state_spec(const ModelConfig& c) const override {
        const int D = c.head_dim, rd = c.rope_head_dim, ihd = c.index_head_dim;
        const EntryFormat latent = fp8_entry_format(D, D - rd, 64);
        StateSpec spec;
        spec.window_tokens = c.window_size;
        for (const AttentionLayerInfo& a : layer_roles(c)) {
            LayerStateSpec L;
            L.window = {latent, 1};
            if (a.compresses) {
                L.comp = {latent, a.ratio};
                const int coff = a.ratio == 4 ? 2 : 1;
                if (a.ratio > 1) L.carry_floats = int64_t{coff} * a.ratio * coff * D;
                if (a.has_indexer) L.index_carry_floats = int64_t{coff} * a.ratio * coff * ihd;
            }
            if (a.has_indexer) L.index_k = {fp4_entry_format(ihd, 32, false), a.ratio};
            spec.layers.push_back(L);
        }
        if (c.n_mtp_layers > 0) {  // the MTP layer's window, and the hidden state its next entry reads
            LayerStateSpec L;
            L.window = {latent, 1};
            spec.layers.push_back(L);
            spec.hidden_floats = int64_t{c.hc_mult} * c.dim;
        }
        return spec;
    }

    ModelWeights load_weights(WeightLoader& L) const override {
        const ModelConfig& c = L.config();
        const int D = c.dim, HD = c.head_dim, hc = c.hc_mult;
        ModelWeights m;
        m.embed = L.tensor("embed.weight", DType::BF16, {c.vocab_size, D});
        m.norm = L.param("norm.weight", {D});
        m.head = L.dense("head", c.vocab_size, D, LinearWeight::Kind::F32);
        m.hc_head = load_hc(L, "", "head", hc, hc * D);
        for (int l = 0; l < c.n_layers; ++l) {
            const std::string p = fmt::format("layers.{}.", l), ap = p + "attn.";
            BlockWeight b = load_block_core(L, p, c.n_routed_experts, c.n_activated_experts, l < c.n_hash_layers);
            const int ratio = c.ratio(l);
            if (ratio > 0) {
                b.attn.compressor = load_compressor(L, ap + "compressor.", ratio, HD, ratio == 4, true);
                if (ratio == 4) {
                    IndexerWeight ix = load_indexer(L, ap + "indexer.");
                    ix.compressor = load_compressor(L, ap + "indexer.compressor.", ratio, ix.head_dim, true, true);
                    b.attn.indexer = ix;
                }
            }
            m.layers.push_back(std::move(b));
        }
        if (c.n_mtp_layers > 0) {
            const std::string p = "mtp.0.";
            MtpWeight t;
            t.block = load_block_core(L, p, c.n_routed_experts, c.n_activated_experts, false);
            t.e_proj = L.fp8(p + "e_proj", D, D);
            t.h_proj = L.fp8(p + "h_proj", D, D);
            t.enorm = L.param(p + "enorm.weight", {D});
            t.hnorm = L.param(p + "hnorm.weight", {D});
            t.norm = L.param(p + "norm.weight", {D});
            t.hc_head = load_hc(L, p, "head", hc, hc * D);
            m.mtp = std::move(t);
        }
        return m;
    }
};

}  // namespace

const ModelVariant& deepseek_v4_variant() {
    static const DeepseekV4 v;
    return v;
}

}  // namespace peregrine
