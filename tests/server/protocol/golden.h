#pragma once
// Loads the oracle goldens written by tools/gen_protocol_goldens.py.
#include "server/protocol/chat_format.h"
#include "server/protocol/chat_request.h"
#include "util/file.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace peregrine::test {

inline nlohmann::ordered_json load_golden(const std::string& name) {
    return nlohmann::ordered_json::parse(read_file(std::string(PROTOCOL_GOLDEN_DIR) + "/" + name))["cases"];
}

// The oracle renders a request that says nothing about thinking with thinking on; Peregrine's default is off
// (as SGLang's), so the golden cases are parsed with the oracle's default.
inline const RequestOptions kOracleDefaults{.default_thinking = true};

inline ChatFormat golden_format(const std::string& key) {
    return key == "deepseek_v41" ? ChatFormat::deepseek_v41 : ChatFormat::deepseek_v4;
}

// gtest parameter names allow only [A-Za-z0-9_].
inline std::string test_name(std::string s) {
    for (char& c : s)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return s;
}

}  // namespace peregrine::test
