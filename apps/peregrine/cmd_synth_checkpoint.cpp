// peregrine synth-checkpoint: a synthetic model (serve --synthetic's weights) written in the released checkpoint
// format, so that loading, memory planning and cold start can be measured on real files of real size.
#include "commands.h"
#include "model/model.h"
#include "model/synthetic_checkpoint.h"
#include "util/error.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fcntl.h>
#include <unistd.h>

namespace peregrine {
namespace {

namespace fs = std::filesystem;

struct SynthArgs {
    std::string preset, out, shard_size = "4G";
    int layers = 0, experts = 0;
    bool force = false;
};

// "4G", "512M", "1048576": bytes (K/M/G are powers of 1024).
size_t parse_size(const std::string& s) {
    size_t used = 0;
    double v = 0;
    try {
        v = std::stod(s, &used);
    } catch (const std::exception&) {
        fail("--shard-size '{}': expected bytes, with K, M or G", s);
    }
    const std::string unit = s.substr(used);
    double mul = 1;
    if (unit == "K") mul = 1024.0;
    else if (unit == "M") mul = 1024.0 * 1024;
    else if (unit == "G") mul = 1024.0 * 1024 * 1024;
    else if (!unit.empty()) fail("--shard-size '{}': expected bytes, with K, M or G", s);
    PEREGRINE_CHECK(v * mul >= 1, "--shard-size '{}' must be at least a byte", s);
    return static_cast<size_t>(v * mul);
}

bool is_checkpoint_file(const std::string& name) {
    return name == "config.json" || name == "generation_config.json" || name == "model.safetensors.index.json" ||
           (name.rfind("model", 0) == 0 && name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0);
}

double gb(size_t bytes) { return static_cast<double>(bytes) / 1e9; }

// The directory to write into, checked before anything is made: an existing one must be empty, or with --force its
// checkpoint files (config, index, shards) are removed first so that no stale shard is left beside the new ones;
// the disk must hold `bytes`; a missing one is then made, and must take a file.
void prepare_out_dir(const std::string& dir, bool force, size_t bytes) {
    std::error_code ec;
    fs::path existing = fs::absolute(dir);
    if (fs::exists(existing, ec)) {
        PEREGRINE_CHECK(fs::is_directory(existing, ec), "--out '{}' exists and is not a directory", dir);
        bool empty = true;
        for (const auto& e : fs::directory_iterator(existing)) {
            empty = false;
            if (force && is_checkpoint_file(e.path().filename().string())) fs::remove(e.path());
        }
        PEREGRINE_CHECK(empty || force,
                        "--out '{}' is not empty; give --force to replace the checkpoint in it (config.json, "
                        "model*.safetensors and the index are removed first)",
                        dir);
    } else {
        while (!fs::exists(existing, ec) && existing.has_parent_path() && existing != existing.parent_path())
            existing = existing.parent_path();
    }
    const fs::space_info space = fs::space(existing, ec);
    // A margin for the headers and the JSON files.
    PEREGRINE_CHECK(ec || space.available > bytes + (size_t{64} << 20),
                    "the checkpoint needs {:.2f} GB and '{}' has {:.2f} GB free", gb(bytes), existing.string(),
                    gb(space.available));
    fs::create_directories(dir, ec);
    PEREGRINE_CHECK(!ec, "cannot create --out '{}': {}", dir, ec.message());
    const std::string probe = dir + "/.peregrine-write-test";
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    PEREGRINE_CHECK(fd >= 0, "cannot write to --out '{}': {}", dir, std::strerror(errno));
    ::close(fd);
    ::unlink(probe.c_str());
}

int run_synth_checkpoint(const SynthArgs& a) {
    const ModelConfig cfg = synthetic_preset_config(a.preset, a.layers, a.experts);
    const SyntheticCheckpointPlan plan = plan_synthetic_checkpoint(cfg, 1, parse_size(a.shard_size));
    prepare_out_dir(a.out, a.force, plan.total_bytes);
    const char* shards = plan.shards.size() == 1 ? "shard" : "shards";
    std::fprintf(stderr, "synth-checkpoint: %s\n  %zu tensors, %.2f GB in %zu %s -> %s\n",
                 describe_model(cfg).c_str(), plan.n_tensors, gb(plan.total_bytes), plan.shards.size(), shards,
                 a.out.c_str());
    auto last = std::chrono::steady_clock::now();
    CheckpointWriteProgress done;
    write_synthetic_checkpoint(cfg, plan, a.out, [&](const CheckpointWriteProgress& p) {
        done = p;
        const auto now = std::chrono::steady_clock::now();
        if (now - last < std::chrono::seconds(2) && p.bytes_done < p.bytes_total) return;
        last = now;
        std::fprintf(stderr, "  %.2f / %.2f GB (%.0f%%), shard %d of %d, %.2f GB/s\n", gb(p.bytes_done),
                     gb(p.bytes_total), 100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total),
                     std::min(p.shards_done + 1, p.shards_total), p.shards_total,
                     p.seconds > 0 ? gb(p.bytes_done) / p.seconds : 0.0);
    });
    std::printf("wrote %s: %zu tensors, %.2f GB (%zu bytes) in %zu %s, %.1f s, %.2f GB/s\n", a.out.c_str(),
                plan.n_tensors, gb(plan.total_bytes), plan.total_bytes, plan.shards.size(), shards, done.seconds,
                done.seconds > 0 ? gb(plan.total_bytes) / done.seconds : 0.0);
    return 0;
}

RegisterCommand reg([](CLI::App& app, int& exit_code) {
    auto a = std::make_shared<SynthArgs>();
    auto* cmd = app.add_subcommand(
        "synth-checkpoint", "Write a synthetic model (serve --synthetic's weights) as a released checkpoint");
    cmd->add_option("--preset", a->preset, "v41-flash or v4-flash")->required();
    cmd->add_option("--layers", a->layers, "Layers (1..40 for v41-flash, 1..43 for v4-flash)")->required();
    cmd->add_option("--experts", a->experts, "Routed experts per layer (default: the release's, 384 or 256)");
    cmd->add_option("--out", a->out, "Directory to write (made if missing; must be empty unless --force)")
        ->required();
    cmd->add_option("--shard-size", a->shard_size,
                    "Most tensor bytes per shard (K, M, G: powers of 1024; 4G by default)");
    cmd->add_flag("--force", a->force, "Write into a non-empty --out, replacing the checkpoint files in it");
    cmd->callback([a, &exit_code] { exit_code = run_synth_checkpoint(*a); });
});

}  // namespace
}  // namespace peregrine
