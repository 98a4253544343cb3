// Prompt JSON layout: Python json.dumps(ensure_ascii=False) separators and float repr.
#include "server/protocol/json_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace peregrine;

TEST(JsonText, PythonFloatRepr) {
    // Expected strings are CPython's repr() of the same doubles.
    std::vector<std::pair<double, std::string>> cases = {
        {1.0, "1.0"},
        {0.1, "0.1"},
        {-0.0, "-0.0"},
        {100.0, "100.0"},
        {1e15, "1000000000000000.0"},
        {1e16, "1e+16"},
        {1e22, "1e+22"},
        {1.2345678901234568e22, "1.2345678901234568e+22"},
        {1e-4, "0.0001"},
        {1e-5, "1e-05"},
        {2.5e-5, "2.5e-05"},
        {1e-7, "1e-07"},
        {1.5e300, "1.5e+300"},
        {123.456, "123.456"},
        {-3.25, "-3.25"},
        {5e-324, "5e-324"},
        {0.30000000000000004, "0.30000000000000004"},
        {123456789.125, "123456789.125"},
    };
    for (auto& [d, want] : cases) EXPECT_EQ(python_float_repr(d), want) << want;
    EXPECT_EQ(python_float_repr(1e-7, FloatExponent::unpadded), "1e-7");
    EXPECT_EQ(python_float_repr(1e22, FloatExponent::unpadded), "1e+22");
    EXPECT_EQ(python_float_repr(2.5e-5, FloatExponent::unpadded), "0.000025");
    EXPECT_EQ(python_float_repr(1e-5, FloatExponent::unpadded), "0.00001");
    EXPECT_EQ(python_float_repr(9.9e-6, FloatExponent::unpadded), "9.9e-6");
    EXPECT_EQ(python_float_repr(3.0000000000000004e-05, FloatExponent::unpadded), "0.000030000000000000004");
}

TEST(JsonText, LayoutAndEscapes) {
    ojson v = ojson::parse(R"({"b": [1, 2.5, "x"], "a": {"k": null, "t": true}, "s": "é \" \\ \n \t \u0001 / 😀"})");
    EXPECT_EQ(
        dump_prompt_json(v),
        "{\"b\": [1, 2.5, \"x\"], \"a\": {\"k\": null, \"t\": true}, \"s\": \"é \\\" \\\\ \\n \\t \\u0001 / 😀\"}");
    EXPECT_EQ(dump_prompt_json(ojson::object()), "{}");
    EXPECT_EQ(dump_prompt_json(ojson::array()), "[]");
    EXPECT_EQ(dump_prompt_json(ojson(18446744073709551615ull)), "18446744073709551615");
    EXPECT_EQ(dump_prompt_json(ojson(-9223372036854775807ll - 1)), "-9223372036854775808");
}
