#pragma once
// Which kernel computes a linear y = x W^T, by numerics and size: the memory-bound decode GEMV (Fast numerics,
// decode-sized calls; linear_gemv.cu picks its kernel per stored format), FP8 weights on the bf16 tensor cores for
// dense calls of 1-2 and 9..256 rows (linear_wgmma.cu), cuBLAS on exact bf16 images of the quantised operands (Fast,
// prefill-sized), the tiled kernels with exact block sums (Exact), or the plain
// one-thread-per-output kernel (Reference). Quantised linears quantise their activations first, inside the GEMV,
// linear_wgmma or cuBLAS operand where those can.
#include "ops/cuda/kernels.h"
#include "ops/cuda/weight_cache.h"

#include <utility>

namespace peregrine::cuda {

// PEREGRINE_CUDA_NUMERICS: fast (default: tensor-core and memory-bound kernels summing in fp32; parity with the CPU
// reference within the fixtures' tolerances), exact (bit-identical to the CPU reference), reference (to A/B the
// tiled kernels).
enum class Numerics { Fast, Exact, Reference };

// How a routed GEMM finds each row's expert: per row (reference kernel) and grouped (tiled kernels).
struct Routed {
    const int* row_expert = nullptr;
    LinearRouting routing;
};

class LinearDispatch {
public:
    LinearDispatch(WeightCache& weights, Numerics numerics) : weights_(weights), numerics_(numerics) {}

    // y = x W^T for x [M, in] on the device; with experts, row m uses its expert's weights. bf16_acts: x holds bf16
    // values (BF16 weights may then run on the bf16 tensor cores: exact products).
    Tensor run(const Tensor& x, const LinearWeight& w, const ExpertTable* experts = nullptr,
               const Routed* routed = nullptr, bool bf16_acts = false);
    // The same into y [M, out] (allocated by the caller, e.g. on another stream than the call's).
    void run_into(const Tensor& x, const LinearWeight& w, Tensor& y, const ExpertTable* experts = nullptr,
                  const Routed* routed = nullptr, bool bf16_acts = false);
    // Two linears of the same input: one GEMV launch where both are decode-sized and alike (linear_gemv_pair), or
    // one linear_wgmma launch where both take it.
    // Routed: a's rows through experts ea, b's through eb, one routing (the experts' w1 and w3).
    std::pair<Tensor, Tensor> run_pair(const Tensor& x, const LinearWeight& a, const LinearWeight& b,
                                       bool bf16_acts = false, const ExpertTable* ea = nullptr,
                                       const ExpertTable* eb = nullptr, const Routed* routed = nullptr);
    // Whether a call takes the decode GEMV: Fast numerics, dense M <= 32 (FP8: 3..8) or routed tiles of <= 8 rows.
    bool use_gemv(const float* x, int64_t M, const LinearDev& d, const Routed* routed) const;
    // Whether a dense quantised call takes linear_wgmma (FP8 up to 256 rows, where the GEMV does not).
    bool use_wgmma(const float* x, int64_t M, const LinearDev& d) const;
    // The kernel call on activations already quantised (xs: their scales; null: the GEMV quantises them).
    void gemm(const float* x, const float* xs, int64_t M, const LinearDev& d, float* y, const ExpertTable* experts,
              const Routed* routed);
    Numerics numerics() const { return numerics_; }

private:
    // Whether a quantised call goes to linear_wgmma: dense, of its shapes, and not a GEMV call that quantises.
    bool takes_wgmma(const float* x, int64_t M, const LinearDev& d, const Routed* routed) const;
    WeightCache& weights_;
    Numerics numerics_;
};

}  // namespace peregrine::cuda
