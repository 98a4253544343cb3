#pragma once
// Exact decoding of packed state entries (kv/entry_format.h) into bf16 on the integer pipe: the codes' bits are
// placed into bf16 bits (a power-of-two multiple of their value), then one or two bf16x2 multiplies apply the
// scale and the power of two. The conversion pipe (16 results a clock per SM) is not used, where decoding through
// floats (sf_e4m3 / sf_e2m1, a multiply, a packed conversion) took a conversion or two per value. Every product is
// exact (codes carry at most 4 significant bits, scales are powers of two or e4m3 values), so the results are the
// bf16 values of sf_e4m3(code) x scale and sf_e2m1(code) x scale bit for bit, except for the e4m3 NaN code
// (0x7f / 0xff), which no quantised entry holds. Host and device share these functions, so
// tests/ops/test_entry_decode.cpp checks every code and scale without a GPU.
#include "kv/entry_format.h"
#include "ops/cuda/fp4_f16.h"
#include "util/host_device.h"

#include <cstdint>
#include <cstring>

namespace peregrine::cuda {

// a x b on bf16 pairs, rounded to nearest even (exact here). The device's mul.rn.bf16x2 keeps subnormals.
PEREGRINE_HD uint32_t mul_bf16x2_rn(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    uint32_t r = 0;
    for (int h = 0; h < 2; ++h) {
        const uint32_t x = ((a >> (16 * h)) & 0xffffu) << 16, y = ((b >> (16 * h)) & 0xffffu) << 16;
        float fx, fy;
        std::memcpy(&fx, &x, 4);
        std::memcpy(&fy, &y, 4);
        const float p = fx * fy;
        uint32_t u;
        std::memcpy(&u, &p, 4);
        u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // round to nearest even (finite values)
        r |= (u & 0xffffu) << (16 * h);
    }
    return r;
#endif
}

// 2^e as bf16 in both halves, -126 <= e <= 127.
PEREGRINE_HD uint32_t pow2_bf16x2(int e) {
    const uint32_t b = static_cast<uint32_t>(e + 127) << 7;
    return b | (b << 16);
}

// Four e4m3 codes (low byte first) as two bf16 pairs, (c0, c1) and (c2, c3), each value x 2^-120: the sign goes
// to bit 15 and the other seven bits to bits 4..10 (subnormal codes land in the bf16 subnormals, at the same
// ratio). A byte permute spreads each pair's codes to bits 0..7 and 16..23.
PEREGRINE_HD void e4m3x4_to_bf16(uint32_t w, uint32_t (&o)[2]) {
    const uint32_t lo = byte_perm(w, 0u, 0x4140), hi = byte_perm(w, 0u, 0x4342);
    o[0] = ((lo << 4) & 0x07f007f0u) | ((lo << 8) & 0x80008000u);
    o[1] = ((hi << 4) & 0x07f007f0u) | ((hi << 8) & 0x80008000u);
}

// Eight e2m1 codes (low nibble first) as four bf16 pairs (v0, v1) .. (v6, v7), each value x 2^-126: the nibble
// s.ee.m becomes s.000000ee.m000000 (ee = 0: the subnormals, 0.5 -> 2^-127).
PEREGRINE_HD void e2m1x8_to_bf16(uint32_t w, uint32_t (&o)[4]) {
    for (int j = 0; j < 4; ++j) {
        const uint32_t x = (w >> (8 * j)) & 0xffu;
        o[j] = ((x & 7u) << 6) | ((x & 8u) << 12) | ((x & 0x70u) << 18) | ((x & 0x80u) << 24);
    }
}

// The factors that turn placed codes into values times their scale: f1 always, f2 when two == true.
struct ScaleFactors {
    uint32_t f1, f2;
    bool two;
};

// e4m3 codes (x 2^-120) times the ue8m0 scale 2^(e - 127): 2^(e - 7), split when that leaves bf16's range.
PEREGRINE_HD ScaleFactors e4m3_ue8m0_factors(uint32_t e) {
    if (e <= 134) return {pow2_bf16x2(static_cast<int>(e) - 7), 0u, false};
    return {pow2_bf16x2(127), pow2_bf16x2(static_cast<int>(e) - 134), true};
}

// e2m1 codes (x 2^-126) times the ue8m0 scale 2^(e - 127): 2^(e - 1), split when that leaves bf16's range.
PEREGRINE_HD ScaleFactors e2m1_ue8m0_factors(uint32_t e) {
    if (e <= 128) return {pow2_bf16x2(static_cast<int>(e) - 1), 0u, false};
    return {pow2_bf16x2(127), pow2_bf16x2(static_cast<int>(e) - 128), true};
}

// e2m1 codes (x 2^-126) times an e4m3 scale: 2^63, then the scale x 2^63 (exact in bf16: 4 significant bits).
PEREGRINE_HD ScaleFactors e2m1_e4m3_factors(uint8_t s) {
    const float v = sf_e4m3(s) * 9223372036854775808.0f;  // x 2^63
    uint32_t u;
    std::memcpy(&u, &v, 4);
    const uint32_t b = u >> 16;
    return {pow2_bf16x2(63), b | (b << 16), true};
}

PEREGRINE_HD uint32_t apply(const ScaleFactors& f, uint32_t x) {
    x = mul_bf16x2_rn(x, f.f1);
    return f.two ? mul_bf16x2_rn(x, f.f2) : x;
}

}  // namespace peregrine::cuda
