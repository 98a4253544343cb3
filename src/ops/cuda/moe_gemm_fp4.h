#pragma once
// Routed FP4 expert GEMMs that read the packed e2m1 weights directly (moe_gemm_fp4_wgmma.cu on wgmma, or
// moe_gemm_fp4.cu on mma.sync): bf16 tensor cores with fp32 accumulation, the weights dequantised exactly on
// their way into the fragments, no host synchronisation. Same contract as the routed linear_tiled call (rows
// of pair p = row_map order of the routing; output row p rounded to bf16), with the activation row of pair p
// read at x[p / div] (div = top-k lets the experts read the token rows without a per-pair copy; div = 1 for
// pair rows). E: the experts of the layer (ids in the routing are < E).
#include "ops/cuda/kernels.h"

namespace peregrine::cuda {

// Which kernel runs: wgmma (the default; `PEREGRINE_MOE_GEMM=mma` picks the mma.sync one) where the shape
// allows (in % 128 == 0; out % 256 == 0, gated out % 128 == 0), else mma.sync. Tests switch it to compare both.
void fp4_grouped_use_wgmma(bool on);
bool fp4_grouped_wgmma();
// The wgmma kernel's token tile: 64 or 128 rows, or 0 (the default): 128 once the experts average 128 rows
// (`PEREGRINE_MOE_GEMM_TOKENS=64|128` fixes it).
void fp4_grouped_wgmma_tile(int tokens);
int fp4_grouped_wgmma_tile();

// FP4 weights with in % 128 == 0 and out % 128 == 0 (V4.1-Flash experts: 5120 <-> 2304).
bool fp4_grouped_supported(const LinearDev& w);

// y[p, :] = bf16(xq[p / div] W_e^T) for the M pairs p of the routing (e = the pair's expert); x holds e4m3
// values with ue8m0 scales xs per act_block (act_quant). `w` gives the shared shapes and formats.
void fp4_grouped_linear(const float* x, const float* xs, int64_t M, int div, int E, const LinearDev& w,
                        const ExpertTable& experts, const LinearRouting& r, float* y);

// Gate and up in one pass: out[p, n] = bf16(route_w[p] * silu(g) * u) with g = bf16(xq W1_e^T)[n] clamped
// above at `limit`, u = bf16(xq W3_e^T)[n] clamped to +-limit (limit <= 0: no clamp), as swiglu() computes it.
void fp4_grouped_swiglu(const float* x, const float* xs, int64_t M, int div, int E, const LinearDev& w1,
                        const ExpertTable& e1, const ExpertTable& e3, const LinearRouting& r, const float* route_w,
                        float limit, float* out);

}  // namespace peregrine::cuda
