// Where the embedded default model lives: next to the binary's source tree (models/) or installed.
#include "util/file.h"
#include "util/switches.h"

#include <cstdlib>
#include <string>
#include <unistd.h>

namespace peregrine {

std::string default_model_dir() {
    if (switch_set("PEREGRINE_MODEL")) return switch_value("PEREGRINE_MODEL");
    const std::string name = "models/peregrine-demo-v4";
    char buf[4096];
    ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n > 0) {
        std::string dir(buf, static_cast<size_t>(n));
        for (int up = 0; up < 3; ++up) {  // build/peregrine -> repo root
            dir = dir.substr(0, dir.find_last_of('/'));
            if (file_exists(dir + "/" + name + "/config.json")) return dir + "/" + name;
        }
    }
    return name;
}

}  // namespace peregrine
