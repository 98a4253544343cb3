#pragma once
// Element types of the released checkpoints and their scalar conversions.
// bf16 and e4m3 conversions round to nearest even; e4m3 saturates (like CUDA's satfinite casts).
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace peregrine {

enum class DType : uint8_t { F32, F64, BF16, F16, E4M3, E8M0, I8, U8, I32, I64, BOOL };

const char* dtype_name(DType t);      // safetensors spelling: "F32", "BF16", "F8_E4M3", ...
bool dtype_from_name(const std::string& name, DType* out);
size_t dtype_size(DType t);

inline float bits_to_f32(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint32_t f32_to_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// ---- bf16 ----
using bf16_t = uint16_t;
inline float bf16_to_f32(bf16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }
inline bf16_t f32_to_bf16(float f) {
    uint32_t u = f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<bf16_t>(u >> 16);
}
// Rounds a float to the nearest bf16 value and returns it as float.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// ---- fp8 e4m3fn ----
extern const std::array<float, 256> kE4M3Table;
inline float e4m3_to_f32(uint8_t b) { return kE4M3Table[b]; }
uint8_t f32_to_e4m3(float x);  // RNE, saturating to +-448
inline float round_e4m3(float x) { return kE4M3Table[f32_to_e4m3(x)]; }

// ---- ue8m0 scale: 2^(b-127) ----
inline float e8m0_to_f32(uint8_t b) {
    if (b == 0) return bits_to_f32(0x00400000u);  // 2^-127 (subnormal)
    if (b == 255) return NAN;
    return bits_to_f32(static_cast<uint32_t>(b) << 23);
}

// ---- fp4 e2m1 (bit 3 = sign), packed two per byte, low nibble = even element ----
extern const float kE2M1Table[16];
inline float e2m1_to_f32(uint8_t code) { return kE2M1Table[code & 0xf]; }
inline uint8_t f32_to_e2m1(float x) {  // x in [-6, 6]; round to nearest, ties to the even code
    float m = std::fabs(x);
    uint8_t c;
    if (m <= 0.25f) c = 0;
    else if (m < 0.75f) c = 1;
    else if (m <= 1.25f) c = 2;
    else if (m < 1.75f) c = 3;
    else if (m <= 2.5f) c = 4;
    else if (m < 3.5f) c = 5;
    else if (m <= 5.0f) c = 6;
    else c = 7;
    return static_cast<uint8_t>(c | (std::signbit(x) ? 8 : 0));
}

}  // namespace peregrine
