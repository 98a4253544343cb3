// CUDA graphs at decode sizes: a decode step's decoder layer, or another step's MoE block, at T rows is captured
// once and replayed; its inputs are first copied into the graph's fixed buffers, its outputs copied out.
// - A decode step's layer (hc mixes on the side stream, collapse and norm, the attention block of
//   attention_decode.cpp, expand, the MoE block, ...: about sixty launches) depends on T and the step's cap: it reads
//   the step's page tables and earlier layers' selections from its DecodeSet's fixed buffers.
// - The MoE block's launches (gate, routing, expert tiles, routed and shared experts, combine: about fifteen per
//   layer) depend only on T.
// The first call at each size runs eagerly, so that weights, tables and scratch buffers exist before capture
// (capture cannot upload). The temporaries are allocated inside the graph (stream-ordered allocation nodes).
// Captured kernels read the GEMV's grow-only scratch (gemv_scratch: split partials, tickets, staged activations): it
// is grown before the first capture, and every graph is dropped if any of it moves (a larger call elsewhere may grow
// it).
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/launch_stream.h"
#include "util/error.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <optional>

namespace peregrine::cuda {

void* gemv_scratch(int which, size_t bytes, bool zero);  // linear_gemv.cu

namespace {
constexpr int kScratchSlots = 3;
bool scratch_moved(void* const (&captured)[kScratchSlots]) {
    for (int i = 0; i < kScratchSlots; ++i)
        if (gemv_scratch(i, 0, i == 1) != captured[i]) return true;
    return false;
}
}  // namespace

// A captured block: its executable graph and fixed input and output rows.
struct BlockGraph {
    int eager_runs = 0;
    bool failed = false;  // capture was not possible: this layer and size stay eager
    cudaGraphExec_t exec = nullptr;
    Tensor x_in, out;           // the input and output rows
    std::shared_ptr<void> ids;  // [T] the token ids (the MoE block's hash routing)
    BlockGraph() = default;
    BlockGraph(const BlockGraph&) = delete;
    BlockGraph& operator=(const BlockGraph&) = delete;
    ~BlockGraph() {
        if (exec) cudaGraphExecDestroy(exec);
    }
    // Captures body() (which reads x_in and writes out, on this thread's stream); false with a note on stderr if
    // that is not possible.
    template <typename Body>
    bool capture(const char* what, int64_t T, void* const (&scratch)[3], Body&& body);
};

template <typename Body>
bool BlockGraph::capture(const char* what, int64_t T, void* const (&scratch)[3], Body&& body) {
    cudaGraph_t graph = nullptr;
    PG_CUDA(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal));
    std::string why;
    try {
        body();
    } catch (const std::exception& e) {
        why = e.what();
    }
    cudaError_t e = cudaStreamEndCapture(cudaStreamPerThread, &graph);
    if (why.empty() && e != cudaSuccess) why = cudaGetErrorString(e);
    if (why.empty()) {
        e = cudaGraphInstantiate(&exec, graph, 0);
        if (e != cudaSuccess) {
            why = cudaGetErrorString(e);
            exec = nullptr;
        }
    }
    if (graph) cudaGraphDestroy(graph);
    if (why.empty() && scratch_moved(scratch)) why = "the GEMV scratch grew during capture";
    if (why.empty()) return true;
    cudaGetLastError();  // capture errors are not sticky
    std::fprintf(stderr, "peregrine: CUDA graph for the %s at %lld rows not used: %s\n", what,
                 static_cast<long long>(T), why.c_str());
    if (exec) cudaGraphExecDestroy(exec);
    exec = nullptr;
    failed = true;
    return false;
}

struct CudaBackend::MoeGraph : BlockGraph {};

struct CudaBackend::LayerGraph : BlockGraph {  // x_in / out: the streams h
    int64_t cap = 0;
    Tensor pre_in, pre_out;
    // What the layer leaves in the step's scratch for later layers (its selection, its candidate mask: the
    // DecodeSet's fixed buffers), set again at each replay.
    struct Leaves {
        std::shared_ptr<void> topk, topk_count, mask;
        int topk_k = 0, mask_ratio = 0;
        int64_t mask_stride = 0;
        explicit Leaves(const CudaScratch& s)
            : topk(s.topk), topk_count(s.topk_count), mask(s.mask), topk_k(s.topk_k), mask_ratio(s.mask_ratio),
              mask_stride(s.mask_stride) {}
        void to(CudaScratch& s) const {
            s.topk = topk, s.topk_count = topk_count, s.mask = mask;
            s.topk_k = topk_k, s.mask_ratio = mask_ratio, s.mask_stride = mask_stride;
        }
    };
    std::optional<Leaves> leaves;
};

void CudaBackend::set_graphs(bool on) {
    if (!on) drop_graphs();
    graphs_ = on;
}

void CudaBackend::set_balanced_routing(bool on) {
    if (on != balanced_routing_) drop_graphs();  // captured with the other routing
    balanced_routing_ = on;
}

void CudaBackend::drop_graphs() {
    if (moe_graphs_.empty() && layer_graphs_.empty()) return;
    PG_CUDA(cudaStreamSynchronize(0));
    moe_graphs_.clear();
    layer_graphs_.clear();
    for (void*& p : graph_scratch_) p = nullptr;
}

void CudaBackend::prepare_graph_scratch() {
    // The GEMV scratch moved (grown by a larger call): the captured graphs point at freed memory.
    if (graph_scratch_[0] && scratch_moved(graph_scratch_)) drop_graphs();
    if (!graph_scratch_[0]) {  // room for every decode-sized GEMV, so that no capture grows it
        graph_scratch_[0] = gemv_scratch(0, size_t(64) << 20, false);
        graph_scratch_[1] = gemv_scratch(1, size_t(4) << 20, true);
        graph_scratch_[2] = gemv_scratch(2, size_t(4) << 20, false);  // 32 staged rows of K up to ~61,000
    }
}

void CudaBackend::decoder_layer(const BlockWeight& b, const AttentionLayerInfo& info, ForwardBatch& batch,
                                StepScratch& scratch_base, Tensor& h, Tensor& pre) {
    auto& scratch = static_cast<CudaScratch&>(scratch_base);
    if (scratch.decode < 0) begin_decode(batch, scratch);
    if (scratch.decode == 1 && scratch.set && layer_graph(b, info, scratch, batch.token_ids, h, pre)) return;
    Backend::decoder_layer(b, info, batch, scratch, h, pre);
}

bool CudaBackend::layer_graph(const BlockWeight& b, const AttentionLayerInfo& info, CudaScratch& scratch,
                              const std::vector<int32_t>& ids, Tensor& h, Tensor& pre) {
    const int64_t T = h.dim(0);
    prepare_graph_scratch();
    auto& slot = layer_graphs_[{info.layer, T}];
    if (!slot || slot->cap != scratch.cap) {
        slot = std::make_shared<LayerGraph>();
        slot->cap = scratch.cap;
    }
    LayerGraph& g = *slot;
    if (g.failed) return false;
    if (!g.exec) {
        if (g.eager_runs++ == 0) return false;
        g.x_in = empty(DType::F32, h.shape());
        g.out = empty(DType::F32, h.shape());
        g.pre_in = empty(pre.dtype(), pre.shape());
        g.pre_out = empty(pre.dtype(), pre.shape());
        g.ids = device_alloc(sizeof(int32_t) * static_cast<size_t>(T));
        join_mixes(nullptr);  // no side-stream mix of earlier work in flight into the capture
        const auto* ids_d = static_cast<const int32_t*>(g.ids.get());
        const LayerBlocks blocks{[&](const Tensor& x) { return attention_decode(x, b.attn, info, scratch); },
                                 [&](const Tensor& x) {
                                     Tensor out = empty(DType::F32, {T, cfg_.dim});
                                     moe_body(x, b.ffn, ids_d, out);
                                     return out;
                                 }};
        if (!g.capture("decoder layer", T, graph_scratch_, [&] {
                Tensor hh = g.x_in, pp = g.pre_in;
                decoder_layer_ops(*this, b, format_.single_pass_mhc, blocks, hh, pp);
                PG_CUDA(cudaMemcpyAsync(g.out.raw(), hh.raw(), g.out.nbytes(), cudaMemcpyDeviceToDevice,
                                        launch_stream()));
                PG_CUDA(cudaMemcpyAsync(g.pre_out.raw(), pp.raw(), g.pre_out.nbytes(), cudaMemcpyDeviceToDevice,
                                        launch_stream()));
            }))
            return false;
        g.leaves.emplace(scratch);
        ++graph_captures_;
    } else {
        g.leaves->to(scratch);
    }
    PG_CUDA(cudaMemcpyAsync(g.x_in.raw(), h.raw(), h.nbytes(), cudaMemcpyDeviceToDevice, 0));
    PG_CUDA(cudaMemcpyAsync(g.pre_in.raw(), pre.raw(), pre.nbytes(), cudaMemcpyDeviceToDevice, 0));
    PG_CUDA(cudaMemcpyAsync(g.ids.get(), upload_ids(ids).ptr, sizeof(int32_t) * ids.size(), cudaMemcpyDeviceToDevice,
                            0));
    PG_CUDA(cudaGraphLaunch(g.exec, cudaStreamPerThread));
    h = empty(DType::F32, g.out.shape());
    PG_CUDA(cudaMemcpyAsync(h.raw(), g.out.raw(), g.out.nbytes(), cudaMemcpyDeviceToDevice, 0));
    pre = empty(g.pre_out.dtype(), g.pre_out.shape());
    PG_CUDA(cudaMemcpyAsync(pre.raw(), g.pre_out.raw(), g.pre_out.nbytes(), cudaMemcpyDeviceToDevice, 0));
    ++graph_replays_;
    return true;
}

bool CudaBackend::moe_graph(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids, Tensor& out) {
    const int64_t T = x.dim(0);
    const auto key = std::make_pair(static_cast<const void*>(w.experts.at(0).w1.w.raw()), T);
    prepare_graph_scratch();
    auto& slot = moe_graphs_[key];
    if (!slot) slot = std::make_shared<MoeGraph>();
    MoeGraph& g = *slot;
    if (g.failed) return false;
    if (!g.exec) {
        if (g.eager_runs++ == 0) return false;
        g.x_in = empty(DType::F32, {T, cfg_.dim});
        g.out = empty(DType::F32, {T, cfg_.dim});
        g.ids = device_alloc(sizeof(int32_t) * static_cast<size_t>(T));
        if (!g.capture("MoE block", T, graph_scratch_,
                       [&] { moe_body(g.x_in, w, static_cast<const int32_t*>(g.ids.get()), g.out); }))
            return false;
        ++graph_captures_;
    }
    PG_CUDA(cudaMemcpyAsync(g.x_in.raw(), x.raw(), x.nbytes(), cudaMemcpyDeviceToDevice, 0));
    PG_CUDA(
        cudaMemcpyAsync(g.ids.get(), upload_ids(ids).ptr, sizeof(int32_t) * ids.size(), cudaMemcpyDeviceToDevice, 0));
    PG_CUDA(cudaGraphLaunch(g.exec, cudaStreamPerThread));
    out = empty(DType::F32, {T, cfg_.dim});
    PG_CUDA(cudaMemcpyAsync(out.raw(), g.out.raw(), g.out.nbytes(), cudaMemcpyDeviceToDevice, 0));
    ++graph_replays_;
    return true;
}

}  // namespace peregrine::cuda
