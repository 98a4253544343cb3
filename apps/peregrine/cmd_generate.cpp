// peregrine generate: prompt (text or ids) -> streamed continuation on stdout.
#include "commands.h"
#include "engine/sampling_params.h"
#include "engine/sequence_runner.h"
#include "tokenizer/stream_decoder.h"
#include "util/error.h"
#include "util/file.h"

#include <cstdio>
#include <optional>

namespace peregrine {

std::vector<int32_t> parse_id_list(const std::string& text);
std::string default_model_dir();

namespace {

struct GenerateArgs {
    std::string model, prompt, ids, tokenizer, device = "cpu";
    int max_tokens = 64;
    std::optional<float> temperature, top_p, min_p;  // unset: the model's generation_config.json, else 1, 1, 0
    std::optional<int> top_k;
    int64_t seed = -1;
    bool ignore_eos = false, add_bos = false, print_ids = false;
};

int run_generate(GenerateArgs& a) {
    if (a.model.empty()) a.model = default_model_dir();
    ModelOptions opts;
    opts.device = a.device;
    auto model = Model::load(a.model, opts);
    std::optional<Tokenizer> tok;
    if (!a.tokenizer.empty()) tok = Tokenizer::from_file(a.tokenizer);
    else if (file_exists(a.model + "/tokenizer.json")) tok = Tokenizer::from_model_dir(a.model);

    std::vector<int32_t> prompt;
    if (!a.ids.empty()) {
        prompt = parse_id_list(a.ids);
    } else {
        if (!tok) fail("--prompt needs a tokenizer: '{}' has no tokenizer.json (give --tokenizer or --ids)", a.model);
        if (a.add_bos && tok->bos_id()) prompt.push_back(*tok->bos_id());
        auto ids = tok->encode(a.prompt, true);
        prompt.insert(prompt.end(), ids.begin(), ids.end());
    }
    PEREGRINE_CHECK(!prompt.empty(), "empty prompt");
    const int vocab = model->config().vocab_size;
    for (int32_t id : prompt)
        if (id < 0 || id >= vocab) fail("prompt token id {} is outside the vocabulary (0..{})", id, vocab - 1);

    // The model's generation_config.json, then the flags given.
    SamplingParams sp = sampling_defaults(read_generation_config(a.model));
    if (a.temperature) sp.temperature = *a.temperature;
    if (a.top_p) sp.top_p = *a.top_p;
    if (a.top_k) sp.top_k = *a.top_k;
    if (a.min_p) sp.min_p = *a.min_p;
    sp.seed = a.seed;
    SequenceRunner run(*model, static_cast<int64_t>(prompt.size()) + a.max_tokens);
    Sampler sampler(sp);
    std::optional<StreamDecoder> dec;
    if (tok && !a.print_ids) dec.emplace(*tok, true);
    std::vector<float> logits = run.feed(prompt);
    for (int i = 0; i < a.max_tokens; ++i) {
        int32_t next = sampler.sample(logits.data(), vocab);
        if (!a.ignore_eos && next == model->config().eos_token_id) break;
        if (dec) std::fputs(dec->push(next).c_str(), stdout);
        else std::printf("%s%d", i ? "," : "", next);
        std::fflush(stdout);
        if (i + 1 < a.max_tokens) logits = run.feed({next});
    }
    if (dec) std::fputs(dec->flush().c_str(), stdout);
    std::fputc('\n', stdout);
    return 0;
}

RegisterCommand reg([](CLI::App& app, int& exit_code) {
    auto a = std::make_shared<GenerateArgs>();
    auto* cmd = app.add_subcommand("generate", "Continue a prompt and stream the text to stdout");
    cmd->add_option("--model", a->model, "Model directory (default: the embedded demo model)");
    auto* p = cmd->add_option("--prompt", a->prompt, "Prompt text (special tokens in it are parsed)");
    cmd->add_option("--ids", a->ids, "Prompt as comma-separated token ids")->excludes(p);
    cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json (default: the model's)");
    cmd->add_option("--max-tokens", a->max_tokens, "Tokens to generate")->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--temperature", a->temperature, "0 = greedy (default: the model's generation_config.json, else 1)")
        ->check(CLI::Range(0.0, 100.0));
    cmd->add_option("--top-p", a->top_p)->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--top-k", a->top_k);
    cmd->add_option("--min-p", a->min_p)->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--seed", a->seed);
    cmd->add_flag("--ignore-eos", a->ignore_eos);
    cmd->add_flag("--add-bos", a->add_bos, "Start the prompt with the BOS token");
    cmd->add_flag("--print-ids", a->print_ids, "Print token ids instead of text");
    cmd->add_option("--device", a->device, "cpu or cuda");
    cmd->callback([a, &exit_code] {
        if (a->prompt.empty() && a->ids.empty()) fail("give --prompt or --ids");
        exit_code = run_generate(*a);
    });
});

}  // namespace
}  // namespace peregrine
