#pragma once
// How deeply a JSON text nests its arrays and objects, found by one linear scan without building anything. JSON
// values are copied, printed and walked recursively (nlohmann's and ours), so a text nesting thousands of levels
// deep would exhaust a thread's stack: callers refuse texts deeper than kMaxJsonDepth before parsing them.
#include <cstddef>
#include <string_view>

namespace peregrine {

inline constexpr size_t kMaxJsonDepth = 128;

// The deepest nesting of '[' and '{' outside strings (malformed text is the parser's to refuse).
inline size_t json_nesting_depth(std::string_view text) {
    size_t depth = 0, deepest = 0;
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') ++i;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > deepest) deepest = depth;
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return deepest;
}

inline bool json_too_deep(std::string_view text) { return json_nesting_depth(text) > kMaxJsonDepth; }

}  // namespace peregrine
