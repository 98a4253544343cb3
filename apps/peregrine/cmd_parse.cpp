// peregrine parse (--model DIR | --format F) --input FILE [--chunk-size N | --random-chunks SEED] [--thinking]
// [--request FILE]: feeds a raw completion through the server's streaming parser in chunks and prints the
// OpenAI assistant message it assembles.
#include "commands.h"
#include "server/protocol/assistant_message.h"
#include "server/protocol/output_parser.h"
#include "util/file.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <random>

namespace peregrine {

static RegisterCommand reg_parse([](CLI::App& app, int& exit_code) {
    auto* cmd = app.add_subcommand("parse", "Parse a raw model completion into an OpenAI assistant message");
    struct Opts {
        std::string model, format, input, request;
        size_t chunk = 0;
        int64_t seed = -1;
        bool thinking = false, no_tools = false, full = false, enable_thinking = false;
    };
    auto o = std::make_shared<Opts>();
    auto* m = cmd->add_option("--model", o->model, "Model directory (config.json model_type picks the format)");
    cmd->add_option("--format", o->format, "deepseek-v41 or deepseek-v4")->excludes(m);
    cmd->add_option("--input", o->input, "Raw completion text file ('-' for stdin)")->required();
    auto* c = cmd->add_option("--chunk-size", o->chunk, "Feed the text in chunks of N bytes (default: whole)");
    cmd->add_option("--random-chunks", o->seed, "Feed the text in random 1-16 byte chunks from this seed")->excludes(c);
    auto* th = cmd->add_flag("--thinking", o->thinking, "The prompt ended with <think>: output starts in reasoning");
    auto* nt = cmd->add_flag("--no-tools", o->no_tools, "No tools were offered: DSML stays text");
    cmd->add_option("--request", o->request, "Derive the parser setup from this OpenAI request (as the server does)")
        ->excludes(th)
        ->excludes(nt);
    cmd->add_flag("--enable-thinking", o->enable_thinking,
                  "With --request: a request that says nothing about thinking thinks (as `serve --enable-thinking`)");
    cmd->add_flag("--full", o->full, "Print {\"message\", \"finish_reason\", \"warnings\"}");
    cmd->callback([o, &exit_code] {
        PEREGRINE_CHECK(!o->model.empty() || !o->format.empty(), "give --model DIR or --format NAME");
        ChatFormat fmt = o->model.empty() ? chat_format_from_name(o->format) : chat_format_from_model_dir(o->model);
        std::string text = o->input == "-" ? std::string(std::istreambuf_iterator<char>(std::cin), {})
                                           : read_file(o->input);
        OutputParserOptions po;
        bool thinking = o->thinking;
        if (!o->request.empty()) {
            ChatRequest req = parse_chat_request_text(read_file(o->request), {.default_thinking = o->enable_thinking});
            po = output_parser_options(req, fmt);
            thinking = reports_reasoning(po.start);
        } else {
            po.format = fmt;
            po.start = o->thinking ? ParseStart::reasoning : ParseStart::content;
            po.parse_tool_calls = !o->no_tools;
        }
        OutputParser parser(po);
        AssistantMessage msg(thinking);
        std::mt19937_64 rng(static_cast<uint64_t>(o->seed));
        size_t pos = 0;
        while (pos < text.size()) {
            size_t n = o->seed >= 0 ? 1 + rng() % 16 : o->chunk ? o->chunk : text.size();
            msg.add(parser.push(std::string_view(text).substr(pos, n)));
            pos += n;
        }
        msg.add(parser.finish());
        for (auto& w : msg.warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
        ojson out = msg.to_openai_json();
        if (o->full)
            out = {{"message", out},
                   {"finish_reason", msg.finish_reason("stop", parser.cut_in_block())},
                   {"warnings", msg.warnings()}};
        std::printf("%s\n", out.dump(2, ' ', false, ojson::error_handler_t::replace).c_str());
        exit_code = 0;
    });
});

}  // namespace peregrine
