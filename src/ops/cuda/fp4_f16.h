#pragma once
// The decode GEMV's exact re-encodings (linear_gemv_stream.cu), as plain bit arithmetic shared by the kernels
// and host code so that tests/ops/test_fp4_f16.cpp checks them everywhere: e2m1 codes placed into f16 bits, the
// order the mma then sees them in, and ue8m0 scales as float bits.
#include "util/host_device.h"

#include <cstdint>

namespace peregrine::cuda {

// __byte_perm on the device; the same selection on the host (selector nibbles 0-7, no sign-replicate mode).
PEREGRINE_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
    return __byte_perm(a, b, s);
#else
    const uint64_t x = (static_cast<uint64_t>(b) << 32) | a;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((x >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
    return r;
#endif
}

// Position of value v (0..31) of an FP4 k step in the staged f16 activations: the order in which fp4x8_to_f16
// hands the weights to the mmas (per 8 values: the even ones, then the odd ones).
PEREGRINE_HD int fp4_act_pos(int v) { return (v & ~7) | ((v & 1) << 2) | ((v & 7) >> 1); }

// Eight e2m1 nibbles (low nibble first: v0..v7) as f16 pairs, each exactly its value x 2^-14: the nibble s.ee.m
// becomes the f16 s.000ee.m000000000 (ee = 0 lands in the f16 subnormals: 0.5 -> 2^-15). Only the high byte of
// an f16 is non-zero, so the high bytes are built for four values at once and byte-permuted into place.
// p[0] = (v0, v2), p[1] = (v4, v6), p[2] = (v1, v3), p[3] = (v5, v7) (low half first): fp4_act_pos's order.
PEREGRINE_HD void fp4x8_to_f16(uint32_t w, uint32_t (&p)[4]) {
    const uint32_t he = ((w << 4) & 0x80808080u) | ((w << 1) & 0x0e0e0e0eu);  // high bytes of v0 v2 v4 v6
    const uint32_t ho = (w & 0x80808080u) | ((w >> 3) & 0x0e0e0e0eu);         // high bytes of v1 v3 v5 v7
    p[0] = byte_perm(he, 0u, 0x1404);
    p[1] = byte_perm(he, 0u, 0x3424);
    p[2] = byte_perm(ho, 0u, 0x1404);
    p[3] = byte_perm(ho, 0u, 0x3424);
}

// Float bits of the ue8m0 scale e (2^(e - 127)) times 2^14, the factor the f16 weights leave out: exact for every
// finite scale a weight can have (e <= 240; above, the product leaves the float range).
PEREGRINE_HD uint32_t ue8m0_times_2p14_bits(uint32_t e) { return (e + 14u) << 23; }

}  // namespace peregrine::cuda
