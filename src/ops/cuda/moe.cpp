// Mixture of experts on the GPU without a host round trip: routing on the device, then every (row, slot)
// pair runs through its expert in one routed GEMM per projection (each row reads its own expert's FP4/FP8
// weights), clamped SwiGLU with the routing weight, and a combine in ascending expert order (cpu/moe.cpp).
// Fast numerics at prefill sizes with FP4 experts: gate and up (with the SwiGLU) in one grouped tensor-core
// pass and down in another, reading the packed weights directly (moe_gemm_fp4.cu);
// PEREGRINE_MOE_GEMM=cublas runs the three projections through run_linear (cuBLAS) instead.
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_stream.h"
#include "ops/cuda/moe_gemm_fp4.h"
#include "util/error.h"
#include "util/switches.h"

#include <map>

namespace peregrine::cuda {

// The grouped FP4 kernels: Fast numerics, prefill-sized routing (32-row tiles: more than 8 pairs per expert
// on average; fewer go to the GEMV), FP4 experts of supported shapes, and not switched off.
bool CudaBackend::use_grouped_fp4(const ExpertWeight& e0, const ExpertTables& tab, const LinearRouting& r) {
    if (numerics_ != Numerics::Fast || r.tile_rows == 8 || !tab.aligned16) return false;
    if (switch_is("PEREGRINE_MOE_GEMM", "cublas")) return false;
    if (e0.w1.kind != LinearWeight::Kind::FP4 || e0.w2.kind != LinearWeight::Kind::FP4 ||
        e0.w3.kind != LinearWeight::Kind::FP4 || e0.w1.act_block != e0.w3.act_block)
        return false;
    return fp4_grouped_supported(weights_.linear(e0.w1)) && fp4_grouped_supported(weights_.linear(e0.w2)) &&
           fp4_grouped_supported(weights_.linear(e0.w3));
}

// The router over device token ids: [T*K] experts and weights.
MoeRoute CudaBackend::route_rows(const Tensor& x, const MoEWeight& w, const int32_t* ids_d) {
    const int64_t T = x.dim(0);
    const int E = static_cast<int>(w.experts.size()), K = w.top_k;
    int score_func;
    if (cfg_.score_func == "softmax") score_func = 0;
    else if (cfg_.score_func == "sigmoid") score_func = 1;
    else score_func = 2;
    phase("moe.gate");
    Tensor logits = linear_.run(x, w.gate, nullptr, nullptr, /*bf16_acts=*/true);  // x: an rms_norm output
    phase("moe.route");
    MoeRoute r{empty(DType::I32, {T * K}), empty(DType::F32, {T * K})};
    (numerics_ == Numerics::Fast ? route_fast : route)(
        logits.f32(), T, E, K, score_func, w.bias.empty() ? nullptr : weights_.f32(w.bias),
        w.tid2eid.empty() ? nullptr : static_cast<const int64_t*>(weights_.raw(w.tid2eid)), ids_d,
        static_cast<int>(format_.route_norm), static_cast<float>(cfg_.route_scale), balanced_routing_,
        r.experts.data<int32_t>(), r.weights.f32());
    return r;
}

MoeRoute CudaBackend::moe_route(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids) {
    OpTimer op(*this, "moe");
    auto ids_d = upload_ids(ids);
    return route_rows(x, w, ids_d.ptr);
}

// Routed experts over `pairs` pairs whose rows are x's rows p / per_row (moe(): every token row feeds its
// top_k pairs; moe_experts(): one row per pair).
Tensor CudaBackend::routed_experts(const Tensor& x, int64_t pairs, int per_row, const MoEWeight& w, const int32_t* sel,
                                   const float* wsel) {
    phase("moe.routed_experts");
    const int D = cfg_.dim, E = static_cast<int>(w.experts.size());
    const float limit = static_cast<float>(cfg_.swiglu_limit);
    const int64_t T = x.dim(0);
    const ExpertTables& tab = weights_.experts(w);
    Routed routed;
    routed.row_expert = sel;
    routed.routing.tile_rows = routing_tile_rows(pairs, E);
    routed.routing.max_tiles =
        static_cast<unsigned>((pairs + routed.routing.tile_rows - 1) / routed.routing.tile_rows + E);
    auto row_map = device_alloc(sizeof(int32_t) * static_cast<size_t>(std::max<int64_t>(pairs, 1)));
    auto tiles = device_alloc(sizeof(int32_t) * 4 * routed.routing.max_tiles);
    auto n_tiles = device_alloc(sizeof(int32_t));
    expert_tiles(sel, pairs, E, routed.routing.tile_rows, static_cast<int32_t*>(row_map.get()),
                 static_cast<int32_t*>(tiles.get()), static_cast<int32_t*>(n_tiles.get()));
    routed.routing.row_map = static_cast<const int32_t*>(row_map.get());
    routed.routing.tiles = static_cast<const int32_t*>(tiles.get());
    routed.routing.n_tiles = static_cast<const int32_t*>(n_tiles.get());
    const ExpertWeight& e0 = *tab.first;
    const int I = e0.w1.out;
    if (use_grouped_fp4(e0, tab, routed.routing)) {
        // Token rows quantised once (act_quant is per row, so this is every pair row's quantisation), read by
        // pair p as row p / per_row.
        const LinearDev d1 = weights_.linear(e0.w1), d2 = weights_.linear(e0.w2);
        Tensor xq = empty(DType::F32, {T, D}), xs = empty(DType::F32, {T, D / d1.act_block});
        act_quant(x.f32(), T, D, d1.act_block, xq.f32(), xs.f32());
        Tensor a = empty(DType::F32, {pairs, I});
        fp4_grouped_swiglu(xq.f32(), xs.f32(), pairs, per_row, E, d1, tab.w1, tab.w3, routed.routing, wsel, limit,
                           a.f32());
        Tensor aq = empty(DType::F32, {pairs, I}), as = empty(DType::F32, {pairs, I / d2.act_block});
        act_quant(a.f32(), pairs, I, d2.act_block, aq.f32(), as.f32());
        Tensor ye = empty(DType::F32, {pairs, D});
        fp4_grouped_linear(aq.f32(), as.f32(), pairs, 1, E, d2, tab.w2, routed.routing, ye.f32());
        return ye;
    }
    Tensor xp = x;
    if (per_row != 1) {
        xp = empty(DType::F32, {pairs, D});
        gather_pairs(x.f32(), T, per_row, D, xp.f32());
    }
    // w1 and w3 of every expert in one GEMV launch at decode (their fixed cost paid once).
    auto [g, u] = linear_.run_pair(xp, e0.w1, e0.w3, false, &tab.w1, &tab.w3, &routed);
    Tensor a = empty(DType::F32, {pairs, I});
    swiglu(g.f32(), u.f32(), pairs, I, wsel, limit, a.f32());
    return linear_.run(a, e0.w2, &tab.w2, &routed);
}

Tensor CudaBackend::moe_experts(const Tensor& xp, const MoEWeight& w, const Tensor& experts, const Tensor& weights) {
    OpTimer op(*this, "moe");
    if (xp.dim(0) == 0) return empty(DType::F32, {0, cfg_.dim});
    return routed_experts(xp, xp.dim(0), 1, w, experts.data<int32_t>(), weights.f32());
}

// The shared expert of every row of x into ys [T, dim].
void CudaBackend::shared_expert(const Tensor& x, const MoEWeight& w, Tensor& ys) {
    phase("moe.shared+combine");
    const int64_t T = x.dim(0);
    auto [gs, us] = linear_.run_pair(x, w.shared.w1, w.shared.w3);
    const int Is = w.shared.w1.out;
    Tensor as = empty(DType::F32, {T, Is});
    swiglu(gs.f32(), us.f32(), T, Is, nullptr, static_cast<float>(cfg_.swiglu_limit), as.f32());
    linear_.run_into(as, w.shared.w2, ys);
}

// out[t] = bf16(sum of row t's pairs in ascending expert order + shared[t]).
void CudaBackend::combine_into(const Tensor& ye, const int32_t* sel, const Tensor& shared, int top_k, Tensor& out) {
    ::peregrine::cuda::moe_combine(ye.f32(), sel, shared.f32(), shared.dim(0), top_k, cfg_.dim, out.f32());
}

Tensor CudaBackend::moe_combine(const Tensor& x, const MoEWeight& w, const Tensor& ye, const Tensor& experts) {
    OpTimer op(*this, "moe");
    Tensor out = empty(DType::F32, {x.dim(0), cfg_.dim}), ys = empty(DType::F32, {x.dim(0), cfg_.dim});
    shared_expert(x, w, ys);
    combine_into(ye, experts.data<int32_t>(), ys, w.top_k, out);
    return out;
}

Tensor CudaBackend::moe(const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids) {
    OpTimer op(*this, "moe");
    const int64_t T = x.dim(0);
    if (graphs_ && !profiling_ && graph_bucket(T) &&
        routing_tile_rows(T * w.top_k, static_cast<int>(w.experts.size())) == 8) {
        Tensor out;
        if (moe_graph(x, w, ids, out)) return out;
    }
    auto ids_d = upload_ids(ids);
    Tensor out = empty(DType::F32, {T, cfg_.dim});
    moe_body(x, w, ids_d.ptr, out);
    return out;
}

// The shared expert reads only x, so at decode sizes it runs on a side stream of this thread, forked before the
// gate and joined before the combine: its GEMVs overlap the gate, the routing and the routed experts instead of
// following them. Up to 32 rows, where its linears are GEMVs (the side stream has a GEMV scratch set of its own;
// cuBLAS runs on the thread's stream); not while profiling, whose phases time the thread's stream. Its output is
// allocated on the thread's stream and its temporaries freed on the side stream before the join, so that a graph
// capture finds no side-stream work left unjoined.
SideStream& CudaBackend::side_experts() {
    thread_local std::map<int, SideStream> per_device;
    return per_device.try_emplace(gpu_, false).first->second;
}

// The whole block into `out` (captured as one graph at decode sizes, cuda_graphs.cpp).
void CudaBackend::moe_body(const Tensor& x, const MoEWeight& w, const int32_t* ids_d, Tensor& out) {
    const bool side = side_shared_on_ && numerics_ == Numerics::Fast && !profiling_ && x.dim(0) <= 32;
    Tensor ys = empty(DType::F32, {x.dim(0), cfg_.dim});
    if (side) {
        for (const LinearWeight* l : {&w.shared.w1, &w.shared.w3, &w.shared.w2})
            weights_.linear(*l);  // first-use uploads go to this thread's stream, before the fork
        side_experts().run([&] { shared_expert(x, w, ys); });
    }
    MoeRoute r = route_rows(x, w, ids_d);
    Tensor ye = routed_experts(x, x.dim(0) * w.top_k, w.top_k, w, r.experts.data<int32_t>(), r.weights.f32());
    if (side)
        side_experts().join();
    else
        shared_expert(x, w, ys);
    combine_into(ye, r.experts.data<int32_t>(), ys, w.top_k, out);
}

Tensor CudaBackend::to_host_copy(const Tensor& t) { return t.device() == Device::CUDA ? to_host(t) : t; }
Tensor CudaBackend::from_host_copy(const Tensor& host) {
    return host.device() == Device::CUDA ? host : to_device(host);
}

}  // namespace peregrine::cuda
