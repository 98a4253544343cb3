#include "tensor/dtype.h"
#include "tensor/quant.h"

#include <cmath>
#include <gtest/gtest.h>

using namespace peregrine;

TEST(DType, Bf16RoundsToNearestEven) {
    EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0)
    EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
    // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): goes up
    EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
    EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
}

TEST(DType, E4M3TableAndRounding) {
    EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
    EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
    EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
    EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
    // every finite code round-trips
    for (int b = 0; b < 256; ++b) {
        float v = e4m3_to_f32(static_cast<uint8_t>(b));
        if (std::isnan(v)) continue;
        if (v == 0.0f) continue;
        EXPECT_EQ(f32_to_e4m3(v), b) << b;
    }
    EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7e);     // saturates
    EXPECT_EQ(round_e4m3(1.0625f), 1.0f);      // tie between 1 and 1.125 -> even mantissa (1.0)
    EXPECT_EQ(round_e4m3(1.1875f), 1.25f);     // tie between 1.125 and 1.25 -> 1.25
    EXPECT_EQ(round_e4m3(std::ldexp(1.0f, -10)), 0.0f);          // half the smallest subnormal -> 0
    EXPECT_EQ(round_e4m3(3 * std::ldexp(1.0f, -10)), std::ldexp(1.0f, -8));  // 1.5 sub-ulps -> 2
}

TEST(DType, E2M1TiesToEvenCode) {
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(0.25f)), 0.0f);
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(0.75f)), 1.0f);
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(1.25f)), 1.0f);
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(1.75f)), 2.0f);
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(2.5f)), 2.0f);
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(3.5f)), 4.0f);
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(5.0f)), 4.0f);
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-5.5f)), -6.0f);
    EXPECT_EQ(f32_to_e2m1(-0.1f), 8);
}

TEST(DType, E8M0) {
    EXPECT_EQ(e8m0_to_f32(127), 1.0f);
    EXPECT_EQ(e8m0_to_f32(130), 8.0f);
    EXPECT_EQ(e8m0_to_f32(120), std::ldexp(1.0f, -7));
}

TEST(Quant, Pow2ScaleFromBits) {
    // amax 448 -> exactly 1; a hair above -> 2
    EXPECT_EQ(pow2_round_scale(448.0f, 1.0f / 448.0f), 1.0f);
    EXPECT_EQ(pow2_round_scale(6.0f, 1.0f / 6.0f), 1.0f);
    EXPECT_EQ(pow2_round_scale(7.0f, 1.0f / 6.0f), 2.0f);
}

TEST(Quant, ActQuantFp8Block) {
    float x[32], q[32], s[1];
    for (int i = 0; i < 32; ++i) x[i] = (i - 16) * 0.37f;
    act_quant_fp8(x, 32, 32, q, s);
    // amax = 16*0.37 = 5.92 -> scale 2^ceil(log2(5.92/448)) = 2^-6
    EXPECT_EQ(s[0], std::ldexp(1.0f, -6));
    for (int i = 0; i < 32; ++i) EXPECT_EQ(q[i], round_e4m3(x[i] / s[0]));
}
