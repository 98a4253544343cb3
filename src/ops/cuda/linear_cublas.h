#pragma once
// Operand preparation for the cuBLAS GEMM path (linear_cublas.cpp): bf16 (or fp32) images of the quantised
// activations and weights with their power-of-two scales folded in, and the scatter of routed output rows.
#include "ops/cuda/kernels.h"

namespace peregrine::cuda::cublas_prep {

// a[r, k] = x[src, k] * xs[src, k / ab] (xs null: no scale), src = row_map ? row_map[row0 + r] : row0 + r,
// stored as bf16 (exact: x holds e4m3 or bf16 values) or fp32. K % 8 == 0, ab % 8 == 0.
void gather_activations(const float* x, const float* xs, int ab, int64_t rows, int K, const int32_t* row_map,
                        int64_t row0, bool to_bf16, void* a);

// Weight rows [n0, n0 + rows) of `w` with their block scales applied, as bf16 (exact for BF16/FP8/FP4) or
// fp32 (F32 kind), packed [rows, K]. With `slot_expert`, `slots` matrices: slot i is expert slot_expert[i]
// of the table (tw, ts), written at out + i * rows * K; otherwise one matrix from (base, scale).
void dequantise_weights(const LinearDev& w, const void* base, const uint8_t* scale, const void* const* tw,
                        const uint8_t* const* ts, const int32_t* slot_expert, int slots, int64_t n0, int64_t rows,
                        bool to_bf16, void* out);

// y[row_map[row0 + r], :] = ys[r, :] (rounded to bf16 when `round`), ys [rows, N].
void scatter_rows(const float* ys, int64_t rows, int N, const int32_t* row_map, int64_t row0, bool round, float* y);
// y[row_map[row0 + r], :] = ys[r, :] for bf16 ys [rows, N].
void scatter_rows_bf16(const uint16_t* ys, int64_t rows, int N, const int32_t* row_map, int64_t row0, float* y);
// y[r, c] (row stride ldy) = ys[r, c] (bf16, row stride ldys) for r < rows, c < cols.
void widen_bf16(const uint16_t* ys, int64_t rows, int64_t cols, int64_t ldys, float* y, int64_t ldy);

}  // namespace peregrine::cuda::cublas_prep
