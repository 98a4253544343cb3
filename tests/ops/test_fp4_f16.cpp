// The FP4 kernels' bit placements and scale bits (src/ops/cuda/fp4_f16.h) on the host. Decode GEMV: every e2m1
// code at every position of a packed word comes out as its value x 2^-14 in fp4_act_pos's order, and the ue8m0
// scale bits are 2^(e - 113). Grouped wgmma GEMM: every code comes out as its value x 2^-126 in bf16, at the
// fragment position whose k slot holds the matching token value, and the scale pairs are 2^(e - 1). The kernels
// use these very functions, so a wrong shift or mask fails here without a GPU.
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

// bf16 bits -> float (exact).
float bf16_to_float(uint16_t h) {
    const uint32_t b = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
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
        EXPECT_EQ(half_to_float(h), e2m1_value(code) * std::ldexp(1.0f, -14))
            << "word " << std::hex << w << " position " << i;
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

TEST(Fp4F16, SlotOrderIsAPermutationAndItsInverse) {
    std::set<int> seen;
    for (int k = 0; k < 64; ++k) {
        seen.insert(wgmma_k_slot(k));
        EXPECT_EQ(wgmma_k_source(wgmma_k_slot(k)), k) << k;
    }
    EXPECT_EQ(seen.size(), 64u);
    EXPECT_EQ(*seen.rbegin(), 63);
}

// Every code of a thread's 16 (two words) at every position: the bf16 half of fragment f[s][h] at k 2t + 8h + j
// of step s is the value at k16 slot 16s + 2t + 8h + j, i.e. code wgmma_k_source(slot) - 16t, times 2^-126.
TEST(Fp4F16, WgmmaFragmentsHoldEachCodeAtItsSlot) {
    std::mt19937 g(11);
    auto check = [](uint32_t w0, uint32_t w1) {
        uint32_t f[4][2];
        fp4_wgmma_fragments(w0, w1, f);
        for (int t = 0; t < 4; ++t)
            for (int s = 0; s < 4; ++s)
                for (int h = 0; h < 2; ++h)
                    for (int j = 0; j < 2; ++j) {
                        const int v = wgmma_k_source(16 * s + 2 * t + 8 * h + j) - 16 * t;
                        ASSERT_TRUE(v >= 0 && v < 16) << "slot of another thread's k";
                        const int code = static_cast<int>(((v < 8 ? w0 : w1) >> (4 * (v % 8))) & 15);
                        const uint16_t b = static_cast<uint16_t>(f[s][h] >> (16 * j));
                        EXPECT_EQ(bf16_to_float(b), e2m1_value(code) * std::ldexp(1.0f, -126))
                            << "step " << s << " h " << h << " j " << j;
                        EXPECT_EQ(b >> 15, code >> 3) << "sign";
                    }
    };
    for (int i = 0; i < 8; ++i)
        for (int code = 0; code < 16; ++code) {
            const uint32_t w = (g() & ~(15u << (4 * i))) | (static_cast<uint32_t>(code) << (4 * i));
            check(w, g());
            check(g(), w);
        }
    for (int rep = 0; rep < 5000; ++rep) check(g(), g());
    check(0u, 0xffffffffu);
    check(0x88888888u, 0x77777777u);
}

TEST(Fp4F16, Bf16ScalePairsAreThePowerOfTwoTimes2Pow126) {
    for (uint32_t e = 0; e <= 128; ++e) {
        const uint32_t p = ue8m0_times_2p126_bf16x2(e);
        EXPECT_EQ(p >> 16, p & 0xffffu);
        EXPECT_EQ(bf16_to_float(static_cast<uint16_t>(p)), std::ldexp(1.0f, static_cast<int>(e) - 1)) << "e " << e;
    }
    // Above 128 the first factor stays 2^127; the kernel multiplies by 2^(e - 128) as well.
    EXPECT_EQ(bf16_to_float(static_cast<uint16_t>(ue8m0_times_2p126_bf16x2(200))), std::ldexp(1.0f, 127));
}
