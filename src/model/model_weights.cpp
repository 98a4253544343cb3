#include "model/model_weights.h"
#include "util/error.h"
#include "util/thread_pool.h"

#include <cmath>

#include <algorithm>
#include <fmt/format.h>

namespace peregrine {

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Loader {
public:
    Loader(const ModelConfig& cfg, const SafeTensors& st) : cfg_(cfg), st_(st) {}
    // Synthetic weights: every tensor is made up (see synthetic_tensor) instead of read.
    Loader(const ModelConfig& cfg, uint64_t seed) : cfg_(cfg), st_(empty_), synthetic_(true), seed_(seed) {}

    Tensor tensor(const std::string& name, DType dtype, std::vector<int64_t> shape) {
        if (synthetic_) return synthetic_tensor(name, dtype, std::move(shape), seed_++);
        const TensorView& t = st_.require(name, dtype, shape);
        return Tensor::view(t.dtype, t.shape, t.data);
    }
    // A norm or small parameter stored as BF16 or F32.
    Tensor param(const std::string& name, std::vector<int64_t> shape) {
        if (synthetic_) return synthetic_tensor(name, DType::BF16, std::move(shape), seed_++);
        const TensorView& t = st_.require(name);
        if (t.dtype != DType::BF16 && t.dtype != DType::F32)
            fail("tensor '{}' in '{}' has dtype {}, expected BF16 or F32", name, *t.file, dtype_name(t.dtype));
        if (t.shape != shape)
            fail("tensor '{}' in '{}' has shape {}, expected {}", name, *t.file, t.shape_str(), shape_to_string(shape));
        return Tensor::view(t.dtype, t.shape, t.data);
    }
    LinearWeight fp8(const std::string& name, int out, int in) {
        LinearWeight w;
        w.kind = LinearWeight::Kind::FP8;
        w.out = out;
        w.in = in;
        w.weight_block = cfg_.weight_block;
        w.act_block = cfg_.act_block;
        if (in % cfg_.act_block != 0)
            fail("'{}': input width {} is not a multiple of the activation block {}", name, in, cfg_.act_block);
        w.w = tensor(name + ".weight", DType::E4M3, {out, in});
        w.scale = tensor(name + ".scale", DType::E8M0, {cdiv(out, cfg_.weight_block), cdiv(in, cfg_.weight_block)});
        return w;
    }
    LinearWeight fp4(const std::string& name, int out, int in) {
        LinearWeight w;
        w.kind = LinearWeight::Kind::FP4;
        w.out = out;
        w.in = in;
        w.act_block = cfg_.act_block;
        w.w = tensor(name + ".weight", DType::I8, {out, in / 2});
        w.scale = tensor(name + ".scale", DType::E8M0, {out, in / 32});
        return w;
    }
    LinearWeight dense(const std::string& name, int out, int in, LinearWeight::Kind kind) {
        LinearWeight w;
        w.kind = kind;
        w.out = out;
        w.in = in;
        w.w = param(name + ".weight", {out, in});
        return w;
    }
    // FP8 weight dequantised to a bf16 copy (wo_a: the reference runs that einsum in bf16).
    LinearWeight fp8_as_bf16(const std::string& name, int out, int in) {
        LinearWeight q = fp8(name, out, in);
        Tensor w = Tensor::zeros(DType::BF16, {out, in});
        const int b = cfg_.weight_block;
        const int64_t sc = cdiv(in, b);
        for (int64_t r = 0; r < out; ++r)
            for (int64_t c = 0; c < in; ++c) {
                float v = e4m3_to_f32(q.w.data<uint8_t>()[r * in + c]) *
                          e8m0_to_f32(q.scale.data<uint8_t>()[(r / b) * sc + c / b]);
                w.data<uint16_t>()[r * in + c] = f32_to_bf16(v);
            }
        LinearWeight d;
        d.kind = LinearWeight::Kind::BF16;
        d.out = out;
        d.in = in;
        d.w = w;
        return d;
    }
    bool has(const std::string& name) const { return st_.has(name); }

private:
    // Values in the released formats at sane magnitudes: e4m3 in [2^-3, 2), ue8m0 scales 2^-8, random fp4
    // nibbles, norms 1, other parameters uniform in +-1/sqrt(fan-in), hash routes spread over the experts.
    Tensor synthetic_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape, uint64_t seed) {
        Tensor t = Tensor::zeros(dtype, shape);
        const int64_t n = t.numel();
        const int64_t fan_in = shape.empty() ? 1 : shape.back();
        const float a = shape.size() >= 2 ? 1.0f / std::sqrt(static_cast<float>(fan_in)) : 0.1f;
        const bool is_norm = name.size() > 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0;
        parallel_for(n, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) {
                uint64_t x = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xD1B54A32D192ED69ull);
                x ^= x >> 31;
                x *= 0xBF58476D1CE4E5B9ull;
                x ^= x >> 29;
                const uint32_t r = static_cast<uint32_t>(x >> 16);
                const float u = static_cast<float>(r & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
                switch (dtype) {
                    case DType::E4M3:
                        t.data<uint8_t>()[i] = static_cast<uint8_t>((r & 0x80) | ((4 + (r >> 8) % 4) << 3) | (r & 7));
                        break;
                    case DType::E8M0: t.data<uint8_t>()[i] = 119; break;
                    case DType::I8: case DType::U8: t.data<uint8_t>()[i] = static_cast<uint8_t>(r); break;
                    case DType::I64:
                        t.data<int64_t>()[i] =
                            static_cast<int64_t>((i * 7919 + i / fan_in) % std::max(1, cfg_.n_routed_experts));
                        break;
                    case DType::BF16: t.data<uint16_t>()[i] = f32_to_bf16(is_norm ? 1.0f : a * u); break;
                    case DType::F32: t.data<float>()[i] = is_norm ? 1.0f : a * u; break;
                    default: fail("synthetic weights: unsupported dtype {} for '{}'", dtype_name(dtype), name);
                }
            }
        }, 1 << 16);
        return t;
    }

    const ModelConfig& cfg_;
    SafeTensors empty_;
    const SafeTensors& st_;
    bool synthetic_ = false;
    uint64_t seed_ = 0;
};

HcWeight load_hc(Loader& L, const std::string& p, const std::string& site, int n_mix, int width) {
    HcWeight h;
    h.fn = L.tensor(p + "hc_" + site + "_fn", DType::F32, {n_mix, width});
    h.base = L.tensor(p + "hc_" + site + "_base", DType::F32, {n_mix});
    h.scale = L.tensor(p + "hc_" + site + "_scale", DType::F32, {site == "head" ? 1 : 3});
    return h;
}

CompressorWeight load_compressor(Loader& L, const ModelConfig& cfg, const std::string& p, int ratio, int head_dim,
                                 bool rotate) {
    CompressorWeight c;
    c.ratio = ratio;
    c.head_dim = head_dim;
    c.rotate = rotate;
    const bool v4 = !cfg.is_v41();
    c.overlap = v4 && ratio == 4;
    const int coff = c.overlap ? 2 : 1;
    // Ratio 1 is a plain bf16 projection; pooling compressors run in fp32 on the bf16 weights.
    auto kind = ratio == 1 ? LinearWeight::Kind::BF16 : LinearWeight::Kind::F32;
    c.wkv = L.dense(p + "wkv", coff * head_dim, cfg.dim, kind);
    if (ratio > 1) c.wgate = L.dense(p + "wgate", coff * head_dim, cfg.dim, kind);
    if (v4) c.ape = L.tensor(p + "ape", DType::F32, {ratio, coff * head_dim});
    c.norm = L.param(p + "norm.weight", {head_dim});
    return c;
}

ExpertWeight load_expert(Loader& L, const ModelConfig& cfg, const std::string& p, bool fp4) {
    ExpertWeight e;
    const int D = cfg.dim, I = cfg.moe_inter_dim;
    if (fp4) {
        e.w1 = L.fp4(p + "w1", I, D);
        e.w2 = L.fp4(p + "w2", D, I);
        e.w3 = L.fp4(p + "w3", I, D);
    } else {
        e.w1 = L.fp8(p + "w1", I, D);
        e.w2 = L.fp8(p + "w2", D, I);
        e.w3 = L.fp8(p + "w3", I, D);
    }
    return e;
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }


// Norms, mHC, the attention projections and the MoE of one block (what every layer and DSpark stage has).
BlockWeight load_block_core(Loader& L, const ModelConfig& cfg, const std::string& p, int n_experts, int top_k,
                            bool hash) {
    const int D = cfg.dim, H = cfg.n_heads, HD = cfg.head_dim, hc = cfg.hc_mult, n_mix = (2 + hc) * hc;
    BlockWeight b;
    b.attn_norm = L.param(p + "attn_norm.weight", {D});
    b.ffn_norm = L.param(p + "ffn_norm.weight", {D});
    b.hc_attn = load_hc(L, p, "attn", n_mix, hc * D);
    b.hc_ffn = load_hc(L, p, "ffn", n_mix, hc * D);

    AttentionWeight& a = b.attn;
    const std::string ap = p + "attn.";
    a.attn_sink = L.tensor(ap + "attn_sink", DType::F32, {H});
    a.wq_a = L.fp8(ap + "wq_a", cfg.q_lora_rank, D);
    a.q_norm = L.param(ap + "q_norm.weight", {cfg.q_lora_rank});
    a.wq_b = L.fp8(ap + "wq_b", H * HD, cfg.q_lora_rank);
    a.wkv = L.fp8(ap + "wkv", HD, D);
    a.kv_norm = L.param(ap + "kv_norm.weight", {HD});
    a.wo_a = L.fp8_as_bf16(ap + "wo_a", cfg.o_groups * cfg.o_lora_rank, H * HD / cfg.o_groups);
    a.wo_b = L.fp8(ap + "wo_b", D, cfg.o_groups * cfg.o_lora_rank);

    MoEWeight& f = b.ffn;
    const std::string fp = p + "ffn.";
    f.top_k = top_k;
    f.gate = L.dense(fp + "gate", n_experts, D, LinearWeight::Kind::F32);
    if (hash) {
        f.tid2eid = L.tensor(fp + "gate.tid2eid", DType::I64, {cfg.vocab_size, top_k});
        const int64_t* t = f.tid2eid.data<int64_t>();
        for (int64_t i = 0; i < f.tid2eid.numel(); ++i)
            if (t[i] < 0 || t[i] >= n_experts)
                fail("tensor '{}gate.tid2eid' routes to expert {} of {}", fp, t[i], n_experts);
    } else {
        f.bias = L.tensor(fp + "gate.bias", DType::F32, {n_experts});
    }
    for (int e = 0; e < n_experts; ++e)
        f.experts.push_back(load_expert(L, cfg, fmt::format("{}experts.{}.", fp, e), cfg.fp4_experts));
    f.shared = load_expert(L, cfg, fp + "shared_experts.", false);
    return b;
}

DSparkWeight load_dspark(Loader& L, const ModelConfig& cfg) {
    DSparkWeight d;
    const int D = cfg.dim, S = cfg.n_mtp_layers;
    const int E = cfg.dspark_n_routed_experts ? cfg.dspark_n_routed_experts : cfg.n_routed_experts;
    const int K = cfg.dspark_n_activated_experts ? cfg.dspark_n_activated_experts : cfg.n_activated_experts;
    for (int s = 0; s < S; ++s) d.stages.push_back(load_block_core(L, cfg, fmt::format("mtp.{}.", s), E, K, false));
    const int targets = static_cast<int>(cfg.dspark_target_layer_ids.size());
    d.main_proj = L.fp8("mtp.0.main_proj", D, targets * D);
    d.main_norm = L.param("mtp.0.main_norm.weight", {D});
    const std::string last = fmt::format("mtp.{}.", S - 1);
    d.norm = L.param(last + "norm.weight", {D});
    d.markov_embed = L.tensor(last + "markov_head.embed.weight", DType::BF16, {cfg.vocab_size, cfg.dspark_markov_rank});
    d.markov_head = L.tensor(last + "markov_head.head.weight", DType::BF16, {cfg.vocab_size, cfg.dspark_markov_rank});
    d.confidence = L.dense(last + "confidence_head.proj", 1, D + cfg.dspark_markov_rank, LinearWeight::Kind::F32);
    return d;
}

}  // namespace

namespace {
ModelWeights build_model_weights(const ModelConfig& cfg, Loader& L);
}

ModelWeights load_model_weights(const ModelConfig& cfg, const SafeTensors& st) {
    Loader L(cfg, st);
    return build_model_weights(cfg, L);
}

ModelWeights synthetic_model_weights(const ModelConfig& cfg, uint64_t seed) {
    Loader L(cfg, seed);
    return build_model_weights(cfg, L);
}

namespace {
ModelWeights build_model_weights(const ModelConfig& cfg, Loader& L) {
    const int D = cfg.dim, HD = cfg.head_dim, hc = cfg.hc_mult;
    ModelWeights m;
    m.embed = L.tensor("embed.weight", DType::BF16, {cfg.vocab_size, D});
    m.norm = L.param("norm.weight", {D});
    m.head = L.dense("head", cfg.vocab_size, D, LinearWeight::Kind::F32);
    if (!cfg.is_v41()) m.hc_head = load_hc(L, "", "head", hc, hc * D);

    for (int l = 0; l < cfg.n_layers; ++l) {
        const std::string p = fmt::format("layers.{}.", l);
        BlockWeight b =
            load_block_core(L, cfg, p, cfg.n_routed_experts, cfg.n_activated_experts, l < cfg.n_hash_layers);
        AttentionWeight& a = b.attn;
        const std::string ap = p + "attn.";
        const int ratio = cfg.ratio(l);
        if (cfg.is_v41()) {
            if (contains(cfg.kv_source_layers, l) && ratio > 0)
                a.compressor = load_compressor(L, cfg, ap + "compressor.", ratio, HD, false);
            if (contains(cfg.index_source_layers, l) && ratio > 0) {
                IndexerWeight ix;
                ix.n_heads = cfg.index_n_heads;
                ix.head_dim = cfg.index_head_dim;
                ix.topk = cfg.index_topk;
                ix.wq_b = L.fp8(ap + "indexer.wq_b", ix.n_heads * ix.head_dim, cfg.q_lora_rank);
                ix.weights_proj = L.dense(ap + "indexer.weights_proj", ix.n_heads, D, LinearWeight::Kind::BF16);
                if (contains(cfg.kv_source_layers, l)) {
                    ix.wk = L.dense(ap + "indexer.wk", ix.head_dim, HD, LinearWeight::Kind::BF16);
                    ix.k_norm = L.param(ap + "indexer.k_norm.weight", {ix.head_dim});
                }
                a.indexer = ix;
            }
        } else if (ratio > 0) {
            a.compressor = load_compressor(L, cfg, ap + "compressor.", ratio, HD, false);
            if (ratio == 4) {
                IndexerWeight ix;
                ix.n_heads = cfg.index_n_heads;
                ix.head_dim = cfg.index_head_dim;
                ix.topk = cfg.index_topk;
                ix.wq_b = L.fp8(ap + "indexer.wq_b", ix.n_heads * ix.head_dim, cfg.q_lora_rank);
                ix.weights_proj = L.dense(ap + "indexer.weights_proj", ix.n_heads, D, LinearWeight::Kind::BF16);
                ix.compressor = load_compressor(L, cfg, ap + "indexer.compressor.", ratio, ix.head_dim, true);
                a.indexer = ix;
            }
        }

        if (cfg.is_engram_layer(l)) {
            size_t idx = static_cast<size_t>(std::find(cfg.engram_layer_ids.begin(), cfg.engram_layer_ids.end(), l) -
                                             cfg.engram_layer_ids.begin());
            EngramWeight e;
            e.head_dim = cfg.engram_head_dim;
            e.n_cols = (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads;
            const int64_t rows = cfg.engram_num_embeddings.at(idx);
            e.table = L.tensor(p + "engram.embed.weight", DType::E4M3, {rows, e.head_dim});
            e.table_scale = L.tensor(p + "engram.embed.scale", DType::E8M0, {rows, e.head_dim / 32});
            e.wkv = L.fp8(p + "engram.wkv", (hc + 1) * D, e.n_cols * e.head_dim);
            e.q_weight = L.param(p + "engram.q_weight", {hc, D});
            e.k_weight = L.param(p + "engram.k_weight", {hc, D});
            b.engram = e;
        }
        m.layers.push_back(std::move(b));
    }
    if (cfg.is_v41() && cfg.n_mtp_layers > 0 && cfg.dspark_block_size > 0 && !cfg.dspark_target_layer_ids.empty())
        m.dspark = load_dspark(L, cfg);
    return m;
}

}  // namespace

}  // namespace peregrine
