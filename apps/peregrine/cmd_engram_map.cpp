// peregrine engram-map --tokenizer FILE|--model DIR [--json]: Engram's compressed token map (spec §6.1).
#include "commands.h"
#include "tokenizer/engram_token_map.h"
#include "util/error.h"

#include <cstdio>

namespace peregrine {

static RegisterCommand reg_engram_map([](CLI::App& app, int& exit_code) {
    auto* cmd = app.add_subcommand("engram-map", "Print the number of Engram token classes (and the map)");
    auto file = std::make_shared<std::string>();
    auto model = std::make_shared<std::string>();
    auto as_json = std::make_shared<bool>(false);
    cmd->add_option("--tokenizer", *file, "tokenizer.json file")
        ->excludes(cmd->add_option("--model", *model, "Model directory"));
    cmd->add_flag("--json", *as_json, "Print the class of every id as one JSON array");
    cmd->callback([=, &exit_code] {
        PEREGRINE_CHECK(!file->empty() || !model->empty(), "give --tokenizer FILE or --model DIR");
        Tokenizer tok = file->empty() ? Tokenizer::from_model_dir(*model) : Tokenizer::from_file(*file);
        EngramTokenMap m = build_engram_token_map(tok);
        if (*as_json) {
            std::string out = "[";
            for (size_t i = 0; i < m.id_to_class.size(); ++i) {
                if (i) out += ",";
                out += std::to_string(m.id_to_class[i]);
            }
            out += "]\n";
            std::fwrite(out.data(), 1, out.size(), stdout);
        } else {
            std::printf("%d classes over %d ids\n", m.num_classes, tok.vocab_size());
        }
        exit_code = 0;
    });
});

}  // namespace peregrine
