#pragma once
// RoPE frequencies with the official YaRN blend (the same table cpu/rope.cpp builds), for upload.
#include <vector>

namespace peregrine::cuda {

std::vector<float> rope_frequencies(int dim, double theta, int original_seq_len, double factor, double beta_fast,
                                    double beta_slow, bool arch_v41);

}  // namespace peregrine::cuda
