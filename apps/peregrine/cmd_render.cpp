// peregrine render (--model DIR | --format F) --request FILE [--ids] [--json]: the exact prompt an OpenAI
// chat request becomes (text by default; token ids with --ids).
#include "commands.h"
#include "server/protocol/prompt_ids.h"
#include "util/file.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

namespace peregrine {

static RegisterCommand reg_render([](CLI::App& app, int& exit_code) {
    auto* cmd = app.add_subcommand("render", "Print the exact prompt an OpenAI chat request renders to");
    struct Opts {
        std::string model, format, request, tokenizer;
        bool ids = false, json = false, enable_thinking = false;
    };
    auto o = std::make_shared<Opts>();
    auto* m = cmd->add_option("--model", o->model, "Model directory (config.json model_type picks the format)");
    cmd->add_option("--format", o->format, "deepseek-v41 or deepseek-v4")->excludes(m);
    cmd->add_option("--request", o->request, "OpenAI chat request JSON file ('-' for stdin)")->required();
    cmd->add_flag("--ids", o->ids, "Print token ids (needs the model's tokenizer.json)");
    cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json for --ids (default: MODEL/tokenizer.json)");
    cmd->add_flag("--enable-thinking", o->enable_thinking,
                  "A request that says nothing about thinking thinks (as `serve --enable-thinking`)");
    cmd->add_flag("--json", o->json, "Print {\"prompt\", \"special_ranges\"} (or the OpenAI error body)");
    cmd->callback([o, &exit_code] {
        PEREGRINE_CHECK(!o->model.empty() || !o->format.empty(), "give --model DIR or --format NAME");
        ChatFormat fmt = o->model.empty() ? chat_format_from_name(o->format) : chat_format_from_model_dir(o->model);
        std::string body = o->request == "-" ? std::string(std::istreambuf_iterator<char>(std::cin), {})
                                             : read_file(o->request);
        RenderedPrompt p;
        try {
            p = render_prompt(parse_chat_request_text(body, {.default_thinking = o->enable_thinking}), fmt);
        } catch (const RequestError& e) {
            if (o->json) std::printf("%s\n", e.to_openai_json().dump().c_str());
            std::fprintf(stderr, "error: %s%s\n", e.what(),
                         e.param().empty() ? "" : (" (param " + e.param() + ")").c_str());
            exit_code = 1;
            return;
        }
        if (o->ids) {
            std::string tk_path = !o->tokenizer.empty() ? o->tokenizer : o->model + "/tokenizer.json";
            PEREGRINE_CHECK(!o->tokenizer.empty() || !o->model.empty(), "--ids needs --model DIR or --tokenizer FILE");
            auto ids = prompt_token_ids(p, Tokenizer::from_file(tk_path));
            if (o->json) {
                std::printf("%s\n", nlohmann::json(ids).dump().c_str());
            } else {
                for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
                std::printf("\n");
            }
        } else if (o->json) {
            nlohmann::json j = {{"prompt", p.text}, {"special_ranges", p.special_ranges}};
            std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
        } else {
            std::fwrite(p.text.data(), 1, p.text.size(), stdout);
        }
        exit_code = 0;
    });
});

}  // namespace peregrine
