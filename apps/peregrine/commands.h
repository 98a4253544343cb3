#pragma once
// Subcommands register themselves here at static-initialisation time (one file per subcommand).
#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace peregrine {

// Adds the subcommand to `app`; the callback it installs runs the command and returns its exit code.
using CommandRegistrar = std::function<void(CLI::App& app, int& exit_code)>;
std::vector<CommandRegistrar>& command_registry();

struct RegisterCommand {
    explicit RegisterCommand(CommandRegistrar r) { command_registry().push_back(std::move(r)); }
};

}  // namespace peregrine
