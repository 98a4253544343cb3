#include "util/log.h"
#include "util/error.h"

namespace peregrine {

void log_init(const std::string& level) {
    auto lvl = spdlog::level::from_str(level);
    if (lvl == spdlog::level::off && level != "off") fail("unknown log level '{}'", level);
    spdlog::set_level(lvl);
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
}

}  // namespace peregrine
