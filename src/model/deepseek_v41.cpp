// DeepSeek-V4.1 (model_type deepseek_v41, DeepseekV41ForCausalLM): cross-layer sharing of compressed KV (kv source
// layers compress, the layers after them attend to their entries) and of the indexer (index sources score,
// the layers after them reuse the selection; a kv source that is also an index source turns its latents into
// the indexer's keys), a two-level indexer over candidate blocks, Engram layers, single-pass mHC, and a DSpark
// draft head. config.json keeps the text model under text_config; blocks of 32 for weights and activations.
#include "io/config_reader.h"
#include "model/variant.h"
#include "model/weight_loader.h"
#include "util/error.h"

#include <algorithm>
#include <fmt/format.h>

namespace peregrine {

namespace {

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Largest element of v that is <= x, or -1.
int latest_at_or_before(const std::vector<int>& v, int x) {
    int best = -1;
    for (int e : v)
        if (e <= x) best = std::max(best, e);
    return best;
}

class DeepseekV41 final : public ModelVariant {
public:
    ModelArch arch() const override { return ModelArch::DeepseekV41; }
    const char* model_type() const override { return "deepseek_v41"; }
    const char* name() const override { return "DeepSeek-V4.1"; }
    const char* draft_name() const override { return "DSpark stages"; }

    ModelConfig read_config(const nlohmann::json& j, const std::string& path) const override {
        ModelConfig c;
        c.arch = arch();
        c.model_type = model_type();
        if (!j.contains("text_config") || !j["text_config"].is_object())
            fail("'{}': model_type deepseek_v41 without a text_config object", path);
        const nlohmann::json& t = j["text_config"];
        ConfigReader r{t, path};
        c.weight_block = 32;
        c.act_block = 32;
        read_shared_config(r, c);
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
        // Keys beside text_config go through the reader too (types and integer ranges checked).
        const ConfigReader top{j, path};
        c.image_token_id = top.get<int>("image_token_id", -1);
        if (j.contains("quantization_config")) read_quantization_config(j["quantization_config"], path, c);
        if (!r.has("bos_token_id")) c.bos_token_id = top.get<int>("bos_token_id", c.bos_token_id);
        validate_shared_config(c, path);
        validate(c, path);
        return c;
    }

    // The text model under text_config, as the release nests it; engram and DSpark keys only where the model has them.
    nlohmann::json config_json(const ModelConfig& c) const override {
        nlohmann::json t = shared_config_json(c);
        t["model_type"] = "deepseek_v41_text";
        t["rope_scaling"]["rope_type"] = "yarn";
        t["kv_source_layer_ids"] = c.kv_source_layers;
        t["index_source_layer_ids"] = c.index_source_layers;
        t["candidate_source_layer_id"] = c.candidate_source_layer;
        t["candidate_topk_blocks"] = c.candidate_topk_blocks;
        t["candidate_block_size"] = c.candidate_block_size;
        if (!c.engram_layer_ids.empty()) {
            t["engram_layer_ids"] = c.engram_layer_ids;
            t["engram_num_embeddings"] = c.engram_num_embeddings;
            t["engram_max_ngram_size"] = c.engram_max_ngram_size;
            t["engram_n_heads"] = c.engram_n_heads;
            t["engram_head_dim"] = c.engram_head_dim;
            t["engram_vocab_size"] = c.engram_vocab_size;
            t["engram_pad_token_id"] = c.engram_pad_id;
            t["engram_compressed_vocab_size"] = c.engram_compressed_vocab_size;
        }
        if (c.dspark_block_size > 0) {
            t["dspark_block_size"] = c.dspark_block_size;
            t["dspark_noise_token_id"] = c.dspark_noise_token_id;
            t["dspark_target_layer_ids"] = c.dspark_target_layer_ids;
            t["dspark_markov_rank"] = c.dspark_markov_rank;
            t["dspark_n_routed_experts"] = c.dspark_n_routed_experts;
            t["dspark_num_experts_per_tok"] = c.dspark_n_activated_experts;
        }
        nlohmann::json j;
        j["architectures"] = {"DeepseekV41ForCausalLM"};
        j["model_type"] = model_type();
        if (c.image_token_id >= 0) j["image_token_id"] = c.image_token_id;
        j["quantization_config"] = {{"quant_method", "fp8"},
                                    {"activation_scheme", "dynamic"},
                                    {"weight_block_size", {c.weight_block, c.weight_block}},
                                    {"scale_fmt", "ue8m0"},
                                    {"expert_dtype", c.fp4_experts ? "fp4" : "fp8"}};
        j["text_config"] = std::move(t);
        return j;
    }

    ModelFormat format(const ModelConfig& c) const override {
        ModelFormat f;
        f.single_pass_mhc = true;
        f.query_head_norm = false;
        f.index_rotation = false;
        f.sorted_selection = true;
        f.ring_before_full = true;
        f.yarn_ramp = YarnRamp::kMinWidth;
        f.route_norm = c.norm_topk_prob ? RouteNorm::kSumIfSeveral : RouteNorm::kNone;
        return f;
    }

    std::vector<AttentionLayerInfo> layer_roles(const ModelConfig& c) const override {
        std::vector<AttentionLayerInfo> out;
        std::vector<int> owners;  // index-key owners: kv sources that are index sources
        for (int l : c.kv_source_layers)
            if (contains(c.index_source_layers, l)) owners.push_back(l);
        for (int l = 0; l < c.n_layers; ++l) {
            AttentionLayerInfo a;
            a.layer = l;
            a.ratio = c.ratio(l);
            a.yarn = a.ratio > 0 && c.original_seq_len > 0;
            a.rope_theta = a.ratio > 0 ? c.compress_rope_theta : c.rope_theta;
            if (a.ratio > 0) {
                a.compresses = contains(c.kv_source_layers, l);
                a.comp_source = latest_at_or_before(c.kv_source_layers, l);
                a.has_indexer = contains(c.index_source_layers, l);
                a.owns_index_k = a.has_indexer && a.compresses;
                a.index_k_source = latest_at_or_before(owners, l);
                a.candidate_source = a.has_indexer && l == c.candidate_source_layer;
                a.uses_candidates = a.has_indexer && c.candidate_source_layer >= 0 && c.candidate_source_layer < l;
                a.reuses_selection = !a.has_indexer;
                if (a.comp_source < 0) fail("layer {} compresses (ratio {}) but no kv source precedes it", l, a.ratio);
                if (a.has_indexer && a.index_k_source < 0)
                    fail("index source layer {} has no index-key owner before it", l);
            }
            out.push_back(a);
        }
        return out;
    }

    // Window K=V: e4m3 over every dim (blocks of act_block); compressed latents: e2m1 under e4m3 scales (blocks of
    // 16); indexer keys: e2m1 under ue8m0 scales (blocks of 32). DSpark stages keep only a window, fed by the
    // backbone.
    StateSpec state_spec(const ModelConfig& c) const override {
        const int D = c.head_dim;
        const EntryFormat window = fp8_entry_format(D, D, c.act_block);
        StateSpec spec;
        spec.window_tokens = c.window_size;
        for (const AttentionLayerInfo& a : layer_roles(c)) {
            LayerStateSpec L;
            L.window = {window, 1};
            if (a.compresses) {
                L.comp = {fp4_entry_format(D, 16, true), a.ratio};
                if (a.ratio > 1) L.carry_floats = int64_t{a.ratio} * D;
            }
            if (a.owns_index_k) L.index_k = {fp4_entry_format(c.index_head_dim, 32, false), a.ratio};
            spec.layers.push_back(L);
        }
        if (c.dspark_block_size > 0)
            for (int st = 0; st < c.n_mtp_layers; ++st) {
                LayerStateSpec L;
                L.window = {window, 1};
                spec.layers.push_back(L);
            }
        return spec;
    }

    ModelWeights load_weights(WeightLoader& L) const override {
        const ModelConfig& c = L.config();
        const int D = c.dim, HD = c.head_dim;
        ModelWeights m;
        m.embed = L.tensor("embed.weight", DType::BF16, {c.vocab_size, D});
        m.norm = L.param("norm.weight", {D});
        m.head = L.dense("head", c.vocab_size, D, LinearWeight::Kind::F32);
        for (int l = 0; l < c.n_layers; ++l) {
            const std::string p = fmt::format("layers.{}.", l), ap = p + "attn.";
            BlockWeight b = load_block_core(L, p, c.n_routed_experts, c.n_activated_experts, l < c.n_hash_layers);
            const int ratio = c.ratio(l);
            const bool kv_source = contains(c.kv_source_layers, l);
            if (kv_source && ratio > 0)
                b.attn.compressor = load_compressor(L, ap + "compressor.", ratio, HD, false, false);
            if (contains(c.index_source_layers, l) && ratio > 0) {
                IndexerWeight ix = load_indexer(L, ap + "indexer.");
                if (kv_source) {  // the key owner: its latents become the keys
                    ix.wk = L.dense(ap + "indexer.wk", ix.head_dim, HD, LinearWeight::Kind::BF16);
                    ix.k_norm = L.param(ap + "indexer.k_norm.weight", {ix.head_dim});
                }
                b.attn.indexer = ix;
            }
            if (c.is_engram_layer(l)) {
                const auto at = std::find(c.engram_layer_ids.begin(), c.engram_layer_ids.end(), l);
                b.engram = load_engram(L, p, static_cast<size_t>(at - c.engram_layer_ids.begin()));
            }
            m.layers.push_back(std::move(b));
        }
        if (c.n_mtp_layers > 0 && c.dspark_block_size > 0 && !c.dspark_target_layer_ids.empty())
            m.dspark = load_dspark(L);
        return m;
    }

private:
    // The ids the runtime indexes with: layers, vocabulary rows, engram tables, DSpark targets.
    static void validate(const ModelConfig& c, const std::string& path) {
        auto need = [&](bool ok, const char* what) {
            if (!ok) fail("'{}': invalid model configuration: {}", path, what);
        };
        auto layers = [&](const std::vector<int>& v) {
            std::vector<int> s = v;
            std::sort(s.begin(), s.end());
            return std::adjacent_find(s.begin(), s.end()) == s.end() &&
                   std::all_of(s.begin(), s.end(), [&](int l) { return l >= 0 && l < c.n_layers; });
        };
        need(layers(c.kv_source_layers), "kv_source_layer_ids must be distinct layers");
        need(layers(c.index_source_layers), "index_source_layer_ids must be distinct layers");
        need(c.candidate_source_layer >= -1 && c.candidate_source_layer < c.n_layers,
             "candidate_source_layer_id out of range");
        // The candidate blocks divide the compressed entries: a block of 0 was a division by zero.
        need(c.candidate_block_size >= 1 && c.candidate_topk_blocks >= 0,
             "candidate_block_size must be positive and candidate_topk_blocks not negative");
        need(c.image_token_id >= -1, "image_token_id must be -1 or an id");

        need(c.engram_layer_ids.size() == c.engram_num_embeddings.size(), "engram_num_embeddings per engram layer");
        if (!c.engram_layer_ids.empty()) {
            need(layers(c.engram_layer_ids), "engram_layer_ids must be distinct layers");
            for (int64_t n : c.engram_num_embeddings) need(n > 0, "engram_num_embeddings must be positive");
            // The primes are searched upwards from engram_vocab_size (bounded so the search cannot overflow); the
            // hash multipliers divide by the compressed vocabulary; pad is a token id.
            need(c.engram_max_ngram_size >= 2 && c.engram_max_ngram_size <= 16,
                 "engram_max_ngram_size must be within [2, 16]");
            need(c.engram_n_heads >= 1 && c.engram_n_heads <= 64, "engram_n_heads must be within [1, 64]");
            need(c.engram_head_dim > 0 && c.engram_head_dim <= 4096 && c.engram_head_dim % 32 == 0,
                 "engram_head_dim must be a multiple of 32 within [32, 4096]");
            need(c.engram_vocab_size >= 1 && c.engram_vocab_size <= (int64_t{1} << 40),
                 "engram_vocab_size must be within [1, 2^40]");
            need(c.engram_compressed_vocab_size >= 1 && c.engram_compressed_vocab_size <= c.vocab_size,
                 "engram_compressed_vocab_size must be within [1, vocab_size]");
            need(c.engram_pad_id >= 0 && c.engram_pad_id < c.vocab_size,
                 "engram_pad_token_id must be an id of the vocabulary");
        }

        need(c.dspark_block_size >= 0 && c.dspark_block_size <= 1024, "dspark_block_size must be within [0, 1024]");
        need(c.dspark_n_routed_experts >= 0 && c.dspark_n_activated_experts >= 0,
             "dspark experts must not be negative");
        if (c.n_mtp_layers > 0 && c.dspark_block_size > 0) {
            // The draft embeds the noise token and reads each target layer's hidden state once.
            need(layers(c.dspark_target_layer_ids), "dspark_target_layer_ids must be distinct layers");
            need(c.dspark_noise_token_id >= 0 && c.dspark_noise_token_id < c.vocab_size,
                 "dspark_noise_token_id must be an id of the vocabulary");
            need(c.dspark_markov_rank > 0, "dspark_markov_rank must be positive");
            const int E = c.dspark_n_routed_experts ? c.dspark_n_routed_experts : c.n_routed_experts;
            const int K = c.dspark_n_activated_experts ? c.dspark_n_activated_experts : c.n_activated_experts;
            need(K <= E, "dspark_num_experts_per_tok must not exceed dspark_n_routed_experts");
        }
    }

    // The DSpark head (checkpoint namespace mtp.S.): window-only blocks fed by the backbone's hidden states, then
    // a Markov bias and a confidence head.
    static DSparkWeight load_dspark(WeightLoader& L) {
        const ModelConfig& c = L.config();
        DSparkWeight d;
        const int D = c.dim, S = c.n_mtp_layers;
        const int E = c.dspark_n_routed_experts ? c.dspark_n_routed_experts : c.n_routed_experts;
        const int K = c.dspark_n_activated_experts ? c.dspark_n_activated_experts : c.n_activated_experts;
        for (int s = 0; s < S; ++s) d.stages.push_back(load_block_core(L, fmt::format("mtp.{}.", s), E, K, false));
        const int targets = static_cast<int>(c.dspark_target_layer_ids.size());
        d.main_proj = L.fp8("mtp.0.main_proj", D, targets * D);
        d.main_norm = L.param("mtp.0.main_norm.weight", {D});
        const std::string last = fmt::format("mtp.{}.", S - 1);
        d.norm = L.param(last + "norm.weight", {D});
        d.markov_embed = L.tensor(last + "markov_head.embed.weight", DType::BF16, {c.vocab_size, c.dspark_markov_rank});
        d.markov_head = L.tensor(last + "markov_head.head.weight", DType::BF16, {c.vocab_size, c.dspark_markov_rank});
        d.confidence = L.dense(last + "confidence_head.proj", 1, D + c.dspark_markov_rank, LinearWeight::Kind::F32);
        return d;
    }
};

}  // namespace

const ModelVariant& deepseek_v41_variant() {
    static const DeepseekV41 v;
    return v;
}

}  // namespace peregrine
