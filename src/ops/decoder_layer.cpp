// A decoder layer as the model runs it, written once against the backend's ops (the CUDA backend captures the same
// sequence as a graph at decode; expert parallelism passes its own FFN).
#include "ops/backend.h"

namespace peregrine {

void decoder_layer_ops(Backend& be, const BlockWeight& b, bool single_pass_mhc, const LayerBlocks& blocks, Tensor& h,
                       Tensor& pre) {
    HcMix am = be.hc_mixes(h, b.hc_attn);
    Tensor x = be.collapse_norm(h, single_pass_mhc ? pre : am.pre, b.attn_norm);
    x = blocks.attention(x);
    h = be.hc_expand(x, h, am);
    HcMix fm = be.hc_mixes(h, b.hc_ffn);
    x = be.collapse_norm(h, single_pass_mhc ? am.pre : fm.pre, b.ffn_norm);
    x = blocks.ffn(x);
    h = be.hc_expand(x, h, fm);
    pre = fm.pre;
}

void Backend::decoder_layers(const std::vector<DecoderLayerRef>& layers, ForwardBatch& batch, StepScratch& scratch,
                             Tensor& h, Tensor& pre) {
    for (const DecoderLayerRef& l : layers)
        decoder_layer_ops(*this, *l.block, format_.single_pass_mhc,
                          {[&](const Tensor& x) { return attention(x, l.block->attn, *l.info, batch, scratch); },
                           [&](const Tensor& x) { return moe(x, l.block->ffn, batch.token_ids); }},
                          h, pre);
}

}  // namespace peregrine
