#pragma once
// Activation quantisation exactly as the official kernels do it (V4/V4.1 QAT semantics).
// Inputs are bf16 values held in float; every function works on one row, in blocks.
#include <cstdint>

namespace peregrine {

// 2^ceil(log2(amax * max_inv)) from the IEEE bits (exponent + (mantissa != 0)), as the kernels compute it.
float pow2_round_scale(float amax, float max_inv);

// FP8 e4m3 with a power-of-two (ue8m0) scale per block: q holds the e4m3 values (as float),
// scales[n / block] the scales. amax is floored at 1e-4.
void act_quant_fp8(const float* x, int n, int block, float* q, float* scales);
// Quantise and dequantise in place, rounding the result to bf16 (window-KV QAT).
void qdq_fp8(float* x, int n, int block);

// FP4 e2m1 with ue8m0 scales (indexer q/k; amax floored at 6*2^-126), quantise-dequantise in place to bf16.
void qdq_fp4_ue8m0(float* x, int n, int block);
// FP4 e2m1 with e4m3 scales = e4m3(amax/6) (compressed KV; amax floored at 6*2^-9), in place to bf16.
void qdq_fp4_e4m3(float* x, int n, int block);

// In-place rounding of a row to bf16.
void round_row_bf16(float* x, int64_t n);

}  // namespace peregrine
