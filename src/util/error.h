#pragma once
// One exception type for errors a user can act on (bad checkpoint, bad arguments, bad request).
#include <stdexcept>
#include <string>
#include <fmt/format.h>

namespace peregrine {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
    throw Error(fmt::format(f, std::forward<Args>(args)...));
}

#define PEREGRINE_CHECK(cond, ...)                          \
    do {                                                    \
        if (!(cond)) ::peregrine::fail(__VA_ARGS__);        \
    } while (0)

}  // namespace peregrine
