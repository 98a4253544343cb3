#include "ops/cpu/rope.h"
#include "ops/rounded_math.h"
#include "ops/attention_plan.h"
#include "tensor/dtype.h"


namespace peregrine::cpu {

Rope::Rope(int dim, double theta, int original_seq_len, double factor, double beta_fast, double beta_slow,
           YarnRamp ramp)
    : dim_(dim), freqs_(rope_frequencies(dim, theta, original_seq_len, factor, beta_fast, beta_slow, ramp)) {}

void Rope::apply(float* x, int64_t pos, bool inverse) const {
    const float p = static_cast<float>(pos);
    for (int i = 0; i < dim_ / 2; ++i) {
        float ang = p * freqs_[i];
        float c = cos_cr(ang), s = sin_cr(ang);
        if (inverse) s = -s;
        float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = round_bf16(a * c - b * s);
        x[2 * i + 1] = round_bf16(a * s + b * c);
    }
}

}  // namespace peregrine::cpu
