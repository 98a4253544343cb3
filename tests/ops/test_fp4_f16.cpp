// The decode GEMV's FP4 -> f16 bit placement and scale bits (src/ops/cuda/fp4_f16.h) on the host: every e2m1
// code at every position of a packed word comes out as its value x 2^-14 in fp4_act_pos's order, and the
// ue8m0 scale bits are 2^(e - 113). The kernels use these very functions, so a wrong shift or mask fails here
// without a GPU.
#include "ops/cuda/fp4_f16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>

using namespace peregrine::cuda;

namespace {

// IEEE half bits -> float (exact: every half is a float).
float half_to_float(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = std::ldexp(static_cast<float>(m), -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = std::ldexp(static_cast<float>(1024 + m), e - 25);
    return s ? -v : v;
}

float e2m1_value(int code) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

// The value at position i (0..7) of the word, read back from the f16 pairs: slot fp4_act_pos(i) of the 8 halves.
uint16_t half_at(const uint32_t (&p)[4], int i) {
    const int k = fp4_act_pos(i);
    return static_cast<uint16_t>(p[k / 2] >> (16 * (k % 2)));
}

void expect_word(uint32_t w) {
    uint32_t p[4];
    fp4x8_to_f16(w, p);
    for (int i = 0; i < 8; ++i) {
        const int code = static_cast<int>((w >> (4 * i)) & 15);
        const uint16_t h = half_at(p, i);
        EXPECT_EQ(half_to_float(h), e2m1_value(code) * std::ldexp(1.0f, -14)) << "word " << std::hex << w << " position " << i;
        EXPECT_EQ(h >> 15, code >> 3) << "sign, word " << std::hex << w << " position " << i;
        EXPECT_EQ(h & 0xff, 0) << "only the high byte is set";
    }
}

}  // namespace

TEST(Fp4F16, ByteSelectionMatchesTheDeviceSemantics) {
    // __byte_perm(a, b, s): result byte i is byte (s >> 4i) & 7 of the 8 bytes b:a.
    EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x1404u), 0x11440044u);
    EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x3424u), 0x33442244u);
    EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x7654u), 0x77665544u);
    EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x0123u), 0x00112233u);
}

TEST(Fp4F16, ActivationOrderIsAPermutationWithinEachGroupOfEight) {
    std::set<int> seen;
    for (int v = 0; v < 32; ++v) {
        const int q = fp4_act_pos(v);
        EXPECT_EQ(q / 8, v / 8) << v;
        seen.insert(q);
    }
    EXPECT_EQ(seen.size(), 32u);
    // Even values first, then odd: v0 v2 v4 v6 v1 v3 v5 v7.
    const int expect[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    for (int v = 0; v < 8; ++v) EXPECT_EQ(fp4_act_pos(v), expect[v]) << v;
}

TEST(Fp4F16, EveryCodeAtEveryPositionIsItsValueTimes2PowMinus14) {
    std::mt19937 g(7);
    for (int i = 0; i < 8; ++i)
        for (int code = 0; code < 16; ++code)
            for (int rep = 0; rep < 4; ++rep) {
                uint32_t w = g();
                w = (w & ~(15u << (4 * i))) | (static_cast<uint32_t>(code) << (4 * i));
                expect_word(w);
            }
    for (int rep = 0; rep < 20000; ++rep) expect_word(g());
    expect_word(0u);
    expect_word(0xffffffffu);
    expect_word(0x88888888u);  // eight negative zeros
}

TEST(Fp4F16, ScaleBitsAreThePowerOfTwoTimes2Pow14) {
    for (uint32_t e = 0; e <= 240; ++e) {
        const uint32_t bits = ue8m0_times_2p14_bits(e);
        float f;
        std::memcpy(&f, &bits, 4);
        EXPECT_EQ(f, std::ldexp(1.0f, static_cast<int>(e) - 127 + 14)) << "e " << e;
    }
}
