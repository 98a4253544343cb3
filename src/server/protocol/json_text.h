#pragma once
// JSON text exactly as DeepSeek's encoder writes it into prompts: Python's json.dumps(ensure_ascii=False)
// layout (", " and ": " separators, raw non-ASCII, Python float repr). Byte-exact prompts depend on it.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace peregrine {

using ojson = nlohmann::ordered_json;

// How floats are written: V4.1's encoder follows Python repr ("1e-05", "1e-07", "1e+22"); V4's writes
// positional digits down to 1e-5 and an unpadded exponent below ("0.00001", "1e-7", "1e+22").
enum class FloatExponent { python, unpadded };

// The whole value in prompt layout.
std::string dump_prompt_json(const ojson& v, FloatExponent fe = FloatExponent::python);

// Appends `s` escaped as the inside of a JSON string literal (no surrounding quotes); UTF-8 passes through.
void append_json_escaped(std::string& out, std::string_view s);

// Python repr of a double ("1.0", "1e+20", "1.2345678901234568e+22", "-0.0").
std::string python_float_repr(double d, FloatExponent fe = FloatExponent::python);

}  // namespace peregrine
