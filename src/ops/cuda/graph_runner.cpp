#include "ops/cuda/graph_runner.h"
#include "ops/cuda/device_memory.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/launch_stream.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <unordered_set>
#include <vector>

namespace peregrine::cuda {

void* gemv_scratch(int which, size_t bytes, bool zero, int set);  // linear_gemv.cu

namespace {
constexpr int kScratchSets = 2, kScratchSlots = 3;  // gemv_common.cuh
bool scratch_moved(void* const (&captured)[kScratchSets][kScratchSlots]) {
    for (int set = 0; set < kScratchSets; ++set)
        for (int i = 0; i < kScratchSlots; ++i)
            if (gemv_scratch(i, 0, i == 1, set) != captured[set][i]) return true;
    return false;
}

// The nodes and edges of a captured graph; zeros where the runtime cannot list them. The edges are read with their
// data into room for four a node, doubled until they fit (a count alone could not say whether any is programmatic).
Diagnostics::GraphCensus census_of(cudaGraph_t graph) {
    Diagnostics::GraphCensus c;
    size_t n = 0;
    if (cudaGraphGetNodes(graph, nullptr, &n) != cudaSuccess) {
        cudaGetLastError();
        return c;
    }
    std::vector<cudaGraphNode_t> nodes(n), from, to;
    std::vector<cudaGraphEdgeData> data;
    if (cudaGraphGetNodes(graph, nodes.data(), &n) != cudaSuccess) {
        cudaGetLastError();
        return c;
    }
    size_t e = 0;
    for (size_t room = 4 * n + 16;; room *= 2) {
        from.resize(room), to.resize(room), data.resize(room);
        e = room;
        if (cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &e) != cudaSuccess) {
            cudaGetLastError();
            return c;
        }
        if (e < room) break;
    }
    std::unordered_set<cudaGraphNode_t> kernels;
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type{};
        if (cudaGraphNodeGetType(node, &type) == cudaSuccess && type == cudaGraphNodeTypeKernel) kernels.insert(node);
    }
    c.kernels = static_cast<int64_t>(kernels.size());
    c.other_nodes = static_cast<int64_t>(n) - c.kernels;
    for (size_t i = 0; i < e; ++i)
        if (kernels.count(from[i]) && kernels.count(to[i])) {
            ++c.kernel_edges;
            c.programmatic_edges += data[i].type == cudaGraphDependencyTypeProgrammatic;
        }
    return c;
}
}  // namespace

struct GraphRunner::Region {
    int64_t version = 0;
    int eager_runs = 0;
    bool failed = false;  // capture was not possible: this region stays eager
    cudaGraphExec_t exec = nullptr;
    std::vector<Tensor> in, out;  // the fixed buffers
    std::shared_ptr<void> ids;    // [rows] token ids
    std::shared_ptr<void> note;   // what the caller noted after the capture (Hooks)
    std::shared_ptr<CaptureArena> arena;  // the graph's temporaries
    ~Region() {
        if (exec) cudaGraphExecDestroy(exec);
    }
};

GraphRunner::~GraphRunner() { regions_.clear(); }

size_t GraphRunner::arena_bytes() const {
    size_t n = 0;
    for (const auto& [key, r] : regions_)
        if (r && r->arena) n += r->arena->bytes();
    return n;
}

void GraphRunner::drop(Kind kind, int64_t rows, int64_t seqs) {
    PG_CUDA(cudaStreamSynchronize(launch_stream()));
    for (auto it = regions_.begin(); it != regions_.end();) {
        const Key& k = it->first;
        it = k.kind == kind && k.rows == rows && k.seqs == seqs ? regions_.erase(it) : std::next(it);
    }
}

void GraphRunner::drop_all() {
    if (regions_.empty()) return;
    PG_CUDA(cudaStreamSynchronize(0));
    regions_.clear();
    for (auto& set : scratch_)
        for (void*& p : set) p = nullptr;
}

void GraphRunner::prepare_scratch() {
    // The GEMV scratch moved (grown by a larger call): the captured graphs point at freed memory.
    if (scratch_[0][0] && scratch_moved(scratch_)) drop_all();
    if (!scratch_[0][0]) {  // room for every decode-sized GEMV, so that no capture grows it; set 1: a side stream's
        for (int set = 0; set < kScratchSets; ++set) {
            scratch_[set][0] = gemv_scratch(0, size_t(64) << 20 >> (2 * set), false, set);
            scratch_[set][1] = gemv_scratch(1, size_t(4) << 20, true, set);
            scratch_[set][2] = gemv_scratch(2, size_t(4) << 20, false, set);  // 32 staged rows of K up to ~61,000
        }
    }
}

bool GraphRunner::capture(Region& r, const Key& key, const Body& body) {
    size_t& size = arena_sizes_[{key.kind, key.rows}];
    if (size == 0) size = size_t(16) << 20;
    std::string why;
    Diagnostics::GraphCensus census;
    for (int attempt = 0; attempt < 2; ++attempt) {
        if (r.exec) cudaGraphExecDestroy(r.exec);
        r.exec = nullptr;
        r.arena = std::make_shared<CaptureArena>(size);
        cudaGraph_t graph = nullptr;
        PG_CUDA(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal));
        why.clear();
        try {
            CaptureArena::Scope use(*r.arena);
            body(r.in, static_cast<const int32_t*>(r.ids.get()), r.out);
        } catch (const std::exception& e) {
            why = e.what();
        }
        cudaError_t e = cudaStreamEndCapture(cudaStreamPerThread, &graph);
        if (why.empty() && e != cudaSuccess) why = cudaGetErrorString(e);
        if (why.empty()) {
            census = census_of(graph);
            e = cudaGraphInstantiate(&r.exec, graph, 0);
            if (e != cudaSuccess) {
                why = cudaGetErrorString(e);
                r.exec = nullptr;
            }
        }
        if (graph) cudaGraphDestroy(graph);
        if (why.empty() && scratch_moved(scratch_)) why = "the GEMV scratch grew during capture";
        if (!why.empty() || r.arena->needed() <= r.arena->bytes()) break;
        size = (r.arena->needed() + (size_t(1) << 20) - 1) >> 20 << 20;  // too small: again, in one that fits
    }
    if (why.empty()) {
        census_.kernels += census.kernels;
        census_.other_nodes += census.other_nodes;
        census_.kernel_edges += census.kernel_edges;
        census_.programmatic_edges += census.programmatic_edges;
        return true;
    }
    cudaGetLastError();  // capture errors are not sticky
    std::fprintf(stderr, "peregrine: CUDA graph for the %s at %lld rows (%lld sequences) not used: %s\n",
                 key.kind == Kind::decoder_layers ? "decoder layers" : "MoE block", static_cast<long long>(key.rows),
                 static_cast<long long>(key.seqs), why.c_str());
    if (r.exec) cudaGraphExecDestroy(r.exec);
    r.exec = nullptr;
    r.arena.reset();
    r.failed = true;
    ++failed_captures_;
    return false;
}

bool GraphRunner::run(const Key& key, int64_t version, const std::vector<Tensor>& in, const int32_t* ids,
                      const std::vector<Tensor>& out_like, std::vector<Tensor>& out, const Body& body,
                      const Hooks& hooks) {
    prepare_scratch();
    auto& slot = regions_[key];
    if (!slot || slot->version != version) {
        slot = std::make_shared<Region>();
        slot->version = version;
    }
    Region& r = *slot;
    if (r.failed) return false;
    if (!r.exec) {
        if (r.eager_runs++ == 0) return false;
        for (const Tensor& t : in) r.in.push_back(empty(t.dtype(), t.shape()));
        for (const Tensor& t : out_like) r.out.push_back(empty(t.dtype(), t.shape()));
        r.ids = device_alloc(sizeof(int32_t) * static_cast<size_t>(key.rows));
        if (hooks.before_capture) hooks.before_capture();
        if (!capture(r, key, body)) return false;
        if (hooks.after_capture) hooks.after_capture(r.note);
        ++captures_;
    } else if (hooks.on_replay) {
        hooks.on_replay(r.note);
    }
    for (size_t i = 0; i < in.size(); ++i)
        PG_CUDA(cudaMemcpyAsync(r.in[i].raw(), in[i].raw(), in[i].nbytes(), cudaMemcpyDeviceToDevice, 0));
    PG_CUDA(cudaMemcpyAsync(r.ids.get(), ids, sizeof(int32_t) * static_cast<size_t>(key.rows),
                            cudaMemcpyDeviceToDevice, 0));
    PG_CUDA(cudaGraphLaunch(r.exec, cudaStreamPerThread));
    out.clear();
    for (const Tensor& t : r.out) {
        out.push_back(empty(t.dtype(), t.shape()));
        PG_CUDA(cudaMemcpyAsync(out.back().raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToDevice, 0));
    }
    ++replays_;
    return true;
}

}  // namespace peregrine::cuda
