#pragma once
// Rotary embedding on the last `dim` values of a head, adjacent pairs as complex numbers, with the
// official YaRN frequency blend for layers whose original_seq_len > 0.
#include "ops/model_format.h"

#include <cmath>
#include <vector>

namespace peregrine::cpu {

class Rope {
public:
    Rope() = default;
    Rope(int dim, double theta, int original_seq_len, double factor, double beta_fast, double beta_slow, YarnRamp ramp);

    // Rotates x[0..dim) (the rope tail) in place for position pos; inverse undoes a rotation. The result
    // is rounded to bf16, as the reference writes it back into bf16 storage.
    void apply(float* x, int64_t pos, bool inverse = false) const;
    int dim() const { return dim_; }

private:
    int dim_ = 0;
    std::vector<float> freqs_;
};

}  // namespace peregrine::cpu
