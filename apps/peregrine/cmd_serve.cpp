// peregrine serve: the OpenAI-compatible HTTP server over the batching engine.
#include "commands.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "io/generation_config.h"
#include "kv/cache_manager.h"
#include "model/parallel_models.h"
#include "ops/diagnostics.h"
#include "server/api_server.h"
#include "tokenizer/byte_tokenizer.h"
#include "util/error.h"
#include "util/file.h"
#include "util/log.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <pthread.h>
#include <thread>
#include <unistd.h>

namespace peregrine {

std::string default_model_dir();

namespace {

struct ServeArgs {
    std::string model, tokenizer, host = "127.0.0.1", served_model_name, kv_memory, api_key,
        log_level = "info", device = "cpu", engram_placement = "device", scripted_output, synthetic,
        sampling_defaults = "model";
    int64_t swa_prefix_tails = -1;
    double shutdown_timeout = 30, mem_fraction_static = 0.88;
    int port = 30000, max_running = 64, max_queued = 1024, chunked_prefill = 0, page_tokens = 16, dp = 1, ep = 1;
    int synthetic_layers = 4, synthetic_experts = 0;
    bool synthetic_engram = false;
    std::string speculative_algorithm;
    int speculative_num_draft_tokens = 0;
    std::string speculative_schedule = "confidence";
    int grammar_compile_threads = 2, grammar_compile_queue = 32, max_connections = 4096;
    double grammar_compile_timeout = 5.0;
    ExpertParallelOptions ep_opts;
    int64_t context_length = 0, default_max_tokens = 0;
    bool disable_radix_cache = false, enable_thinking = false, disable_overlap_schedule = false;
    bool enable_deterministic_inference = false;
    // The hierarchical cache (SGLang's HiCache flags).
    bool enable_hierarchical_cache = false;
    bool enable_encoder_swa_bounded_replay = false, enable_decoder_swa_bounded_replay = false;
    double hicache_ratio = 2.0, hicache_size = 0.0;  // host pages per device page, or GB of host memory
    std::string hicache_write_policy = "write_through", hicache_storage_backend, hicache_storage_dir,
        hicache_storage_url = "redis://127.0.0.1:6379";
};

// What storage keys are seeded with, so that entries of other weights never match: the config, and every
// shard's name, size and a sample of its bytes (reading all of a large checkpoint would take minutes).
std::string model_identity(const ServeArgs& a) {
    if (!a.synthetic.empty())
        return fmt::format("synthetic {} layers {} experts {}{}", a.synthetic, a.synthetic_layers, a.synthetic_experts,
                           a.synthetic_engram ? " engram" : "");
    namespace fs = std::filesystem;
    std::string id = read_file(a.model + "/config.json");
    std::vector<fs::path> shards;
    for (const auto& e : fs::directory_iterator(a.model))
        if (e.path().extension() == ".safetensors") shards.push_back(e.path());
    std::sort(shards.begin(), shards.end());
    for (const auto& s : shards) {
        const auto size = fs::file_size(s);
        std::ifstream f(s, std::ios::binary);
        std::string sample(std::min<uintmax_t>(size, 4096), '\0');
        f.seekg(static_cast<std::streamoff>(size / 2));
        f.read(sample.data(), static_cast<std::streamsize>(sample.size()));
        id += fmt::format("|{} {} ", s.filename().string(), size) + sample;
    }
    return id;
}

int64_t host_available_bytes() {
    std::ifstream f("/proc/meminfo");
    std::string key;
    int64_t kb = 0;
    std::string unit;
    while (f >> key >> kb >> unit)
        if (key == "MemAvailable:") return kb * 1024;
    return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
}

// "0.3" = a fraction of the available memory; "512M", "2G", "1048576" = bytes.
int64_t parse_memory(const std::string& s) {
    PEREGRINE_CHECK(!s.empty(), "--kv-memory is empty");
    size_t used = 0;
    double v = std::stod(s, &used);
    std::string unit = s.substr(used);
    if (unit.empty() && v > 0 && v <= 1.0 && s.find('.') != std::string::npos)
        return static_cast<int64_t>(v * static_cast<double>(host_available_bytes()));
    double mul = 1;
    if (unit == "K" || unit == "KB" || unit == "KiB") mul = 1024.0;
    else if (unit == "M" || unit == "MB" || unit == "MiB") mul = 1024.0 * 1024;
    else if (unit == "G" || unit == "GB" || unit == "GiB") mul = 1024.0 * 1024 * 1024;
    else if (!unit.empty()) fail("--kv-memory '{}': expected bytes (with K/M/G) or a fraction like 0.3", s);
    PEREGRINE_CHECK(v > 0, "--kv-memory must be positive");
    return static_cast<int64_t>(v * mul);
}

// Start-up progress on stderr: one bar that fills stage by stage, with each stage's time.
class StartupProgress {
public:
    explicit StartupProgress(int stages) : stages_(stages), t0_(std::chrono::steady_clock::now()), last_(t0_) {}
    void begin(const std::string& what) {
        std::lock_guard lk(mu_);
        what_ = what;
        note_.clear();
        draw(false);
    }
    // Redraws the stage with `note` after its name (from another thread while the stage runs).
    void note(const std::string& note) {
        std::lock_guard lk(mu_);
        note_ = note;
        draw(false);
    }
    void done() {
        std::lock_guard lk(mu_);
        ++done_;
        draw(true);
    }

private:
    void draw(bool finished) {
        const auto now = std::chrono::steady_clock::now();
        const int width = 24, filled = width * done_ / stages_;
        std::string bar(static_cast<size_t>(filled), '#');
        bar.resize(static_cast<size_t>(width), '.');
        std::fprintf(stderr, "\r  [%s] %d/%d %-28s %-34s", bar.c_str(), done_, stages_, what_.c_str(), note_.c_str());
        if (finished) {
            std::fprintf(stderr, "%6.2f s\n", std::chrono::duration<double>(now - last_).count());
            last_ = now;
        }
        std::fflush(stderr);
    }
    std::mutex mu_;
    int stages_, done_ = 0;
    std::string what_, note_;
    std::chrono::steady_clock::time_point t0_, last_;
};

// The checkpoint's shard bytes (what the upload progress counts towards).
size_t checkpoint_bytes(const std::string& dir) {
    size_t total = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
        if (e.path().extension() == ".safetensors") total += static_cast<size_t>(e.file_size(ec));
    return total;
}

// While the weights go to the device: the bytes uploaded so far and their rate, four times a second.
class UploadMeter {
public:
    UploadMeter(StartupProgress& progress, const Diagnostics& d, size_t total)
        : progress_(progress), d_(d), total_(total), base_(d.weight_bytes_uploaded()),
          t0_(std::chrono::steady_clock::now()), thread_([this] { run(); }) {}
    ~UploadMeter() { stop(); }
    void stop() {
        {
            std::lock_guard lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
        show();
    }

private:
    void run() {
        std::unique_lock lk(mu_);
        while (!cv_.wait_for(lk, std::chrono::milliseconds(250), [this] { return stop_; })) show();
    }
    void show() {
        const double gb = static_cast<double>(d_.weight_bytes_uploaded() - base_) / 1e9;
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
        progress_.note(total_ > 0 ? fmt::format("{:.1f} of {:.1f} GB, {:.1f} GB/s", gb, total_ / 1e9, gb / s)
                                  : fmt::format("{:.1f} GB, {:.1f} GB/s", gb, gb / s));
    }
    StartupProgress& progress_;
    const Diagnostics& d_;
    const size_t total_, base_;
    const std::chrono::steady_clock::time_point t0_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::thread thread_;
};

int run_serve(ServeArgs& a) {
    // SIGINT/SIGTERM are blocked in every thread (the engine's and the HTTP pool inherit the mask) and
    // taken by one watcher thread that stops the server, so shutdown never runs inside a signal handler.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
    log_init(a.log_level);
    if (!a.synthetic.empty()) {
        PEREGRINE_CHECK(a.model.empty() && a.dp == 1, "--synthetic takes neither --model nor --dp");
    }
    if (a.model.empty()) a.model = a.synthetic.empty() ? default_model_dir() : "synthetic-" + a.synthetic;
    const auto t0 = std::chrono::steady_clock::now();
    std::fprintf(stderr, "peregrine serve: loading %s (%s)\n", a.model.c_str(), a.device.c_str());
    // 8K-token steps on a GPU (measured: docs/perf/h200-serve-40layers.md); the CPU's steps stay short.
    if (a.chunked_prefill == 0) a.chunked_prefill = a.device == "cuda" ? 8192 : 512;
    StartupProgress progress(a.device == "cuda" && a.kv_memory.empty() ? 5 : 4);
    progress.begin("model weights");
    ModelOptions mo;
    mo.device = a.device;
    mo.page_tokens = a.page_tokens;
    if (a.engram_placement == "peer")
        fail("--engram-placement peer (tables sharded over the GPUs, read over NVLink) needs several GPUs and is not "
             "available yet: use device or host");
    PEREGRINE_CHECK(a.engram_placement == "device" || a.device == "cuda",
                    "--engram-placement {} places tables in GPU-readable memory: it needs --device cuda",
                    a.engram_placement);
    mo.engram_placement = a.engram_placement;
    mo.batch_invariant = a.enable_deterministic_inference;
    PEREGRINE_CHECK(!a.enable_deterministic_inference ||
                        !(a.enable_encoder_swa_bounded_replay || a.enable_decoder_swa_bounded_replay),
                    "--enable-deterministic-inference: SWA bounded replay is not numerically equal to a full prefill");
    if (a.ep != a.dp)
        fail(
            "--ep {} with --dp {}: expert parallelism runs over the data-parallel attention ranks (give both the same N)",
            a.ep, a.dp);
    a.ep_opts.ranks = a.dp;
    ParallelModels group;
    if (a.synthetic.empty()) {
        group = ParallelModels::load(a.model, mo, a.ep_opts);
    } else {  // a release's dimensions and formats with made-up weights (serving benchmarks at real sizes)
        ModelConfig cfg = synthetic_preset_config(a.synthetic, a.synthetic_layers, a.synthetic_experts);
        if (a.synthetic_engram) add_synthetic_engram(cfg);
        group.models.push_back(Model::synthetic(cfg, mo));
    }
    Model* model = group.models[0].get();
    progress.done();
    progress.begin("tokenizer");
    std::optional<Tokenizer> tok;
    std::string tok_source;
    if (!a.tokenizer.empty()) {
        tok = Tokenizer::from_file(a.tokenizer);
        tok_source = a.tokenizer;
    } else if (file_exists(a.model + "/tokenizer.json")) {
        tok = Tokenizer::from_model_dir(a.model);
        tok_source = a.model + "/tokenizer.json";
    } else {
        PEREGRINE_CHECK(model->config().vocab_size >= 256,
                        "the model has no tokenizer.json and fewer than 256 ids: give --tokenizer");
        tok = byte_tokenizer();
        tok_source = "bytes (the model has no tokenizer.json)";
        // A byte per token makes prompts several times longer than a BPE vocabulary would; the tiny
        // test models declare only the context their goldens used, and RoPE has no hard limit.
        if (a.context_length == 0)
            a.context_length = std::max<int64_t>(model->config().max_position_embeddings, 8192);
    }
    progress.done();
    const auto& cfg = model->config();
    // State memory: on a GPU, what --mem-fraction-static leaves beside the weights (measured by a warm-up step);
    // on the CPU (or given), --kv-memory.
    std::optional<DeviceMemoryPlan> plan;
    if (a.device == "cuda" && a.kv_memory.empty()) {
        progress.begin("weights to the device, warm-up");
        UploadMeter meter(progress, *group.ranks().front()->backend().diagnostics(),
                          a.synthetic.empty() ? checkpoint_bytes(a.model) : 0);
        plan = plan_device_memory(group.ranks(), a.mem_fraction_static, a.chunked_prefill);
        meter.stop();
        progress.done();
    }
    progress.begin("state pages");
    if (a.kv_memory.empty()) a.kv_memory = "0.05";
    const int64_t kv_bytes = plan ? static_cast<int64_t>(plan->state) : parse_memory(a.kv_memory);
    // Window pages only for what running sequences read plus the cached tails; the rest of the budget holds history.
    const StateLayout& layout = model->layout();
    const int64_t tails = a.swa_prefix_tails >= 0 ? a.swa_prefix_tails : a.max_running;
    const PagePool::Pages kv_pages = PagePool::pages_for_budget(
        layout, kv_bytes, window_pages_wanted(layout, a.max_running, a.chunked_prefill, tails));
    const int64_t pages = kv_pages[kHistoryPages];
    PEREGRINE_CHECK(pages > 0, "{} hold no state page ({} bytes each)",
                    plan ? plan->describe() : "--kv-memory " + a.kv_memory, layout.row_bytes());

    EngineOptions eo;
    eo.max_running_requests = a.max_running;
    eo.max_queued_requests = a.max_queued;
    eo.chunked_prefill_size = a.chunked_prefill;
    eo.kv_pages = pages;
    eo.window_pages = kv_pages[kWindowPages];
    eo.radix_cache = !a.disable_radix_cache;
    if (a.enable_hierarchical_cache) {
        PEREGRINE_CHECK(eo.radix_cache,
                        "--enable-hierarchical-cache needs the prefix cache (no --disable-radix-cache)");
        HiCacheOptions& h = eo.hicache;
        h.enabled = true;
        h.host_pages = host_pages_for(layout, kv_pages, a.hicache_ratio,
                                      static_cast<int64_t>(a.hicache_size * 1e9));
        PEREGRINE_CHECK(h.host_pages[kHistoryPages] > 0 && h.host_pages[kWindowPages] > 0,
                        "--hicache-ratio {} / --hicache-size {} GB hold no host page", a.hicache_ratio,
                        a.hicache_size);
        h.write_through = a.hicache_write_policy == "write_through";
        h.storage_backend = a.hicache_storage_backend;
        PEREGRINE_CHECK(h.storage_backend != "file" || !a.hicache_storage_dir.empty(),
                        "--hicache-storage-backend file needs --hicache-storage-dir");
        h.storage_dir = a.hicache_storage_dir;
        h.storage_url = a.hicache_storage_url;
        if (!h.storage_backend.empty()) h.identity = model_identity(a);
    } else {
        PEREGRINE_CHECK(a.hicache_storage_backend.empty(),
                        "--hicache-storage-backend needs --enable-hierarchical-cache (storage sits below host memory)");
    }
    eo.swa_replay = {a.enable_encoder_swa_bounded_replay, a.enable_decoder_swa_bounded_replay};
    if (eo.swa_replay.decoder) {
        PEREGRINE_CHECK(model->replay_layer() > 0 && model->replay_layer() < cfg.n_layers,
                        "--enable-decoder-swa-bounded-replay: this model ({}) has no layers after its last KV-source "
                        "layer (V4.1 models have)",
                        cfg.model_type);
        PEREGRINE_CHECK(a.ep == 1, "--enable-decoder-swa-bounded-replay does not run with expert parallelism (--ep)");
    }
    eo.context_length = a.context_length;
    if (a.disable_overlap_schedule) eo.overlap_schedule = 0;
    if (!a.speculative_algorithm.empty()) {
        if (a.speculative_algorithm == "dspark")
            PEREGRINE_CHECK(model->has_dspark(), "--speculative-algorithm dspark: {} has no DSpark head{}", a.model,
                            model->has_mtp() ? " (V4 models draft with mtp)" : "");
        else  // mtp, or its alias nextn
            PEREGRINE_CHECK(model->has_mtp(), "--speculative-algorithm {}: {} has no MTP layer{}",
                            a.speculative_algorithm, a.model,
                            model->has_dspark() ? " (V4.1 models draft with dspark)" : "");
        eo.speculative_draft_tokens =
            a.speculative_num_draft_tokens > 0 ? a.speculative_num_draft_tokens : model->default_drafts();
        eo.speculative_schedule = a.speculative_schedule == "confidence";
    } else {
        PEREGRINE_CHECK(a.speculative_num_draft_tokens == 0,
                        "--speculative-num-draft-tokens needs --speculative-algorithm");
    }
    Engine engine(group.ranks(), &*tok, eo);
    if (plan) {  // the pages are allocated: what the device holds now, against the plan
        plan->state_allocated = static_cast<size_t>(pages) * layout.page_bytes[kHistoryPages] +
                                static_cast<size_t>(eo.window_pages) * layout.page_bytes[kWindowPages];
        const Diagnostics::MemoryUse u = model->backend().diagnostics()->memory_use(false);
        plan->in_use = u.device_used;
        plan->pool_kept = u.pool_reserved > u.used_now ? u.pool_reserved - u.used_now : 0;
    }
    progress.done();
    progress.begin("http server");

    ApiOptions ao;
    ao.served_model_name =
        a.served_model_name.empty() ? a.model.substr(a.model.find_last_of('/') + 1) : a.served_model_name;
    ao.api_key = a.api_key;
    ao.chat_format =
        a.synthetic.empty() ? chat_format_from_model_dir(a.model) : chat_format_from_model_type(cfg.model_type);
    ao.default_thinking = a.enable_thinking;
    ao.default_max_tokens = a.default_max_tokens;
    ao.max_connections = a.max_connections;
    ao.grammar.threads = a.grammar_compile_threads;
    ao.grammar.max_queued = static_cast<size_t>(a.grammar_compile_queue);
    ao.grammar.timeout = std::chrono::milliseconds(std::llround(a.grammar_compile_timeout * 1000));
    // The model's generation_config.json fills the sampling fields a request leaves out (SGLang's default).
    GenerationConfig gen;
    if (a.sampling_defaults == "model" && a.synthetic.empty()) gen = read_generation_config(a.model);
    ao.sampling_defaults = sampling_defaults(gen);
    if (!a.scripted_output.empty()) {
        ao.scripted_output = ScriptedOutput::from_file(a.scripted_output);
        std::fprintf(stderr, "  --scripted-output %s: completions are forced from the script (a testing aid)\n",
                     a.scripted_output.c_str());
    }
    ao.server_info = nlohmann::json{
        {"model_path", a.model},
        {"served_model_name", ao.served_model_name},
        {"device", a.device},
        {"engram_placement", a.engram_placement},
        {"enable_deterministic_inference", a.enable_deterministic_inference},
        {"speculative_algorithm",
         a.speculative_algorithm.empty() ? nlohmann::json() : nlohmann::json(a.speculative_algorithm)},
        {"speculative_num_draft_tokens", eo.speculative_draft_tokens},
        {"speculative_schedule",
         a.speculative_algorithm.empty() ? nlohmann::json() : nlohmann::json(a.speculative_schedule)},
        {"mem_fraction_static", plan ? nlohmann::json(a.mem_fraction_static) : nlohmann::json()},
        {"memory_plan", plan ? nlohmann::json{{"device", plan->device}, {"total_bytes", plan->total},
                                              {"weight_bytes", plan->weights},
                                              {"activation_bytes", plan->activations},
                                              {"state_bytes", plan->state}, {"left_bytes", plan->left},
                                              {"graph_bytes", plan->graphs},
                                              {"state_allocated_bytes", plan->state_allocated},
                                              {"pool_kept_bytes", plan->pool_kept},
                                              {"in_use_bytes", plan->in_use}}
                             : nlohmann::json()},
        {"page_size", layout.page_tokens},
        {"max_total_num_tokens", engine.kv_tokens()},
        {"state_page_bytes",
         {{"history", layout.page_bytes[kHistoryPages]}, {"window", layout.page_bytes[kWindowPages]}}},
        {"window_pages", eo.window_pages},
        {"swa_prefix_tails", tails},
        {"max_running_requests", a.max_running},
        {"chunked_prefill_size", a.chunked_prefill},
        {"context_length", engine.context_length()},
        {"disable_radix_cache", a.disable_radix_cache},
        {"enable_hierarchical_cache", a.enable_hierarchical_cache},
        {"enable_encoder_swa_bounded_replay", a.enable_encoder_swa_bounded_replay},
        {"enable_decoder_swa_bounded_replay", a.enable_decoder_swa_bounded_replay},
        {"hicache_host_pages", eo.hicache.enabled ? nlohmann::json{{"history", eo.hicache.host_pages[kHistoryPages]},
                                                                   {"window", eo.hicache.host_pages[kWindowPages]}}
                                                  : nlohmann::json()},
        {"hicache_write_policy",
         a.enable_hierarchical_cache ? nlohmann::json(a.hicache_write_policy) : nlohmann::json()},
        {"hicache_storage_backend", a.hicache_storage_backend.empty() ? nlohmann::json()
                                                                      : nlohmann::json(a.hicache_storage_backend)},
        {"dp_size", a.dp},
        {"ep_size", a.ep}}.dump();
    ApiServer server(engine, *tok, ao);
    const int port = server.bind(a.host, a.port);
    progress.done();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(
        stderr,
        "  model      %s: %s, %d layers, hidden %d, vocab %d\n"
        "  tokenizer  %s\n"
        "  chat       %s\n"
        "  parallel   %s\n"
        "  kv memory  %lld pages x %d tokens = %lld tokens, %lld window pages (%.1f MiB) per rank, prefix cache %s\n"
        "  scheduler  context %lld, max running %d, max queued %d, chunked prefill %d, overlap schedule %s\n"
        "  sampling   defaults %s\n"
        "  loaded in %.2f s\n",
        ao.served_model_name.c_str(), model_variant(cfg).name(), cfg.n_layers, cfg.dim,
        cfg.vocab_size, tok_source.c_str(), std::string(chat_format_name(ao.chat_format)).c_str(),
        a.dp > 1 ? fmt::format("{} ranks: data-parallel attention, expert-parallel MoE", a.dp).c_str() : "one rank",
        static_cast<long long>(pages), layout.page_tokens, static_cast<long long>(engine.kv_tokens()),
        static_cast<long long>(eo.window_pages),
        static_cast<double>(pages * static_cast<int64_t>(layout.page_bytes[kHistoryPages]) +
                            eo.window_pages * static_cast<int64_t>(layout.page_bytes[kWindowPages])) /
            (1 << 20),
        eo.radix_cache ? "on" : "off", static_cast<long long>(engine.context_length()), a.max_running, a.max_queued,
        a.chunked_prefill, eo.overlap_schedule != 0 && a.dp == 1 && model->backend().sampler().async() ? "on" : "off",
        gen.empty() ? "temperature 1, top_p 1 (openai)" : (gen.describe() + " (generation_config.json)").c_str(), secs);
    if (plan) std::fprintf(stderr, "  gpu memory %s\n", plan->describe().c_str());
    if (!engine.speculative_schedule().empty())
        std::fprintf(stderr, "  speculative schedule: %s\n", engine.speculative_schedule().c_str());
    if (eo.hicache.enabled) {
        const auto& h = eo.hicache;
        const double host_bytes =
            static_cast<double>(h.host_pages[kHistoryPages]) * static_cast<double>(layout.page_bytes[kHistoryPages]) +
            static_cast<double>(h.host_pages[kWindowPages]) * static_cast<double>(layout.page_bytes[kWindowPages]);
        std::fprintf(stderr,
                     "  hicache    host %lld pages = %lld tokens, %lld window pages (%.1f MiB) per rank, %s%s%s\n",
                     static_cast<long long>(h.host_pages[kHistoryPages]),
                     static_cast<long long>(h.host_pages[kHistoryPages] * layout.page_tokens),
                     static_cast<long long>(h.host_pages[kWindowPages]), host_bytes / (1 << 20),
                     a.hicache_write_policy.c_str(), h.storage_backend.empty() ? "" : ", storage ",
                     h.storage_backend == "file"    ? h.storage_dir.c_str()
                     : h.storage_backend == "redis" ? h.storage_url.c_str()
                                                    : "");
    }
    std::printf("peregrine serve: listening on http://%s:%d\n", a.host.c_str(), port);
    std::fflush(stdout);
    std::atomic<bool> finished{false};
    std::thread watcher([&] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        if (finished) return;
        // Graceful: no new generations, those running finish within the deadline (or are cancelled).
        const int cancelled = server.drain(std::chrono::milliseconds(static_cast<int64_t>(a.shutdown_timeout * 1e3)));
        std::fprintf(stderr, "peregrine serve: shutting down (%d request%s cancelled at the deadline)\n", cancelled,
                     cancelled == 1 ? "" : "s");
        server.stop();
        // run() returns once the transport stopped; should a handler hold it up, nothing is lost by not
        // waiting for it (all state is in memory).
        for (int i = 0; i < 5 && !finished; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (!finished) {
            std::fprintf(stderr, "peregrine serve: stopped\n");
            std::fflush(nullptr);
            std::_Exit(0);
        }
    });
    server.run();
    finished = true;
    pthread_kill(watcher.native_handle(), SIGTERM);  // wakes the watcher when run() ended another way
    watcher.join();
    std::fprintf(stderr, "peregrine serve: stopped\n");
    return 0;
}

RegisterCommand reg([](CLI::App& app, int& exit_code) {
    auto a = std::make_shared<ServeArgs>();
    auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (continuous batching, prefix cache)");
    cmd->add_option("--model", a->model, "Model directory (default: the embedded demo model)");
    cmd->add_option("--synthetic", a->synthetic,
                    "Serve made-up weights at a release's dimensions and formats instead (v41-flash or v4-flash; "
                    "byte tokenizer)");
    cmd->add_option("--synthetic-layers", a->synthetic_layers, "Layers of the synthetic model (up to 40 or 43)")
        ->check(CLI::Range(1, 43));
    cmd->add_option("--synthetic-experts", a->synthetic_experts,
                    "Routed experts per layer of the synthetic model (default: the release's, 384 or 256)")
        ->check(CLI::Range(6, 4096));
    cmd->add_flag("--synthetic-engram", a->synthetic_engram,
                  "Give the synthetic V4.1-Flash model its engram layers (1 and 14), with tables of the release's row "
                  "count (one 101 GB table shared by both)");
    cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json (default: the model's; bytes when it has none)");
    cmd->add_option("--host", a->host, "Address to listen on");
    cmd->add_option("--port", a->port, "Port (0: any free port)")->check(CLI::Range(0, 65535));
    cmd->add_option("--served-model-name", a->served_model_name, "Model name in the API (default: the directory name)");
    cmd->add_option("--max-running-requests", a->max_running)->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--max-queued-requests", a->max_queued, "Waiting requests beyond which new ones get 429")
        ->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--chunked-prefill-size", a->chunked_prefill,
                    "Tokens per step, prefill chunks and decodes (default 8192 on --device cuda, 512 on the CPU)")
        ->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--kv-memory", a->kv_memory,
                    "State memory: bytes (512M, 2G) or a fraction of available memory (default 0.05; on a GPU "
                    "--mem-fraction-static sizes it unless this is given)");
    cmd->add_option("--mem-fraction-static", a->mem_fraction_static,
                    "GPU: the share of the device's memory for weights plus state pages (the rest holds a step's "
                    "activations and graphs)")
        ->check(CLI::Range(0.05, 0.99));
    cmd->add_option("--swa-prefix-tails", a->swa_prefix_tails,
                    "Finished sequences' last windows the window pages are sized to keep cached (default: "
                    "--max-running-requests)")
        ->check(CLI::Range(0, 1 << 24));
    cmd->add_option("--max-connections", a->max_connections,
                    "Open HTTP connections beyond which new ones are answered 503 and closed")
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--shutdown-timeout", a->shutdown_timeout,
                    "Seconds running requests get to finish after SIGTERM/SIGINT before they are cancelled")
        ->check(CLI::Range(0.0, 86400.0));
    cmd->add_option("--context-length", a->context_length,
                    "Longest sequence (default: max_position_embeddings; at least 8192 with the byte tokenizer)");
    cmd->add_option("--default-max-tokens", a->default_max_tokens,
                    "Chat max_tokens when a request gives none (default: the context)");
    cmd->add_option("--sampling-defaults", a->sampling_defaults,
                    "Sampling fields a request leaves out: 'model' (generation_config.json) or 'openai' (1.0)")
        ->check(CLI::IsMember({"model", "openai"}));
    cmd->add_option("--page-tokens", a->page_tokens, "Tokens per state page (prefix-cache granularity)")
        ->check(CLI::Range(1, 4096));
    cmd->add_option("--grammar-compile-threads", a->grammar_compile_threads,
                    "Threads compiling request grammars (response_format, regex, ebnf, tool calls)")
        ->check(CLI::Range(1, 256));
    cmd->add_option("--grammar-compile-queue", a->grammar_compile_queue,
                    "Compilations that may wait for a compile thread; beyond, requests get 429")
        ->check(CLI::Range(0, 1 << 20));
    cmd->add_option("--grammar-compile-timeout", a->grammar_compile_timeout,
                    "Seconds one grammar may take to compile before the request gets 400 (0: no limit)")
        ->check(CLI::Range(0.0, 3600.0));
    cmd->add_option("--api-key", a->api_key, "Require 'Authorization: Bearer KEY'");
    cmd->add_option("--log-level", a->log_level, "trace, debug, info, warn, error");
    cmd->add_flag("--disable-radix-cache", a->disable_radix_cache, "No prefix cache");
    cmd->add_flag("--enable-encoder-swa-bounded-replay", a->enable_encoder_swa_bounded_replay,
                  "A prefix hit whose window pages were evicted recomputes its last window of tokens (their own "
                  "window cut there) instead of the whole prefix; not numerically equal to a full prefill");
    cmd->add_flag("--enable-decoder-swa-bounded-replay", a->enable_decoder_swa_bounded_replay,
                  "V4.1: a prefill's layers after the last KV-source layer run only over its last window of tokens; "
                  "not numerically equal to a full prefill");
    cmd->add_flag("--enable-hierarchical-cache", a->enable_hierarchical_cache,
                  "Cached rows evicted from the state pages keep a copy in host memory (and storage, when given)");
    cmd->add_option("--hicache-ratio", a->hicache_ratio, "Host cache pages per state page (default 2)")
        ->check(CLI::Range(0.0, 1e6));
    cmd->add_option("--hicache-size", a->hicache_size, "Host cache in GB (1e9 bytes) per rank (overrides --hicache-ratio)")
        ->check(CLI::Range(0.0, 1e6));
    cmd->add_option("--hicache-write-policy", a->hicache_write_policy,
                    "write_through: rows copied to host memory when cached; write_back: when evicted")
        ->check(CLI::IsMember({"write_through", "write_back"}));
    cmd->add_option("--hicache-storage-backend", a->hicache_storage_backend,
                    "A third tier below host memory: file (--hicache-storage-dir) or redis (--hicache-storage-url)")
        ->check(CLI::IsMember({"file", "redis"}));
    cmd->add_option("--hicache-storage-dir", a->hicache_storage_dir,
                    "The file backend's directory (local NVMe or a shared filesystem); entries survive restarts");
    cmd->add_option("--hicache-storage-url", a->hicache_storage_url,
                    "The redis backend's server: redis://host:port or unix:///path (default redis://127.0.0.1:6379)");
    cmd->add_option("--speculative-algorithm", a->speculative_algorithm,
                    "Drafts that the next step verifies (the same outputs, greedy or seeded): dspark with V4.1's "
                    "DSpark head, mtp (nextn) with V4's MTP layer")
        ->check(CLI::IsMember({"dspark", "mtp", "nextn"}));
    cmd->add_option("--speculative-num-draft-tokens", a->speculative_num_draft_tokens,
                    "Drafts per step (default: the DSpark head's block; 3 with MTP)")
        ->check(CLI::Range(1, 64));
    cmd->add_option("--speculative-schedule", a->speculative_schedule,
                    "confidence: verify steps are timed at start-up and each step keeps the drafts whose predicted "
                    "acceptance raises its tokens per second (fewer, down to none, at large batches); fixed: every "
                    "request keeps all its drafts")
        ->check(CLI::IsMember({"confidence", "fixed"}));
    cmd->add_flag("--disable-overlap-schedule", a->disable_overlap_schedule,
                  "Wait for each step's tokens before building the next (by default, with cuda, the next step is "
                  "enqueued while the GPU runs the current one)");
    cmd->add_flag("--enable-deterministic-inference", a->enable_deterministic_inference,
                  "Outputs independent of batching: a request's greedy (or seeded) tokens are the same whatever ran "
                  "beside it, however its prompt was chunked, with prefix hits, preemption and speculation (every row "
                  "lists its attention keys as its decode step does; cuda computes with exact numerics)");
    cmd->add_flag("--enable-thinking", a->enable_thinking, "Chat requests think unless they say otherwise");
    cmd->add_option("--device", a->device, "cpu or cuda");
    cmd->add_option("--engram-placement", a->engram_placement,
                    "cuda: Engram tables in device memory, or in pinned host memory the GPU reads over PCIe (host)")
        ->check(CLI::IsMember({"device", "host", "peer"}));
    cmd->add_option("--dp", a->dp,
                    "Data-parallel attention ranks (with cuda: GPUs 0..N-1), each with its own requests and KV")
        ->check(CLI::Range(1, 64));
    cmd->add_option("--ep", a->ep, "Expert-parallel ranks for the MoE layers (equal to --dp)")
        ->check(CLI::Range(1, 64));
    cmd->add_option("--ep-redundant-experts", a->ep_opts.redundant_experts, "Extra expert copies per rank (EPLB)")
        ->check(CLI::Range(0, 1 << 16));
    cmd->add_option("--expert-load", a->ep_opts.expert_load_file,
                    "JSON list of per-expert loads that places the experts and their redundant copies (EPLB)");
    cmd->add_option("--scripted-output", a->scripted_output,
                    "Testing aid: JSON list of completion texts; each chat/messages request is forced to emit the next "
                    "one token by token (normal sampling once the list is used up)");
    cmd->callback([a, &exit_code] { exit_code = run_serve(*a); });
});

}  // namespace
}  // namespace peregrine
