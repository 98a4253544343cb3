#pragma once
// The shape of a JSON text (nesting depth, members per object), found by one linear scan without building
// anything. JSON values are copied, printed and walked recursively (nlohmann's and ours), so a text nesting
// thousands of levels deep would exhaust a thread's stack, and an ordered object inserts each key in linear time,
// so a million keys take quadratic time: callers refuse texts past these bounds before parsing them.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace peregrine {

inline constexpr size_t kMaxJsonDepth = 128;       // json_shape_problem's messages say these numbers
inline constexpr size_t kMaxJsonMembers = 10000;  // per object

struct JsonShape {
    size_t depth = 0;    // deepest nesting of '[' and '{'
    size_t members = 0;  // most members of one object
};

// Outside strings only; malformed text is the parser's to refuse.
inline JsonShape json_shape(std::string_view text) {
    JsonShape shape;
    std::vector<size_t> members;  // per open container: commas seen in it (objects only; arrays hold SIZE_MAX)
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') ++i;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            members.push_back(c == '{' ? 1 : SIZE_MAX);
            if (members.size() > shape.depth) shape.depth = members.size();
        } else if ((c == ']' || c == '}') && !members.empty()) {
            members.pop_back();
        } else if (c == ',' && !members.empty() && members.back() != SIZE_MAX) {
            if (++members.back() > shape.members) shape.members = members.back();
        }
    }
    return shape;
}

// What is wrong with the text's shape ("nests deeper than 128 levels", ...), or null when it is within the bounds.
inline const char* json_shape_problem(std::string_view text) {
    const JsonShape s = json_shape(text);
    if (s.depth > kMaxJsonDepth) return "nests arrays and objects deeper than 128 levels";
    if (s.members > kMaxJsonMembers) return "has an object of more than 10000 members";
    return nullptr;
}

}  // namespace peregrine
