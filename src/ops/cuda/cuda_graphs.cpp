// CUDA graphs for decode steps: a layer's MoE block and attention block at T rows are each captured once and
// replayed; their input rows (and the MoE's token ids) are first copied into the graph's fixed buffers, their output
// copied out.
// - The MoE block's launches (gate, routing, expert tiles, routed and shared experts, combine: about fifteen per
//   layer) depend only on T.
// - The attention block's (attention_decode.cpp: about thirty per layer) depend on T and the step's cap: it reads
//   the step's page tables and the selections of earlier layers from its DecodeSet's fixed buffers.
// The first call at each size runs eagerly, so that weights, tables and scratch buffers exist before capture
// (capture cannot upload). The blocks' temporaries are allocated inside the graph (stream-ordered allocation
// nodes). Captured kernels read the GEMV's grow-only scratch (gemv_scratch: split partials, tickets, staged
// activations): it is grown before the first capture, and every graph is dropped if any of it moves (a larger call
// elsewhere may grow it).
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
    Tensor x_in, out;  // [T, dim]
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

struct CudaBackend::MoeGraph : BlockGraph {
    std::shared_ptr<void> ids;  // [T] fixed token ids
};

struct CudaBackend::AttnGraph : BlockGraph {
    int64_t cap = 0;
    // What the block leaves in the step's scratch for later layers (its selection, its candidate mask: the
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
    if (moe_graphs_.empty() && attn_graphs_.empty()) return;
    PG_CUDA(cudaStreamSynchronize(0));
    moe_graphs_.clear();
    attn_graphs_.clear();
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

bool CudaBackend::attention_graph(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                                  CudaScratch& scratch, Tensor& out) {
    const int64_t T = x.dim(0);
    prepare_graph_scratch();
    auto& slot = attn_graphs_[{info.layer, T}];
    if (!slot || slot->cap != scratch.cap) {
        slot = std::make_shared<AttnGraph>();
        slot->cap = scratch.cap;
    }
    AttnGraph& g = *slot;
    if (g.failed) return false;
    if (!g.exec) {
        if (g.eager_runs++ == 0) return false;
        g.x_in = empty(DType::F32, {T, cfg_.dim});
        g.out = empty(DType::F32, {T, cfg_.dim});
        if (!g.capture("attention block", T, graph_scratch_, [&] {
                Tensor r = attention_decode(g.x_in, w, info, scratch);
                PG_CUDA(cudaMemcpyAsync(g.out.raw(), r.raw(), g.out.nbytes(), cudaMemcpyDeviceToDevice,
                                        launch_stream()));
            }))
            return false;
        g.leaves.emplace(scratch);
        ++graph_captures_;
    } else {
        g.leaves->to(scratch);
    }
    PG_CUDA(cudaMemcpyAsync(g.x_in.raw(), x.raw(), x.nbytes(), cudaMemcpyDeviceToDevice, 0));
    PG_CUDA(cudaGraphLaunch(g.exec, cudaStreamPerThread));
    out = empty(DType::F32, {T, cfg_.dim});
    PG_CUDA(cudaMemcpyAsync(out.raw(), g.out.raw(), g.out.nbytes(), cudaMemcpyDeviceToDevice, 0));
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
