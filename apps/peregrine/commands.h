#pragma once
// Subcommands register themselves here at static-initialisation time (one file per subcommand).
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace peregrine {

// Adds the subcommand to `app`; the callback it installs runs the command and returns its exit code.
using CommandRegistrar = std::function<void(CLI::App& app, int& exit_code)>;
std::vector<CommandRegistrar>& command_registry();

// A subcommand that groups others ("bench serve", "bench ..."): created by whichever file asks first.
inline CLI::App* command_group(CLI::App& app, const std::string& name, const std::string& description) {
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
        if (sub->get_name() == name) return sub;
    CLI::App* g = app.add_subcommand(name, description);
    g->require_subcommand(1);
    return g;
}

struct RegisterCommand {
    explicit RegisterCommand(CommandRegistrar r) { command_registry().push_back(std::move(r)); }
};

}  // namespace peregrine
