// The packed-entry decoding of the sparse attention kernels (src/ops/cuda/entry_decode.h) on the host: every e4m3
// code under every ue8m0 scale, every e2m1 code under every ue8m0 and e4m3 scale, at every position of a packed
// word, gives the bf16 bits of the float decoding (sf_e4m3 / sf_e2m1 times the scale, rounded to bf16). The
// kernels use these very functions, so a wrong shift or mask fails here without a GPU.
#include "ops/cuda/entry_decode.h"
#include "kv/entry_format.h"
#include "tensor/dtype.h"

#include <gtest/gtest.h>

#include <cstdint>

using namespace peregrine;
using namespace peregrine::cuda;

namespace {

uint16_t bf16_bits(float x) { return static_cast<uint16_t>(float_bits(round_bf16(x)) >> 16); }

bool e4m3_nan(uint32_t c) { return (c & 0x7f) == 0x7f; }

TEST(EntryDecode, E4m3UnderUe8m0) {
    int64_t checked = 0;
    for (uint32_t e = 0; e < 255; ++e) {
        const ScaleFactors f = e4m3_ue8m0_factors(e);
        for (uint32_t c = 0; c < 256; ++c) {
            if (e4m3_nan(c)) continue;
            const uint16_t want = bf16_bits(sf_e4m3(static_cast<uint8_t>(c)) * sf_ue8m0(static_cast<uint8_t>(e)));
            for (int pos = 0; pos < 4; ++pos) {
                const uint32_t w = (c << (8 * pos)) | (pos == 0 ? 0x3a000000u : 0x3au);  // a neighbour in another byte
                uint32_t v[2];
                e4m3x4_to_bf16(w, v);
                const uint32_t got = apply(f, v[pos / 2]);
                ASSERT_EQ((got >> (16 * (pos % 2))) & 0xffffu, want)
                    << "code " << c << " scale " << e << " pos " << pos;
                ++checked;
            }
        }
    }
    EXPECT_EQ(checked, 255 * 254 * 4);
}

TEST(EntryDecode, E2m1UnderUe8m0AndE4m3) {
    for (int kind = 0; kind < 2; ++kind)
        for (uint32_t s = 0; s < 255; ++s) {
            if (kind == 1 && e4m3_nan(s)) continue;
            const float scale = kind == 0 ? sf_ue8m0(static_cast<uint8_t>(s)) : sf_e4m3(static_cast<uint8_t>(s));
            const ScaleFactors f = kind == 0 ? e2m1_ue8m0_factors(s) : e2m1_e4m3_factors(static_cast<uint8_t>(s));
            for (uint32_t c = 0; c < 16; ++c) {
                const uint16_t want = bf16_bits(sf_e2m1(static_cast<uint8_t>(c)) * scale);
                for (int pos = 0; pos < 8; ++pos) {
                    const uint32_t w = (c << (4 * pos)) | (pos == 0 ? 0x50000000u : 0x5u);
                    uint32_t v[4];
                    e2m1x8_to_bf16(w, v);
                    const uint32_t got = apply(f, v[pos / 2]);
                    ASSERT_EQ((got >> (16 * (pos % 2))) & 0xffffu, want)
                        << (kind ? "e4m3" : "ue8m0") << " scale " << s << " code " << c << " pos " << pos;
                }
            }
        }
}

}  // namespace
