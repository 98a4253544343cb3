// peregrine: DeepSeek-V4.1 / V4 inference engine and server. Subcommands live in cmd_*.cpp.
#include "commands.h"
#include "util/error.h"
#include "util/log.h"

#include <cstdio>

namespace peregrine {
std::vector<CommandRegistrar>& command_registry() {
    static std::vector<CommandRegistrar> registry;
    return registry;
}
}  // namespace peregrine

int main(int argc, char** argv) {
    CLI::App app{"Peregrine: inference engine and server for DeepSeek-V4.1-Flash and DeepSeek-V4-Flash"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "peregrine 0.1.0");
    int exit_code = 0;
    for (auto& reg : peregrine::command_registry()) reg(app, exit_code);
    try {
        peregrine::log_init("info");
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    } catch (const peregrine::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return exit_code;
}
