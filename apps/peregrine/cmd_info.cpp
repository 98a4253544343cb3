// peregrine info --model DIR: what a checkpoint holds, without loading it.
// peregrine info --env: the PEREGRINE_* environment switches, with the values in effect.
#include "commands.h"
#include "model/variant.h"
#include "io/safetensors.h"
#include "util/error.h"
#include "util/switches.h"

#include <cstdio>
#include <map>

namespace peregrine {

namespace {

void print_switches() {
    std::string area;
    for (const Switch& s : switches()) {
        if (area != s.area) {
            area = s.area;
            std::printf("%s%s\n", area == switches().front().area ? "" : "\n", area.c_str());
        }
        const std::string value = switch_value(s.name);
        std::printf("  %-28s = %-8s %s%s\n      %s\n", s.name, value.empty() ? "(unset)" : value.c_str(),
                    s.values, switch_set(s.name) ? "  [set]" : "", s.help);
    }
}

void print_model(const std::string& dir) {
    ModelConfig cfg = load_model_config(dir);
    SafeTensors st = SafeTensors::open_dir(dir);
    std::map<std::string, std::pair<size_t, size_t>> by_dtype;
    for (auto& [name, t] : st.tensors()) {
        auto& e = by_dtype[dtype_name(t.dtype)];
        e.first += 1;
        e.second += t.nbytes;
    }
    std::printf("%s\n%zu tensors\n", describe_model(cfg).c_str(), st.tensors().size());
    for (auto& [dt, e] : by_dtype) std::printf("  %-8s %6zu tensors %14zu bytes\n", dt.c_str(), e.first, e.second);
}

RegisterCommand reg_info([](CLI::App& app, int& exit_code) {
    auto* cmd = app.add_subcommand("info", "Describe a checkpoint, or the environment switches (--env)");
    auto model = std::make_shared<std::string>();
    auto env = std::make_shared<bool>(false);
    cmd->add_option("--model", *model, "Model directory (config.json + safetensors)");
    cmd->add_flag("--env", *env, "The PEREGRINE_* environment switches: values, what each does, the value in effect");
    cmd->callback([model, env, &exit_code] {
        PEREGRINE_CHECK(*env || !model->empty(), "info needs --model DIR or --env");
        if (*env) print_switches();
        if (!model->empty()) print_model(*model);
        exit_code = 0;
    });
});

}  // namespace

}  // namespace peregrine
