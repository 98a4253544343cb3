// peregrine forward: logits of every position of an id sequence, through prefill (optionally chunked)
// and one-token decode steps, as raw little-endian float32 [n_positions, vocab].
#include "commands.h"
#include "engine/sequence_runner.h"
#include "util/error.h"
#include "util/file.h"

#include <cstdio>
#include <sstream>

namespace peregrine {

std::vector<int32_t> parse_id_list(const std::string& text) {
    std::vector<int32_t> ids;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        size_t b = item.find_first_not_of(" \t\n"), e = item.find_last_not_of(" \t\n");
        if (b == std::string::npos) continue;
        item = item.substr(b, e - b + 1);
        try {
            size_t used = 0;
            long v = std::stol(item, &used);
            if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
            ids.push_back(static_cast<int32_t>(v));
        } catch (const std::exception&) {
            fail("'{}' is not a token id", item);
        }
    }
    return ids;
}

namespace {

struct ForwardArgs {
    std::string model, synthetic, ids, ids_file, out, device = "cpu";
    int64_t decode_from = -1;
    int prefill_chunk = 0, synthetic_layers = 4, synthetic_experts = 0;
};

int run_forward(const ForwardArgs& a) {
    std::vector<int32_t> ids = parse_id_list(a.ids_file.empty() ? a.ids : read_file(a.ids_file));
    PEREGRINE_CHECK(!ids.empty(), "no token ids given");
    const int64_t n = static_cast<int64_t>(ids.size());
    const int64_t decode_from = a.decode_from < 0 ? n : std::min(a.decode_from, n);
    PEREGRINE_CHECK(decode_from >= 1, "--decode-from must be at least 1 (the first position is always prefilled)");

    ModelOptions opts;
    opts.device = a.device;
    auto model = a.synthetic.empty()
                     ? Model::load(a.model, opts)
                     : Model::synthetic(synthetic_preset_config(a.synthetic, a.synthetic_layers, a.synthetic_experts),
                                        opts);
    const int vocab = model->config().vocab_size;
    SequenceRunner run(*model, n);
    // Positions before decode_from are prefilled (in chunks if asked), the rest fed one at a time.
    std::vector<float> out = run.feed({ids.begin(), ids.begin() + decode_from}, a.prefill_chunk, true);
    for (int64_t p = decode_from; p < n; ++p) {
        auto step = run.feed({ids[static_cast<size_t>(p)]}, 0, true);
        out.insert(out.end(), step.begin(), step.end());
    }
    write_file(a.out, out.data(), out.size() * sizeof(float));
    std::fprintf(stderr, "wrote %lld x %d logits to %s\n", static_cast<long long>(n), vocab, a.out.c_str());
    return 0;
}

RegisterCommand reg([](CLI::App& app, int& exit_code) {
    auto a = std::make_shared<ForwardArgs>();
    auto* cmd = app.add_subcommand("forward", "Write the logits of every position as float32 [n, vocab]");
    auto* model = cmd->add_option("--model", a->model, "Model directory");
    cmd->add_option("--synthetic", a->synthetic, "Made-up weights instead, as serve --synthetic (v41-flash, v4-flash)")
        ->excludes(model);
    cmd->add_option("--synthetic-layers", a->synthetic_layers, "Layers of the synthetic model");
    cmd->add_option("--synthetic-experts", a->synthetic_experts, "Routed experts per layer (default: the release's)");
    auto* ids = cmd->add_option("--ids", a->ids, "Comma-separated token ids");
    cmd->add_option("--ids-file", a->ids_file, "File with comma-separated token ids")->excludes(ids);
    cmd->add_option("--decode-from", a->decode_from, "Positions from N on are fed one token at a time");
    cmd->add_option("--prefill-chunk", a->prefill_chunk, "Prefill in chunks of C tokens");
    cmd->add_option("--out", a->out, "Output file (raw little-endian float32)")->required();
    cmd->add_option("--device", a->device, "cpu or cuda");
    cmd->callback([a, &exit_code] {
        if (a->ids.empty() && a->ids_file.empty()) fail("give --ids or --ids-file");
        if (a->model.empty() && a->synthetic.empty()) fail("give --model or --synthetic");
        exit_code = run_forward(*a);
    });
});

}  // namespace
}  // namespace peregrine
