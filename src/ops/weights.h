#pragma once
// Weights of one model as the backends consume them. Tensors alias the checkpoint where the stored
// format is used directly (fp8/fp4/bf16), so nothing is copied; a backend may upload them elsewhere.
#include "tensor/tensor.h"

#include <optional>
#include <vector>

namespace peregrine {

// y = x W^T. FP8: e4m3 [out,in] with ue8m0 tile scales [ceil(out/b), ceil(in/b)]; FP4: packed e2m1
// [out, in/2] (low nibble = even column) with ue8m0 scales [out, in/32]. Inputs of FP8/FP4 linears are
// quantised to e4m3 per `act_block` values first. F32 linears compute in fp32 (the reference promotes
// those bf16 weights); BF16 linears compute with bf16 inputs and round the output to bf16.
struct LinearWeight {
    enum class Kind { F32, BF16, FP8, FP4 } kind = Kind::BF16;
    int out = 0, in = 0;
    int weight_block = 0;  // FP8 tile size
    int act_block = 0;     // activation quantisation block for FP8/FP4
    Tensor w, scale;
    bool empty() const { return out == 0; }
};

struct ExpertWeight {
    LinearWeight w1, w2, w3;
};

struct MoEWeight {
    LinearWeight gate;         // router, computed in fp32
    Tensor bias;               // F32 [n_experts] (selection only); empty for hash-routed layers
    Tensor tid2eid;            // I64 [vocab, top_k] for hash-routed layers
    std::vector<ExpertWeight> experts;
    ExpertWeight shared;
    int top_k = 0;
};

// Hyper-connection mixing parameters of one sublayer.
struct HcWeight {
    Tensor fn;     // F32 [(2+hc)*hc, hc*dim] (V4 head: [hc, hc*dim])
    Tensor base;   // F32
    Tensor scale;  // F32 [3] (V4 head: [1])
};

struct CompressorWeight {
    int ratio = 0;
    int head_dim = 0;
    bool overlap = false;  // V4 ratio 4: overlapping windows (coff 2)
    LinearWeight wkv, wgate;  // wgate empty for V4.1 ratio 1
    Tensor ape;               // F32 [ratio, coff*head_dim] (V4 only)
    Tensor norm;              // RMSNorm weight [head_dim]
};

struct IndexerWeight {
    int n_heads = 0, head_dim = 0, topk = 0;
    LinearWeight wq_b, weights_proj;
    LinearWeight wk;   // V4.1 key owners: latent -> key
    Tensor k_norm;     // V4.1 key owners
    std::optional<CompressorWeight> compressor;  // V4: the indexer's own key compressor
};

struct AttentionWeight {
    LinearWeight wq_a, wq_b, wkv, wo_a, wo_b;  // wo_a dequantised to BF16 [groups*o_lora, heads*head_dim/groups]
    Tensor q_norm, kv_norm, attn_sink;
    std::optional<CompressorWeight> compressor;
    std::optional<IndexerWeight> indexer;
};

struct EngramWeight {
    Tensor table;        // E4M3 [rows, head_dim]
    Tensor table_scale;  // E8M0 [rows, head_dim/32]
    LinearWeight wkv;    // FP8 [(hc+1)*dim, n_cols*head_dim]
    Tensor q_weight, k_weight;  // [hc, dim]
    int head_dim = 0, n_cols = 0;
};

struct BlockWeight {
    Tensor attn_norm, ffn_norm;
    HcWeight hc_attn, hc_ffn;
    AttentionWeight attn;
    MoEWeight ffn;
    std::optional<EngramWeight> engram;
};

// DSpark draft head of V4.1 (checkpoint namespace mtp.S.): window-only blocks fed by the backbone's hidden
// states (main_proj of the target layers' inputs), then a Markov bias and a confidence head.
struct DSparkWeight {
    std::vector<BlockWeight> stages;
    LinearWeight main_proj;      // FP8 [dim, targets*dim]
    Tensor main_norm, norm;      // stage 0 / last stage
    Tensor markov_embed, markov_head;  // BF16 [vocab, rank]
    LinearWeight confidence;     // [1, dim + rank], computed in fp32
};

// V4's MTP layer (checkpoint namespace mtp.0.): a block over e_proj(enorm(embed(next token))) (over every hc copy) +
// h_proj(hnorm(the backbone's final hidden state)), collapsed by its own head mix and norm into the shared head.
struct MtpWeight {
    BlockWeight block;
    LinearWeight e_proj, h_proj;  // FP8 [dim, dim]
    Tensor enorm, hnorm, norm;
    HcWeight hc_head;
};

struct ModelWeights {
    Tensor embed;  // BF16 [vocab, dim]
    Tensor norm;   // final RMSNorm
    LinearWeight head;
    std::optional<HcWeight> hc_head;  // V4 only
    std::vector<BlockWeight> layers;
    std::optional<DSparkWeight> dspark;
    std::optional<MtpWeight> mtp;
};

}  // namespace peregrine
