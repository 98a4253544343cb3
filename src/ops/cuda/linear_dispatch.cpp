// Which kernel computes a linear, by numerics and size (LinearDispatch).
#include "ops/cuda/linear_dispatch.h"
#include "ops/cuda/device_memory.h"
#include "ops/cuda/linear_cublas.h"
#include "util/error.h"
#include "util/switches.h"

namespace peregrine::cuda {

bool LinearDispatch::use_gemv(const float* x, int64_t M, const LinearDev& d, const Routed* routed) const {
    // Decode-sized calls: dense M <= 32, or routed tiles of <= 8 rows. Dense FP8 calls take the GEMV only from 3 to
    // PEREGRINE_FP8_GEMV_ROWS (8) rows, one 8-row tile over an activation image staged once; below, each of its CTAs
    // quantises the rows itself, above it runs two tiles, and linear_wgmma is faster there
    // (docs/perf/h200-bench-engine.md).
    static const int fp8_rows = static_cast<int>(switch_int("PEREGRINE_FP8_GEMV_ROWS", 0, 32));
    return numerics_ == Numerics::Fast && linear_gemv_supported(d) && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           (routed ? routed->routing.tile_rows == 8
                   : M <= 32 && ((M >= 3 && M <= fp8_rows) || !use_wgmma(x, M, d)));
}

bool LinearDispatch::use_wgmma(const float* x, int64_t M, const LinearDev& d) const {
    return numerics_ == Numerics::Fast && linear_wgmma_supported(d, M) &&
           act_quant_bf16_supported(x, d.in, d.act_block);
}

bool LinearDispatch::takes_wgmma(const float* x, int64_t M, const LinearDev& d, const Routed* routed) const {
    return !routed && use_wgmma(x, M, d) && !(use_gemv(x, M, d, routed) && linear_gemv_quantises(d));
}

void LinearDispatch::gemm(const float* x, const float* xs, int64_t M, const LinearDev& d, float* y,
                          const ExpertTable* experts, const Routed* routed) {
    // Fast numerics, decode-sized calls: the memory-bound GEMV (xs null: it quantises the activations itself).
    if (use_gemv(x, M, d, routed)) {
        linear_gemv(x, xs, M, d, y, experts, routed ? &routed->routing : nullptr);
        return;
    }
    // Everything else on the tensor cores (cuBLAS): prefill-sized dense calls, routed calls with many rows
    // per expert (32-row tiles; see routing_tile_rows), and what the GEMV does not take.
    if (numerics_ == Numerics::Fast && linear_cublas_supported(d)) {
        linear_cublas(x, xs, M, d, y, experts, routed ? &routed->routing : nullptr);
        return;
    }
    if (numerics_ != Numerics::Reference && linear_tiled_supported(d))
        linear_tiled(x, xs, M, d, y, experts, routed ? &routed->routing : nullptr);
    else
        cuda::linear(x, xs, M, d, y, experts, routed ? routed->row_expert : nullptr);
}

namespace {
// bf16 activations with bf16-stored weights: exact products on the bf16 tensor cores (for F32 linears the sums stay
// fp32 and unrounded; only their order changes, as for the LM head).
bool takes_bf16_acts(const LinearWeight& w, bool bf16_acts) {
    return bf16_acts && (w.kind == LinearWeight::Kind::BF16 ||
                         (w.kind == LinearWeight::Kind::F32 && w.w.dtype() == DType::BF16));
}
}  // namespace

Tensor LinearDispatch::run(const Tensor& x, const LinearWeight& w, const ExpertTable* experts, const Routed* routed,
                           bool bf16_acts) {
    Tensor y = empty(DType::F32, {x.numel() / w.in, w.out});
    run_into(x, w, y, experts, routed, bf16_acts);
    return y;
}

void LinearDispatch::run_into(const Tensor& x, const LinearWeight& w, Tensor& y, const ExpertTable* experts,
                              const Routed* routed, bool bf16_acts) {
    const int64_t M = x.numel() / w.in;
    PEREGRINE_CHECK(y.numel() == M * w.out, "linear: output of {} values for {} x {}", y.numel(), M, w.out);
    LinearDev d = weights_.linear(w);
    d.bf16_acts = takes_bf16_acts(w, bf16_acts);
    const bool quantised = w.kind == LinearWeight::Kind::FP8 || w.kind == LinearWeight::Kind::FP4;
    if (quantised) {
        PEREGRINE_CHECK(w.act_block > 0 && w.in % w.act_block == 0,
                        "linear: input width {} is not a multiple of the activation block {}", w.in, w.act_block);
        if (use_gemv(x.f32(), M, d, routed) && linear_gemv_quantises(d)) {  // act_quant inside the GEMV
            linear_gemv(x.f32(), nullptr, M, d, y.f32(), experts, routed ? &routed->routing : nullptr);
            return;
        }
        // Decode batches outside the GEMV's rows: FP8 weights read as stored on the bf16 tensor cores.
        if (takes_wgmma(x.f32(), M, d, routed)) {
            linear_wgmma(x.f32(), M, d, y.f32());
            return;
        }
        static const bool fuse = switch_is("PEREGRINE_CUBLAS_QUANTISE", "1");
        if (fuse && !routed && !use_gemv(x.f32(), M, d, routed) && numerics_ == Numerics::Fast &&
            linear_cublas_supported(d) &&
            act_quant_bf16_supported(x.f32(), w.in, w.act_block)) {  // cuBLAS: quantised straight into its bf16 operand
            linear_cublas(x.f32(), nullptr, M, d, y.f32(), nullptr, nullptr);
            return;
        }
        Tensor xq = empty(DType::F32, {M, w.in}), xs = empty(DType::F32, {M, w.in / w.act_block});
        act_quant(x.f32(), M, w.in, w.act_block, xq.f32(), xs.f32());
        gemm(xq.f32(), xs.f32(), M, d, y.f32(), experts, routed);
    } else {
        gemm(x.f32(), nullptr, M, d, y.f32(), experts, routed);
    }
}

std::pair<Tensor, Tensor> LinearDispatch::run_pair(const Tensor& x, const LinearWeight& a, const LinearWeight& b,
                                                  bool bf16_acts, const ExpertTable* ea, const ExpertTable* eb,
                                                  const Routed* routed) {
    const int64_t M = x.numel() / a.in;
    LinearDev da = weights_.linear(a), db = weights_.linear(b);
    da.bf16_acts = takes_bf16_acts(a, bf16_acts);
    db.bf16_acts = takes_bf16_acts(b, bf16_acts);
    // The GEMV quantises FP8/FP4 activations itself; both must be decode-sized GEMV calls of one input width.
    const bool quantised = a.kind == LinearWeight::Kind::FP8 || a.kind == LinearWeight::Kind::FP4;
    if (a.in == b.in && a.kind == b.kind && use_gemv(x.f32(), M, da, routed) && use_gemv(x.f32(), M, db, routed) &&
        (!quantised || (linear_gemv_quantises(da) && linear_gemv_quantises(db)))) {
        Tensor ya = empty(DType::F32, {M, a.out}), yb = empty(DType::F32, {M, b.out});
        linear_gemv_pair(x.f32(), nullptr, M, da, ya.f32(), db, yb.f32(), ea, eb, routed ? &routed->routing : nullptr);
        return {std::move(ya), std::move(yb)};
    }
    // Both on linear_wgmma (as run() would send each): one quantisation of x and one launch.
    if (a.in == b.in && da.weight_block == db.weight_block && takes_wgmma(x.f32(), M, da, routed) &&
        takes_wgmma(x.f32(), M, db, routed)) {
        Tensor ya = empty(DType::F32, {M, a.out}), yb = empty(DType::F32, {M, b.out});
        linear_wgmma_pair(x.f32(), M, da, ya.f32(), &db, yb.f32());
        return {std::move(ya), std::move(yb)};
    }
    Tensor ya = run(x, a, ea, routed, bf16_acts);
    return {std::move(ya), run(x, b, eb, routed, bf16_acts)};
}

}  // namespace peregrine::cuda
