#include "tensor/dtype.h"

#include <array>

namespace peregrine {

static std::array<float, 256> make_e4m3_table() {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) {
        int sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 7;
        float v;
        if (exp == 15 && man == 7) v = NAN;
        else if (exp == 0) v = std::ldexp(static_cast<float>(man) / 8.0f, -6);
        else v = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
        t[b] = sign ? -v : v;
    }
    return t;
}
const std::array<float, 256> kE4M3Table = make_e4m3_table();

const float kE2M1Table[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                              -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

uint8_t f32_to_e4m3(float x) {
    if (std::isnan(x)) return 0x7f;
    uint8_t sign = std::signbit(x) ? 0x80 : 0;
    double m = std::fabs(static_cast<double>(x));
    if (m >= 448.0) return sign | 0x7e;
    if (m < std::ldexp(1.0, -6)) {  // subnormal range: multiples of 2^-9 (code 8 is the smallest normal)
        double q = std::nearbyint(m * 512.0);
        return sign | static_cast<uint8_t>(q);
    }
    int e;
    double f = std::frexp(m, &e);  // m = f * 2^e, f in [0.5, 1)
    e -= 1;                        // m = (2f) * 2^e, 2f in [1, 2)
    double q = std::nearbyint((2.0 * f - 1.0) * 8.0);
    if (q >= 8.0) {
        q = 0.0;
        ++e;
    }
    int code = ((e + 7) << 3) | static_cast<int>(q);
    if (code > 0x7e) code = 0x7e;
    return sign | static_cast<uint8_t>(code);
}

const char* dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "F32";
        case DType::F64: return "F64";
        case DType::BF16: return "BF16";
        case DType::F16: return "F16";
        case DType::E4M3: return "F8_E4M3";
        case DType::E8M0: return "F8_E8M0";
        case DType::I8: return "I8";
        case DType::U8: return "U8";
        case DType::I32: return "I32";
        case DType::I64: return "I64";
        case DType::BOOL: return "BOOL";
    }
    return "?";
}

bool dtype_from_name(const std::string& name, DType* out) {
    static const std::pair<const char*, DType> names[] = {
        {"F32", DType::F32}, {"F64", DType::F64},       {"BF16", DType::BF16}, {"F16", DType::F16},
        {"F8_E4M3", DType::E4M3}, {"F8_E8M0", DType::E8M0}, {"I8", DType::I8},   {"U8", DType::U8},
        {"I32", DType::I32}, {"I64", DType::I64},       {"BOOL", DType::BOOL},
    };
    for (auto& [n, t] : names)
        if (name == n) {
            *out = t;
            return true;
        }
    return false;
}

size_t dtype_size(DType t) {
    switch (t) {
        case DType::F64:
        case DType::I64: return 8;
        case DType::F32:
        case DType::I32: return 4;
        case DType::BF16:
        case DType::F16: return 2;
        default: return 1;
    }
}

}  // namespace peregrine
