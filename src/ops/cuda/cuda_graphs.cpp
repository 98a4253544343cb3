// CUDA graphs for the decode-sized MoE block. The block's launches (gate, routing, expert tiles, routed and
// shared experts, combine: about fifteen per layer) depend only on the batch's row count, so a layer's block at
// T rows is captured once and replayed: its input rows and token ids are first copied into the graph's fixed
// buffers, its output copied out. The first call at each (layer, T) runs eagerly, so that weights, expert
// tables and scratch buffers exist before capture (capture cannot upload). The block's temporaries are
// allocated inside the graph (stream-ordered allocation nodes). Captured kernels read the GEMV's grow-only
// scratch (gemv_scratch: split partials, tickets, staged activations): it is grown before the first capture, and
// every graph is dropped if any of it moves (a larger call elsewhere, e.g. the attention's projections at a new
// batch size, may grow it).
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_check.h"
#include "util/error.h"

#include <cuda_runtime.h>

#include <cstdio>

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

struct CudaBackend::MoeGraph {
    int eager_runs = 0;
    bool failed = false;  // capture was not possible: this layer and size stay eager
    cudaGraphExec_t exec = nullptr;
    Tensor x_in, out;           // [T, dim] fixed input and output rows
    std::shared_ptr<void> ids;  // [T] fixed token ids
    MoeGraph() = default;
    MoeGraph(const MoeGraph&) = delete;
    MoeGraph& operator=(const MoeGraph&) = delete;
    ~MoeGraph() {
        if (exec) cudaGraphExecDestroy(exec);
    }
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
    if (moe_graphs_.empty()) return;
    PG_CUDA(cudaStreamSynchronize(0));
    moe_graphs_.clear();
    for (void*& p : graph_scratch_) p = nullptr;
}

bool CudaBackend::moe_graph(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids, Tensor& out) {
    const int64_t T = x.dim(0);
    const auto key = std::make_pair(static_cast<const void*>(w.experts.at(0).w1.w.raw()), T);
    // The GEMV scratch moved (grown by a larger call): the captured graphs point at freed memory.
    if (!moe_graphs_.empty() && graph_scratch_[0] && scratch_moved(graph_scratch_)) drop_graphs();
    auto& slot = moe_graphs_[key];
    if (!slot) slot = std::make_shared<MoeGraph>();
    MoeGraph& g = *slot;
    if (g.failed) return false;
    if (!g.exec) {
        if (g.eager_runs++ == 0) return false;
        if (!graph_scratch_[0]) {  // room for every decode-sized GEMV, so that no capture grows it
            graph_scratch_[0] = gemv_scratch(0, size_t(64) << 20, false);
            graph_scratch_[1] = gemv_scratch(1, size_t(4) << 20, true);
            graph_scratch_[2] = gemv_scratch(2, size_t(4) << 20, false);  // 32 staged rows of K up to ~61,000
        }
        g.x_in = empty(DType::F32, {T, cfg_.dim});
        g.out = empty(DType::F32, {T, cfg_.dim});
        g.ids = device_alloc(sizeof(int32_t) * static_cast<size_t>(T));
        cudaGraph_t graph = nullptr;
        PG_CUDA(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal));
        std::string why;
        try {
            moe_body(g.x_in, w, static_cast<const int32_t*>(g.ids.get()), g.out);
        } catch (const std::exception& e) {
            why = e.what();
        }
        cudaError_t e = cudaStreamEndCapture(cudaStreamPerThread, &graph);
        if (why.empty() && e != cudaSuccess) why = cudaGetErrorString(e);
        if (why.empty()) {
            e = cudaGraphInstantiate(&g.exec, graph, 0);
            if (e != cudaSuccess) {
                why = cudaGetErrorString(e);
                g.exec = nullptr;
            }
        }
        if (graph) cudaGraphDestroy(graph);
        if (why.empty() && scratch_moved(graph_scratch_)) why = "the GEMV scratch grew during capture";
        if (!why.empty()) {
            cudaGetLastError();  // capture errors are not sticky
            std::fprintf(stderr, "peregrine: CUDA graph for the MoE block at %lld rows not used: %s\n",
                         static_cast<long long>(T), why.c_str());
            if (g.exec) cudaGraphExecDestroy(g.exec);
            g.exec = nullptr;
            g.failed = true;
            return false;
        }
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
