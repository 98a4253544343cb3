// The CUDA backend's graphed regions (graph_runner.h), at decode sizes:
// - a decode-form step's run of decoder layers (the model's layers between engrams, all of them in most models:
//   per layer the hc mixes on the side stream, collapse and norm, the attention block with the decode planner of
//   attention_decode.cpp, expand, the MoE block, ...: about sixty launches) depends on T, the number of sequences
//   and the step's cap: it reads the step's page tables and earlier layers' selections from its DecodeSet's fixed
//   buffers. One graph for the run, not one a layer: the step's activations stay inside it, copied in and out once;
// - another step's MoE block (gate, routing, expert tiles, routed and shared experts, combine: about fifteen launches
//   per layer) depends only on T.
// The temporaries come from the region's capture arena (device_memory.h): no memory nodes in the graphs.
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/launch_stream.h"
#include "util/error.h"

#include <cuda_runtime.h>

namespace peregrine::cuda {

void CudaBackend::set_graphs(bool on) {
    if (!on) graph_runner_.drop_all();
    graphs_ = on;
}

void CudaBackend::set_balanced_routing(bool on) {
    if (on != balanced_routing_) graph_runner_.drop_all();  // captured with the other routing
    balanced_routing_ = on;
}

void CudaBackend::decoder_layers(const std::vector<DecoderLayerRef>& layers, ForwardBatch& batch,
                                 StepScratch& scratch_base, Tensor& h, Tensor& pre) {
    auto& scratch = static_cast<CudaScratch&>(scratch_base);
    if (scratch.decode < 0) begin_decode(batch, scratch);
    if (scratch.decode == 1 && scratch.set && layers_graph(layers, scratch, batch.token_ids, h, pre)) return;
    Backend::decoder_layers(layers, batch, scratch, h, pre);
}

bool CudaBackend::layers_graph(const std::vector<DecoderLayerRef>& layers, CudaScratch& scratch,
                               const std::vector<int32_t>& ids, Tensor& h, Tensor& pre) {
    const int64_t T = h.dim(0);
    // What the run leaves in the step's scratch for later layers (its last selection and candidate mask: the
    // DecodeSet's fixed buffers), set again at each replay.
    struct Leaves {
        std::shared_ptr<void> topk, topk_count, mask;
        int topk_k = 0, mask_ratio = 0;
        int64_t mask_stride = 0;
    };
    GraphRunner::Hooks hooks;
    hooks.before_capture = [&] { join_mixes(nullptr); };  // no side-stream mix of earlier work in flight
    hooks.after_capture = [&](std::shared_ptr<void>& note) {
        note = std::make_shared<Leaves>(Leaves{scratch.topk, scratch.topk_count, scratch.mask, scratch.topk_k,
                                               scratch.mask_ratio, scratch.mask_stride});
    };
    hooks.on_replay = [&](const std::shared_ptr<void>& note) {
        const Leaves& l = *static_cast<const Leaves*>(note.get());
        scratch.topk = l.topk, scratch.topk_count = l.topk_count, scratch.mask = l.mask;
        scratch.topk_k = l.topk_k, scratch.mask_ratio = l.mask_ratio, scratch.mask_stride = l.mask_stride;
    };
    std::vector<Tensor> out;
    const GraphRunner::Key key{GraphRunner::Kind::decoder_layers, layers.at(0).block, T, scratch.paged.n_seqs,
                               static_cast<int64_t>(layers.size())};
    const bool ran = graph_runner_.run(
        key, scratch.cap, {h, pre}, upload_ids(ids).ptr, {h, pre}, out,
        [&](const std::vector<Tensor>& in, const int32_t* ids_d, std::vector<Tensor>& fixed_out) {
            Tensor hh = in[0], pp = in[1];
            for (const DecoderLayerRef& l : layers) {
                const LayerBlocks blocks{[&](const Tensor& x) {
                                             auto plan = decode_planner(*this, scratch, T);
                                             return attend(x, l.block->attn, *l.info, *plan, scratch);
                                         },
                                         [&](const Tensor& x) {
                                             Tensor o = empty(DType::F32, {T, cfg_.dim});
                                             moe_body(x, l.block->ffn, ids_d, o);
                                             return o;
                                         }};
                decoder_layer_ops(*this, *l.block, format_.single_pass_mhc, blocks, hh, pp);
            }
            PG_CUDA(cudaMemcpyAsync(fixed_out[0].raw(), hh.raw(), hh.nbytes(), cudaMemcpyDeviceToDevice,
                                    launch_stream()));
            PG_CUDA(cudaMemcpyAsync(fixed_out[1].raw(), pp.raw(), pp.nbytes(), cudaMemcpyDeviceToDevice,
                                    launch_stream()));
        },
        hooks);
    if (!ran) return false;
    h = out[0];
    pre = out[1];
    return true;
}

bool CudaBackend::moe_graph(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids, Tensor& out) {
    const int64_t T = x.dim(0);
    std::vector<Tensor> outs;  // [T, dim] like x
    if (!graph_runner_.run({GraphRunner::Kind::moe_block, w.experts.at(0).w1.w.raw(), T}, 0, {x}, upload_ids(ids).ptr,
                           {x}, outs,
                           [&](const std::vector<Tensor>& in, const int32_t* ids_d, std::vector<Tensor>& fixed_out) {
                               moe_body(in[0], w, ids_d, fixed_out[0]);
                           }))
        return false;
    out = outs[0];
    return true;
}

}  // namespace peregrine::cuda
