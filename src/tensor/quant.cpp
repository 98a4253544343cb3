#include "tensor/quant.h"
#include "tensor/dtype.h"

#include <algorithm>
#include <cmath>

namespace peregrine {

float pow2_round_scale(float amax, float max_inv) {
    uint32_t bits = f32_to_bits(amax * max_inv);
    int32_t exp = static_cast<int32_t>((bits >> 23) & 0xff);
    uint32_t man = bits & 0x7fffffu;
    int32_t log2_ceil = exp - 127 + (man != 0 ? 1 : 0);
    return bits_to_f32(static_cast<uint32_t>(log2_ceil + 127) << 23);
}

static float block_amax(const float* x, int n) {
    float a = 0.0f;
    for (int i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
    return a;
}

static const float kFp8MaxInv = 1.0f / 448.0f;
static const float kFp4MaxInv = 1.0f / 6.0f;

void act_quant_fp8(const float* x, int n, int block, float* q, float* scales) {
    for (int b = 0; b * block < n; ++b) {
        const float* xb = x + b * block;
        float s = pow2_round_scale(std::max(block_amax(xb, block), 1e-4f), kFp8MaxInv);
        scales[b] = s;
        for (int i = 0; i < block; ++i) {
            float v = std::clamp(xb[i] / s, -448.0f, 448.0f);
            q[b * block + i] = round_e4m3(v);
        }
    }
}

void qdq_fp8(float* x, int n, int block) {
    for (int b = 0; b * block < n; ++b) {
        float* xb = x + b * block;
        float s = pow2_round_scale(std::max(block_amax(xb, block), 1e-4f), kFp8MaxInv);
        for (int i = 0; i < block; ++i) xb[i] = round_bf16(round_e4m3(std::clamp(xb[i] / s, -448.0f, 448.0f)) * s);
    }
}

void qdq_fp4_ue8m0(float* x, int n, int block) {
    const float floor_amax = 6.0f * std::ldexp(1.0f, -126);
    for (int b = 0; b * block < n; ++b) {
        float* xb = x + b * block;
        float s = pow2_round_scale(std::max(block_amax(xb, block), floor_amax), kFp4MaxInv);
        for (int i = 0; i < block; ++i)
            xb[i] = round_bf16(e2m1_to_f32(f32_to_e2m1(std::clamp(xb[i] / s, -6.0f, 6.0f))) * s);
    }
}

void qdq_fp4_e4m3(float* x, int n, int block) {
    const float floor_amax = 6.0f * std::ldexp(1.0f, -9);
    for (int b = 0; b * block < n; ++b) {
        float* xb = x + b * block;
        float s = round_e4m3(std::max(block_amax(xb, block), floor_amax) / 6.0f);
        for (int i = 0; i < block; ++i)
            xb[i] = round_bf16(e2m1_to_f32(f32_to_e2m1(std::clamp(xb[i] / s, -6.0f, 6.0f))) * s);
    }
}

void round_row_bf16(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

}  // namespace peregrine
