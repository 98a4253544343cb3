#include "server/protocol/json_text.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace peregrine {

void append_json_escaped(std::string& out, std::string_view s) {
    for (unsigned char c : s) {
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
            if (c < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", c);
                out += buf;
            } else {
                out += static_cast<char>(c);
            }
        }
    }
}

std::string python_float_repr(double d, FloatExponent fe) {
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
    // Shortest round-trip digits, then Python's layout: positional for 1e-4 <= |d| < 1e16, else exponent
    // (V4's encoder: positional from 1e-5 and an unpadded exponent).
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    std::string sci(buf, r.ptr);
    bool neg = sci[0] == '-';
    if (neg) sci.erase(0, 1);
    size_t e = sci.find('e');
    int exp = std::atoi(sci.c_str() + e + 1);
    std::string digits;
    for (size_t i = 0; i < e; ++i)
        if (sci[i] != '.') digits += sci[i];
    std::string out = neg ? "-" : "";
    if (exp >= (fe == FloatExponent::python ? -4 : -5) && exp < 16) {
        if (exp < 0) {
            out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
        } else if (static_cast<size_t>(exp + 1) >= digits.size()) {
            out += digits + std::string(static_cast<size_t>(exp + 1) - digits.size(), '0') + ".0";
        } else {
            out += digits.substr(0, static_cast<size_t>(exp + 1)) + "." + digits.substr(static_cast<size_t>(exp + 1));
        }
    } else {
        out += digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char eb[16];
        std::snprintf(eb, sizeof eb, fe == FloatExponent::python ? "e%c%02d" : "e%c%d", exp < 0 ? '-' : '+',
                      std::abs(exp));
        out += eb;
    }
    return out;
}

static void dump(std::string& out, const ojson& v, FloatExponent fe) {
    switch (v.type()) {
    case ojson::value_t::object: {
        out += '{';
        bool first = true;
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (!first) out += ", ";
            first = false;
            out += '"';
            append_json_escaped(out, it.key());
            out += "\": ";
            dump(out, it.value(), fe);
        }
        out += '}';
        break;
    }
    case ojson::value_t::array: {
        out += '[';
        bool first = true;
        for (const auto& e : v) {
            if (!first) out += ", ";
            first = false;
            dump(out, e, fe);
        }
        out += ']';
        break;
    }
    case ojson::value_t::string:
        out += '"';
        append_json_escaped(out, v.get_ref<const std::string&>());
        out += '"';
        break;
    case ojson::value_t::number_float: out += python_float_repr(v.get<double>(), fe); break;
    case ojson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case ojson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case ojson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    default: out += "null"; break;
    }
}

std::string dump_prompt_json(const ojson& v, FloatExponent fe) {
    std::string out;
    dump(out, v, fe);
    return out;
}

}  // namespace peregrine
