// peregrine info --model DIR: what a checkpoint holds, without loading it.
#include "commands.h"
#include "io/model_config.h"
#include "io/safetensors.h"

#include <cstdio>
#include <map>

namespace peregrine {

static RegisterCommand reg_info([](CLI::App& app, int& exit_code) {
    auto* cmd = app.add_subcommand("info", "Describe a checkpoint: configuration and tensor inventory");
    auto model = std::make_shared<std::string>();
    cmd->add_option("--model", *model, "Model directory (config.json + safetensors)")->required();
    cmd->callback([model, &exit_code] {
        ModelConfig cfg = load_model_config(*model);
        SafeTensors st = SafeTensors::open_dir(*model);
        std::map<std::string, std::pair<size_t, size_t>> by_dtype;
        for (auto& [name, t] : st.tensors()) {
            auto& e = by_dtype[dtype_name(t.dtype)];
            e.first += 1;
            e.second += t.nbytes;
        }
        std::printf("%s\n%zu tensors\n", cfg.describe().c_str(), st.tensors().size());
        for (auto& [dt, e] : by_dtype) std::printf("  %-8s %6zu tensors %14zu bytes\n", dt.c_str(), e.first, e.second);
        exit_code = 0;
    });
});

}  // namespace peregrine
