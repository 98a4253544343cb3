#include "ops/cpu/linear.h"
#include "tensor/quant.h"
#include "util/error.h"
#include "util/thread_pool.h"

#include <algorithm>
#include <vector>

namespace peregrine::cpu {

namespace {

constexpr int kTileRows = 16;  // weight rows decoded at a time and reused for every input row

// Decodes weight rows [n0, n1) to float values (without their scales for FP8/FP4).
void decode_rows(const LinearWeight& w, int n0, int n1, float* out) {
    const int K = w.in;
    for (int n = n0; n < n1; ++n) {
        float* o = out + static_cast<size_t>(n - n0) * K;
        switch (w.kind) {
            case LinearWeight::Kind::F32: {  // fp32 compute; the stored weights may be bf16
                if (w.w.dtype() == DType::BF16) {
                    const uint16_t* src = w.w.data<uint16_t>() + static_cast<size_t>(n) * K;
                    for (int k = 0; k < K; ++k) o[k] = bf16_to_f32(src[k]);
                } else {
                    const float* src = w.w.data<float>() + static_cast<size_t>(n) * K;
                    std::copy(src, src + K, o);
                }
                break;
            }
            case LinearWeight::Kind::BF16: {
                const uint16_t* src = w.w.data<uint16_t>() + static_cast<size_t>(n) * K;
                for (int k = 0; k < K; ++k) o[k] = bf16_to_f32(src[k]);
                break;
            }
            case LinearWeight::Kind::FP8: {
                const uint8_t* src = w.w.data<uint8_t>() + static_cast<size_t>(n) * K;
                for (int k = 0; k < K; ++k) o[k] = e4m3_to_f32(src[k]);
                break;
            }
            case LinearWeight::Kind::FP4: {
                const uint8_t* src = w.w.data<uint8_t>() + static_cast<size_t>(n) * (K / 2);
                for (int k = 0; k < K / 2; ++k) {
                    o[2 * k] = e2m1_to_f32(src[k] & 0xf);
                    o[2 * k + 1] = e2m1_to_f32(src[k] >> 4);
                }
                break;
            }
        }
    }
}

}  // namespace

void linear(const float* x, int64_t M, const LinearWeight& w, float* y) {
    const int K = w.in, N = w.out;
    const bool quantised = w.kind == LinearWeight::Kind::FP8 || w.kind == LinearWeight::Kind::FP4;
    // Quantise the activations once (e4m3 values + one scale per act_block).
    std::vector<float> xq, xs;
    const float* a = x;
    int ab = w.act_block;
    if (quantised) {
        PEREGRINE_CHECK(ab > 0 && K % ab == 0, "linear: input width {} is not a multiple of the activation block {}", K,
                        ab);
        xq.resize(static_cast<size_t>(M) * K);
        xs.resize(static_cast<size_t>(M) * (K / ab));
        parallel_for(M, [&](int64_t m0, int64_t m1) {
            for (int64_t m = m0; m < m1; ++m)
                act_quant_fp8(x + m * K, K, ab, xq.data() + m * K, xs.data() + m * (K / ab));
        }, 8);
        a = xq.data();
    }
    const int n_tiles = (N + kTileRows - 1) / kTileRows;
    parallel_for(n_tiles, [&](int64_t t0, int64_t t1) {
        std::vector<float> wt(static_cast<size_t>(kTileRows) * K);
        for (int64_t t = t0; t < t1; ++t) {
            int n0 = static_cast<int>(t) * kTileRows, n1 = std::min(N, n0 + kTileRows);
            decode_rows(w, n0, n1, wt.data());
            for (int64_t m = 0; m < M; ++m) {
                const float* am = a + m * K;
                for (int n = n0; n < n1; ++n) {
                    const float* wn = wt.data() + static_cast<size_t>(n - n0) * K;
                    float out = 0.0f;
                    switch (w.kind) {
                        case LinearWeight::Kind::F32:
                            out = dot_exact(am, wn, K);
                            break;
                        case LinearWeight::Kind::BF16:
                            out = round_bf16(dot_exact(am, wn, K));
                            break;
                        case LinearWeight::Kind::FP8: {
                            const int b = w.weight_block;
                            const uint8_t* ws =
                                w.scale.data<uint8_t>() + static_cast<size_t>(n / b) * ((K + b - 1) / b);
                            const float* as = xs.data() + m * (K / ab);
                            float acc = 0.0f;
                            for (int kb = 0; kb < K / b; ++kb)
                                acc += dot_exact(am + kb * b, wn + kb * b, b) * as[kb] * e8m0_to_f32(ws[kb]);
                            out = round_bf16(acc);
                            break;
                        }
                        case LinearWeight::Kind::FP4: {
                            const uint8_t* ws = w.scale.data<uint8_t>() + static_cast<size_t>(n) * (K / 32);
                            const float* as = xs.data() + m * (K / ab);
                            const int per = ab / 32;
                            float acc = 0.0f;
                            for (int kb = 0; kb < K / 32; ++kb)
                                acc += dot_exact(am + kb * 32, wn + kb * 32, 32) * as[kb / per] * e8m0_to_f32(ws[kb]);
                            out = round_bf16(acc);
                            break;
                        }
                    }
                    y[m * N + n] = out;
                }
            }
        }
    });
}

}  // namespace peregrine::cpu
