#pragma once
// Logging goes through spdlog; this only fixes the format and the level names used by --log-level.
#include <spdlog/spdlog.h>
#include <string>

namespace peregrine {

void log_init(const std::string& level = "info");

}  // namespace peregrine
