#pragma once
// Byte formats of the state entries (the released checkpoints' cache dtypes), shared by the layout, the CPU
// reference and the CUDA kernels. Every stored value was already quantise-dequantised by the model (QDQ), so
// the packed form holds it exactly: encode() re-derives a scale under which each value is a code, and
// reports whether decode(encode(x)) == x bit for bit (it always is for QDQ'd values).
//
//   fp8   [quant_dims e4m3 codes][dim - quant_dims bf16 values][quant_dims / block ue8m0 scales][pad]
//         V4.1 window K=V: 512 codes + 16 scales (blocks of 32) = 528 B.
//         V4 window K=V and compressed KV: 448 codes (blocks of 64) + 64 bf16 RoPE dims + 7 scales = 583 -> 592 B.
//   fp4e4m3 [dim / 2 e2m1 codes, low nibble = even value][dim / block e4m3 scales][pad]
//         V4.1 compressed latent: 256 + 32 (blocks of 16) = 288 B.
//   fp4ue8m0 [dim / 2 e2m1 codes][dim / block ue8m0 scales][pad]
//         indexer keys (V4.1 and V4): 64 + 4 (blocks of 32) = 68 -> 80 B.
// Entries are padded to 16 bytes so that kernels may read them with 16-byte vector loads.
#include "util/host_device.h"

#include <cstdint>
#include <cstring>

namespace peregrine {

enum EntryKind : int32_t { kEntryFp8 = 0, kEntryFp4E4m3 = 1, kEntryFp4Ue8m0 = 2 };

struct EntryFormat {
    int32_t kind = kEntryFp8;
    int32_t dim = 0;           // values per entry
    int32_t quant_dims = 0;    // values stored as codes (fp8: the first quant_dims; the rest bf16)
    int32_t block = 1;         // values per scale
    int32_t bf16_offset = 0;   // bytes from the entry start: the bf16 values (fp8 only)
    int32_t scale_offset = 0;  // bytes from the entry start: the scales
    int32_t bytes = 0;         // entry size, a multiple of 16
};

PEREGRINE_HD int32_t round_up16(int32_t n) { return (n + 15) / 16 * 16; }

// e4m3 codes for the first quant_dims values (scale per block), the rest bf16.
inline EntryFormat fp8_entry_format(int dim, int quant_dims, int block) {
    EntryFormat f;
    f.kind = kEntryFp8;
    f.dim = dim;
    f.quant_dims = quant_dims;
    f.block = block;
    f.bf16_offset = quant_dims;
    f.scale_offset = quant_dims + 2 * (dim - quant_dims);
    f.bytes = round_up16(f.scale_offset + quant_dims / block);
    return f;
}
inline EntryFormat fp4_entry_format(int dim, int block, bool e4m3_scales) {
    EntryFormat f;
    f.kind = e4m3_scales ? kEntryFp4E4m3 : kEntryFp4Ue8m0;
    f.dim = dim;
    f.quant_dims = dim;
    f.block = block;
    f.bf16_offset = dim / 2;
    f.scale_offset = dim / 2;
    f.bytes = round_up16(f.scale_offset + dim / block);
    return f;
}

// ---- scalar codecs (exact; no tables, so host and device share them)
PEREGRINE_HD float sf_e4m3(uint8_t b) {
    const uint32_t sign = static_cast<uint32_t>(b & 0x80) << 24, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return float_from_bits(0x7fc00000u);
    if (e == 0) return float_from_bits(float_bits(static_cast<float>(m) * 0.001953125f) | sign);  // m * 2^-9
    return float_from_bits(sign | ((e + 120u) << 23) | (m << 20));
}
PEREGRINE_HD float sf_ue8m0(uint8_t b) {
    if (b == 0) return float_from_bits(0x00400000u);  // 2^-127
    if (b == 255) return float_from_bits(0x7fc00000u);
    return float_from_bits(static_cast<uint32_t>(b) << 23);
}
PEREGRINE_HD float sf_e2m1(uint8_t code) {
    const uint32_t m = code & 7, e = m >> 1;
    const float mag = e == 0 ? 0.5f * static_cast<float>(m & 1)
                             : float_from_bits(((e + 126u) << 23) | ((m & 1) << 22));  // (1 + m/2) * 2^(e-1)
    return (code & 8) ? -mag : mag;
}
PEREGRINE_HD float sf_bf16(uint16_t h) { return float_from_bits(static_cast<uint32_t>(h) << 16); }

// The code of a value exactly representable in e4m3 (finite, |x| <= 448); false if it is not.
PEREGRINE_HD bool sf_encode_e4m3(float x, uint8_t* code) {
    const uint32_t u = float_bits(x), sign = (u >> 24) & 0x80, a = u & 0x7fffffffu;
    uint8_t c;
    if (a == 0) {
        c = 0;
    } else {
        const int e = static_cast<int>(a >> 23) - 127;
        if (e >= -6) {
            if (e > 8 || (a & 0xfffffu) != 0) return false;
            c = static_cast<uint8_t>(((e + 7) << 3) | ((a >> 20) & 7));
            if (c == 0x7f) return false;
        } else {
            const float m = float_from_bits(a) * 512.0f;  // subnormal: m * 2^-9, m in 1..7
            if (m != static_cast<float>(static_cast<int>(m)) || m >= 8.0f) return false;
            c = static_cast<uint8_t>(m);
        }
    }
    *code = static_cast<uint8_t>(c | sign);
    return true;
}
// The e2m1 code of a value exactly on the grid {0, .5, 1, 1.5, 2, 3, 4, 6} (either sign); false otherwise.
PEREGRINE_HD bool sf_encode_e2m1(float x, uint8_t* code) {
    const uint32_t u = float_bits(x), sign = (u >> 28) & 8, a = u & 0x7fffffffu;
    uint8_t c;
    if (a == 0) c = 0;
    else if (a == 0x3f000000u) c = 1;  // 0.5
    else {
        const int e = static_cast<int>(a >> 23) - 127;
        if (e < 0 || e > 2 || (a & 0x3fffffu) != 0) return false;
        c = static_cast<uint8_t>(((e + 1) << 1) | ((a >> 22) & 1));
        if (c > 7) return false;
    }
    *code = static_cast<uint8_t>(c | sign);
    return true;
}
// 2^k as a float for k in [-127, 127].
PEREGRINE_HD float sf_pow2(int k) {
    return k <= -127 ? float_from_bits(0x00400000u) : float_from_bits(static_cast<uint32_t>(k + 127) << 23);
}
// The smallest k with a / 2^k <= limit, for limit = mant * 2^lim_exp (mant in [1, 2)), a > 0 normal.
PEREGRINE_HD int sf_scale_exp(float a, float limit_mant, int limit_exp) {
    const uint32_t u = float_bits(a);
    const int E = static_cast<int>((u >> 23) & 255) - 127;
    const float m = float_from_bits((u & 0x7fffffu) | 0x3f800000u);
    int k = (m <= limit_mant ? E - limit_exp : E - limit_exp + 1);
    if ((u >> 23) == 0) k = -127;  // subnormal: the smallest scale
    return k < -127 ? -127 : (k > 127 ? 127 : k);
}

// ---- one value of an entry
PEREGRINE_HD float entry_value(const EntryFormat& f, const uint8_t* e, int c) {
    if (f.kind == kEntryFp8) {
        if (c >= f.quant_dims) {
            uint16_t h;
            std::memcpy(&h, e + f.bf16_offset + 2 * (c - f.quant_dims), 2);
            return sf_bf16(h);
        }
        return sf_e4m3(e[c]) * sf_ue8m0(e[f.scale_offset + c / f.block]);
    }
    const uint8_t byte = e[c >> 1];
    const float v = sf_e2m1(static_cast<uint8_t>((c & 1) ? byte >> 4 : byte & 15));
    const uint8_t sb = e[f.scale_offset + c / f.block];
    return v * (f.kind == kEntryFp4E4m3 ? sf_e4m3(sb) : sf_ue8m0(sb));
}

PEREGRINE_HD void decode_entry(const EntryFormat& f, const uint8_t* e, float* out) {
    for (int c = 0; c < f.dim; ++c) out[c] = entry_value(f, e, c);
}

// ---- encoding
// max |x| over the scale block [b0, b0 + f.block).
PEREGRINE_HD float entry_block_amax(const EntryFormat& f, const float* x, int b0) {
    float amax = 0.0f;
    for (int i = 0; i < f.block; ++i) {
        const float a = float_from_bits(float_bits(x[b0 + i]) & 0x7fffffffu);
        amax = a > amax ? a : amax;
    }
    return amax;
}
// Power-of-two scales (fp8, fp4 under ue8m0): the exponent k of the smallest scale that keeps a block of maximum
// amax within e4m3's 448 (1.75 * 2^8) or e2m1's 6 (1.5 * 2^2).
PEREGRINE_HD int entry_scale_exp(bool fp8, float amax) {
    return amax == 0.0f ? 0 : (fp8 ? sf_scale_exp(amax, 1.75f, 8) : sf_scale_exp(amax, 1.5f, 2));
}
// Value x under the scale 2^k: its e4m3 (fp8) or e2m1 code (0 if it has none), and whether code x 2^k is x.
PEREGRINE_HD bool encode_entry_code(bool fp8, float x, int k, uint8_t* code) {
    const float s = sf_pow2(k), q = x * sf_pow2(-k < 127 ? -k : 127);
    *code = 0;
    const bool enc = fp8 ? sf_encode_e4m3(q, code) : sf_encode_e2m1(q, code);
    return enc && float_bits((fp8 ? sf_e4m3(*code) : sf_e2m1(*code)) * s) == float_bits(x);
}

// One scale block: [b0, b0 + f.block) of x into e; false if some value is not held exactly.
PEREGRINE_HD bool encode_entry_block(const EntryFormat& f, const float* x, int b0, uint8_t* e) {
    const float amax = entry_block_amax(f, x, b0);
    const int b = b0 / f.block;
    if (f.kind == kEntryFp8 || f.kind == kEntryFp4Ue8m0) {
        const bool fp8 = f.kind == kEntryFp8;
        const int k = entry_scale_exp(fp8, amax);
        e[f.scale_offset + b] = static_cast<uint8_t>(k + 127);
        bool ok = true;
        for (int i = 0; i < f.block; ++i) {
            const int c = b0 + i;
            uint8_t code;
            ok = encode_entry_code(fp8, x[c], k, &code) && ok;
            if (fp8) e[c] = code;
            else e[c >> 1] = static_cast<uint8_t>((c & 1) ? (e[c >> 1] & 15) | (code << 4) : (e[c >> 1] & 0xf0) | code);
        }
        return ok;
    }
    // fp4 with an e4m3 scale: the block maximum is one of the grid's magnitudes times the scale
    const float grid[7] = {6.0f, 4.0f, 3.0f, 2.0f, 1.5f, 1.0f, 0.5f};
    for (int g = 0; g < (amax == 0.0f ? 1 : 7); ++g) {
        const float s = amax == 0.0f ? 1.0f : amax / grid[g];
        uint8_t sc = 0;
        if (!(s > 0.0f) || !sf_encode_e4m3(s, &sc)) continue;
        bool fits = true;
        for (int i = 0; i < f.block && fits; ++i) {
            const int c = b0 + i;
            uint8_t code = 0;
            fits = sf_encode_e2m1(x[c] / s, &code) && float_bits(sf_e2m1(code) * s) == float_bits(x[c]);
            if (fits)
                e[c >> 1] = static_cast<uint8_t>((c & 1) ? (e[c >> 1] & 15) | (code << 4) : (e[c >> 1] & 0xf0) | code);
        }
        if (fits) {
            e[f.scale_offset + b] = sc;
            return true;
        }
    }
    return false;
}

// The bf16 tail of an fp8 entry: value c (>= quant_dims) as bf16; false if x[c] is not a bf16 value.
PEREGRINE_HD bool encode_entry_bf16(const EntryFormat& f, const float* x, int c, uint8_t* e) {
    const uint32_t u = float_bits(x[c]);
    const uint16_t h = static_cast<uint16_t>(u >> 16);
    std::memcpy(e + f.bf16_offset + 2 * (c - f.quant_dims), &h, 2);
    return (u & 0xffffu) == 0;
}

// A whole entry (padding zeroed); false if any value was not held exactly.
PEREGRINE_HD bool encode_entry(const EntryFormat& f, const float* x, uint8_t* e) {
    for (int i = 0; i < f.bytes; ++i) e[i] = 0;
    bool ok = true;
    for (int b0 = 0; b0 < f.quant_dims; b0 += f.block) ok = encode_entry_block(f, x, b0, e) && ok;
    if (f.kind == kEntryFp8)
        for (int c = f.quant_dims; c < f.dim; ++c) ok = encode_entry_bf16(f, x, c, e) && ok;
    return ok;
}

}  // namespace peregrine
