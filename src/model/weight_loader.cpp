#include "model/weight_loader.h"
#include "util/error.h"
#include "util/thread_pool.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace peregrine {

namespace {
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

Tensor WeightLoader::synthetic(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    SyntheticTensor t{name, dtype, std::move(shape), seed_++};
    if (!inventory_) return synthetic_tensor(cfg_, t);
    inventory_->push_back(t);
    return Tensor::view(dtype, t.shape, nullptr);
}

Tensor WeightLoader::tensor(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    if (synthetic_) return synthetic(name, dtype, std::move(shape));
    const TensorView& t = st_.require(name, dtype, shape);
    return Tensor::view(t.dtype, t.shape, t.data);
}
Tensor WeightLoader::engram_table(const std::string& name, DType dtype, int64_t rows, int64_t width) {
    if (!synthetic_) return tensor(name, dtype, {rows, width});
    PEREGRINE_CHECK(!inventory_, "synthetic checkpoints have no engram tables ('{}')", name);
    // Every layer sees the whole table (rows beyond its own count are never hashed to): one tensor, one shape, so
    // that a backend's copy of it is made once and holds every row.
    const auto& n = cfg_.engram_num_embeddings;
    const int64_t most = *std::max_element(n.begin(), n.end());
    PEREGRINE_CHECK(rows <= most, "engram table '{}' of {} rows", name, rows);
    Tensor& t = engram_tables_[dtype];
    if (t.empty()) t = synthetic(name, dtype, {most, width});
    return t;
}

Tensor WeightLoader::param(const std::string& name, std::vector<int64_t> shape) {
    if (synthetic_) return synthetic(name, DType::BF16, std::move(shape));
    const TensorView& t = st_.require(name);
    if (t.dtype != DType::BF16 && t.dtype != DType::F32)
        fail("tensor '{}' in '{}' has dtype {}, expected BF16 or F32", name, *t.file, dtype_name(t.dtype));
    if (t.shape != shape)
        fail("tensor '{}' in '{}' has shape {}, expected {}", name, *t.file, t.shape_str(), shape_to_string(shape));
    return Tensor::view(t.dtype, t.shape, t.data);
}
LinearWeight WeightLoader::fp8(const std::string& name, int out, int in) {
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
LinearWeight WeightLoader::fp4(const std::string& name, int out, int in) {
    LinearWeight w;
    w.kind = LinearWeight::Kind::FP4;
    w.out = out;
    w.in = in;
    w.act_block = cfg_.act_block;
    w.w = tensor(name + ".weight", DType::I8, {out, in / 2});
    w.scale = tensor(name + ".scale", DType::E8M0, {out, in / 32});
    return w;
}
LinearWeight WeightLoader::dense(const std::string& name, int out, int in, LinearWeight::Kind kind) {
    LinearWeight w;
    w.kind = kind;
    w.out = out;
    w.in = in;
    w.w = param(name + ".weight", {out, in});
    return w;
}
LinearWeight WeightLoader::fp8_as_bf16(const std::string& name, int out, int in) {
    LinearWeight q = fp8(name, out, in);
    LinearWeight d;
    d.kind = LinearWeight::Kind::BF16;
    d.out = out;
    d.in = in;
    if (!q.w.raw()) return d;  // listed, not made
    Tensor w = Tensor::zeros(DType::BF16, {out, in});
    const int b = cfg_.weight_block;
    const int64_t sc = cdiv(in, b);
    for (int64_t r = 0; r < out; ++r)
        for (int64_t c = 0; c < in; ++c) {
            float v = e4m3_to_f32(q.w.data<uint8_t>()[r * in + c]) *
                      e8m0_to_f32(q.scale.data<uint8_t>()[(r / b) * sc + c / b]);
            w.data<uint16_t>()[r * in + c] = f32_to_bf16(v);
        }
    d.w = w;
    return d;
}

size_t SyntheticTensor::nbytes() const {
    size_t n = dtype_size(dtype);
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return n;
}

// Values in the released formats at sane magnitudes: e4m3 in [2^-3, 2), ue8m0 scales 2^-8, random fp4 nibbles, norms
// 1, other parameters uniform in +-1/sqrt(fan-in), hash routes spread over the experts.
Tensor synthetic_tensor(const ModelConfig& cfg, const SyntheticTensor& spec) {
    const std::string& name = spec.name;
    const DType dtype = spec.dtype;
    const std::vector<int64_t>& shape = spec.shape;
    const uint64_t seed = spec.seed;
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
                        static_cast<int64_t>((i * 7919 + i / fan_in) % std::max(1, cfg.n_routed_experts));
                    break;
                case DType::BF16: t.data<uint16_t>()[i] = f32_to_bf16(is_norm ? 1.0f : a * u); break;
                case DType::F32: t.data<float>()[i] = is_norm ? 1.0f : a * u; break;
                default: fail("synthetic weights: unsupported dtype {} for '{}'", dtype_name(dtype), name);
            }
        }
    }, 1 << 16);
    return t;
}

HcWeight load_hc(WeightLoader& L, const std::string& p, const std::string& site, int n_mix, int width) {
    HcWeight h;
    h.fn = L.tensor(p + "hc_" + site + "_fn", DType::F32, {n_mix, width});
    h.base = L.tensor(p + "hc_" + site + "_base", DType::F32, {n_mix});
    h.scale = L.tensor(p + "hc_" + site + "_scale", DType::F32, {site == "head" ? 1 : 3});
    return h;
}

CompressorWeight load_compressor(WeightLoader& L, const std::string& p, int ratio, int head_dim, bool overlap,
                                 bool ape) {
    const ModelConfig& cfg = L.config();
    CompressorWeight c;
    c.ratio = ratio;
    c.head_dim = head_dim;
    c.overlap = overlap;
    const int coff = c.overlap ? 2 : 1;
    // Ratio 1 is a plain bf16 projection; pooling compressors run in fp32 on the bf16 weights.
    auto kind = ratio == 1 ? LinearWeight::Kind::BF16 : LinearWeight::Kind::F32;
    c.wkv = L.dense(p + "wkv", coff * head_dim, cfg.dim, kind);
    if (ratio > 1) c.wgate = L.dense(p + "wgate", coff * head_dim, cfg.dim, kind);
    if (ape) c.ape = L.tensor(p + "ape", DType::F32, {ratio, coff * head_dim});
    c.norm = L.param(p + "norm.weight", {head_dim});
    return c;
}

ExpertWeight load_expert(WeightLoader& L, const std::string& p, bool fp4) {
    const ModelConfig& cfg = L.config();
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

BlockWeight load_block_core(WeightLoader& L, const std::string& p, int n_experts, int top_k, bool hash) {
    const ModelConfig& cfg = L.config();
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
        for (int64_t i = 0; t && i < f.tid2eid.numel(); ++i)  // t null: listed, not made
            if (t[i] < 0 || t[i] >= n_experts)
                fail("tensor '{}gate.tid2eid' routes to expert {} of {}", fp, t[i], n_experts);
    } else {
        f.bias = L.tensor(fp + "gate.bias", DType::F32, {n_experts});
    }
    for (int e = 0; e < n_experts; ++e)
        f.experts.push_back(load_expert(L, fmt::format("{}experts.{}.", fp, e), cfg.fp4_experts));
    f.shared = load_expert(L, fp + "shared_experts.", false);
    return b;
}

IndexerWeight load_indexer(WeightLoader& L, const std::string& p) {
    const ModelConfig& cfg = L.config();
    IndexerWeight ix;
    ix.n_heads = cfg.index_n_heads;
    ix.head_dim = cfg.index_head_dim;
    ix.topk = cfg.index_topk;
    ix.wq_b = L.fp8(p + "wq_b", ix.n_heads * ix.head_dim, cfg.q_lora_rank);
    ix.weights_proj = L.dense(p + "weights_proj", ix.n_heads, cfg.dim, LinearWeight::Kind::BF16);
    return ix;
}

EngramWeight load_engram(WeightLoader& L, const std::string& p, size_t index) {
    const ModelConfig& cfg = L.config();
    const int D = cfg.dim, hc = cfg.hc_mult;
    EngramWeight e;
    e.head_dim = cfg.engram_head_dim;
    e.n_cols = (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads;
    const int64_t rows = cfg.engram_num_embeddings.at(index);
    e.table = L.engram_table(p + "engram.embed.weight", DType::E4M3, rows, e.head_dim);
    e.table_scale = L.engram_table(p + "engram.embed.scale", DType::E8M0, rows, e.head_dim / 32);
    e.wkv = L.fp8(p + "engram.wkv", (hc + 1) * D, e.n_cols * e.head_dim);
    e.q_weight = L.param(p + "engram.q_weight", {hc, D});
    e.k_weight = L.param(p + "engram.k_weight", {hc, D});
    return e;
}

}  // namespace peregrine
