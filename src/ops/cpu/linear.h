#pragma once
// Reference GEMMs for the weight formats of the released checkpoints (x: [M, in] row-major floats).
#include "ops/weights.h"

namespace peregrine::cpu {

// y[M, out] = x W^T following the official kernels' numerics: FP8/FP4 weights take e4m3-quantised
// activations (ue8m0 scale per act_block), each K block is summed exactly and added in K order in fp32
// after scaling; the output is rounded to bf16. BF16: bf16 output. F32: fp32 output.
void linear(const float* x, int64_t M, const LinearWeight& w, float* y);

// Dot product accumulated in double and rounded once to float (an exactly rounded block sum).
inline float dot_exact(const float* a, const float* b, int n) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
    return static_cast<float>(s);
}

}  // namespace peregrine::cpu
