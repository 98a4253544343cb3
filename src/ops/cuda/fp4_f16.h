#pragma once
// The exact re-encodings of the FP4 kernels, as plain bit arithmetic shared by the kernels and host code so that
// tests/ops/test_fp4_f16.cpp checks them everywhere. Decode GEMV (linear_gemv_stream.cu): e2m1 codes placed into
// f16 bits, the order the mma then sees them in, and ue8m0 scales as float bits. Grouped wgmma GEMM
// (moe_gemm_fp4_wgmma.cu): e2m1 codes placed into bf16 bits, the fragments they form and the k order of the
// token rows that matches them.
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

// Eight e2m1 nibbles (low nibble first: v0..v7) as bf16 pairs, each exactly its value x 2^-126: the nibble
// s.ee.m becomes the bf16 s.000000ee.m000000 (ee = 0 lands in the bf16 subnormals: 0.5 -> 2^-127). Pairs hold
// values four apart, so that one mask takes both: p[0] = (v0, v4), p[1] = (v1, v5), p[2] = (v2, v6),
// p[3] = (v3, v7) (low half first). Nibble x 64 puts ee.m at bits 6..8 and the sign at bit 9; the sign bit
// times 4032 adds the rest of the way to bit 15 (512 + 32256 = 32768). The multiply-adds run on the FMA pipe,
// leaving the integer pipe (which bounds the grouped kernel) two masks a pair.
PEREGRINE_HD void fp4x8_to_bf16(uint32_t w, uint32_t (&p)[4]) {
    const uint32_t h = w >> 8;  // v2, v3 at bits 0..7, v6, v7 at 16..23
    p[0] = (w & 0x000f000fu) * 64u + (w & 0x00080008u) * 4032u;
    p[1] = (w & 0x00f000f0u) * 4u + (w & 0x00800080u) * 252u;
    p[2] = (h & 0x000f000fu) * 64u + (h & 0x00080008u) * 4032u;
    p[3] = (h & 0x00f000f0u) * 4u + (h & 0x00800080u) * 252u;
}

// The wgmma kernel's A fragments of one weight row from the 16 codes a thread holds (w0 then w1, low nibble
// first: values v0..v15 of k 16t .. 16t + 15 of a k64 stage): f[s][h] is the bf16 pair of k16 step s at
// fragment k 2t + 8h (+1), unscaled (x 2^-126). The token rows follow in the order wgmma_k_slot gives.
PEREGRINE_HD void fp4_wgmma_fragments(uint32_t w0, uint32_t w1, uint32_t (&f)[4][2]) {
    uint32_t p0[4], p1[4];
    fp4x8_to_bf16(w0, p0);
    fp4x8_to_bf16(w1, p1);
    f[0][0] = p0[0], f[0][1] = p0[1], f[1][0] = p0[2], f[1][1] = p0[3];
    f[2][0] = p1[0], f[2][1] = p1[1], f[3][0] = p1[2], f[3][1] = p1[3];
}

// Where value k (0..63) of a k64 stage sits in the wgmma kernel's token rows: fp4_wgmma_fragments gives thread
// t (k = 16t + v) slot 16s + 2t + 8h + j for v = 8i + 4j + o, q = 4i + o, s = q / 2, h = q % 2. The sum over k
// is the same in any order. wgmma_k_source is its inverse.
PEREGRINE_HD constexpr int wgmma_k_slot(int k) {
    return 32 * ((k >> 3) & 1) + 16 * ((k >> 1) & 1) + 8 * (k & 1) + 2 * (k >> 4) + ((k >> 2) & 1);
}
PEREGRINE_HD constexpr int wgmma_k_source(int slot) {
    return 16 * ((slot >> 1) & 3) + 8 * (slot >> 5) + 4 * (slot & 1) + 2 * ((slot >> 4) & 1) + ((slot >> 3) & 1);
}

// bf16x2 bits of 2^(e - 1), the ue8m0 scale 2^(e - 127) times the 2^126 that fp4x8_to_bf16 leaves out, for
// e <= 128 (a larger e needs a second factor, 2^(e - 128), since 2^(e - 1) leaves the bf16 range).
PEREGRINE_HD uint32_t ue8m0_times_2p126_bf16x2(uint32_t e) {
    return ((e < 128u ? e : 128u) + 126u) * 0x00800080u;  // (e' + 126) << 7 in both halves, one multiply-add
}

}  // namespace peregrine::cuda
