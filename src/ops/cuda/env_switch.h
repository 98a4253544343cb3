#pragma once
// The CUDA backend's A/B switches are environment variables, each read once by its caller at first use.
#include <cstdlib>
#include <cstring>

namespace peregrine::cuda {

// Whether environment variable `name` is set to exactly `value`.
inline bool env_is(const char* name, const char* value) {
    const char* v = std::getenv(name);
    return v && std::strcmp(v, value) == 0;
}

}  // namespace peregrine::cuda
