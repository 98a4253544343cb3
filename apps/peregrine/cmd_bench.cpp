// peregrine bench engine: forward-step timings of a synthetic model at real V4.1-Flash dimensions, with
// the released weight formats: decode steps (batch x cached context) and prefill chunks on top of a
// cached context, as ms/step, tokens/s, TFLOP/s and GB/s against the card's limits (HBM bandwidth measured
// by a device-to-device copy in the same run, FP8 dense peak from the datasheet), with a per-op breakdown.
// The cached context is random state (its prefill is not run). Table to stdout, JSON to --json.
#include "bench_engine_ep.h"
#include "bench_steps.h"
#include "commands.h"
#include "engine/sampling_params.h"
#include "kv/page_pool.h"
#include "model/model.h"
#include "util/error.h"
#include "util/file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace peregrine {
namespace {

constexpr double kFp8DensePeakTflops = 1979.0;  // H100/H200 SXM datasheet, dense e4m3

struct BenchArgs {
    std::string synthetic = "v41-flash", device = "cuda", json, engram_placement = "device";
    bool synthetic_engram = false;  // V4.1-Flash's engram layers with tables of the release's row count
    bool synthetic_dspark = false;  // and its DSpark head (verify grid: drafting time)
    std::string verify_tokens;      // speculative verify steps: tokens per sequence (its token + drafts)
    int layers = 6, experts = 384, steps = 3, ep = 1;
    bool balanced = false;
    bool device_sampling = false;  // sample on the device instead of copying the logits to the host
    bool overlap = false;          // decode: the serving engine's overlapped schedule (implies device sampling)
    std::string decode_batches = "8,16,32,64,128,256", contexts = "8192,131072",
                prefill_tokens = "4096,8192,16384,32768,65536";
    int64_t prefill_context = 131072;
    double max_step_seconds = 20.0;
    std::string prompts;  // whole prompts prefilled from nothing, with and without decoder SWA bounded replay
    int prompt_chunk = 8192;
};

// Milliseconds to prefill a prompt of n tokens from nothing in chunks (the last row's logits to the host), with
// the rows below replay_from stopping after the last KV source (0: every row runs every layer).
double prefill_prompt_ms(Model& m, int64_t n, int chunk, int64_t replay_from) {
    PagePool pool(m.backend().state_memory(), m.layout(), m.layout().pages_for(n + 1));
    SeqState s;
    pool.init(s);
    PEREGRINE_CHECK(pool.reserve(s, n), "no state pages for a {}-token prompt", n);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % 100000 + 100);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t p = 0; p < n; p += chunk) {
        const int count = static_cast<int>(std::min<int64_t>(chunk, n - p));
        ForwardBatch b;
        b.seqs.push_back({&s, p, count, 0});
        b.seqs.back().replay_from = replay_from;
        b.token_ids.assign(ids.begin() + p, ids.begin() + p + count);
        b.mode = BatchMode::prefill;
        std::vector<int> rows;
        if (p + count == n) rows.push_back(count - 1);
        (void)m.forward(b, rows);  // the last step's host logits wait for every step before it
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    pool.release(s);
    return ms;
}

int64_t linear_bytes(const LinearWeight& w) {
    return w.empty() ? 0 : static_cast<int64_t>(w.w.nbytes() + (w.scale.empty() ? 0 : w.scale.nbytes()));
}
double linear_flops(const LinearWeight& w) { return w.empty() ? 0.0 : 2.0 * w.out * w.in; }

// Bytes and FLOPs of one forward step, counted from the weights and the layer roles.
struct Cost {
    double weight_bytes = 0, state_bytes = 0, gemm_flops = 0, attn_flops = 0;
};

Cost step_cost(const Model& m, int64_t rows, int64_t ctx, int64_t logit_rows, bool balanced) {
    const ModelConfig& c = m.config();
    const ModelWeights& w = m.weights();
    const auto infos = attention_layer_infos(c);
    Cost k;
    const double E = c.n_routed_experts, pairs = static_cast<double>(rows) * c.n_activated_experts;
    const double experts_hit = balanced ? std::min(E, pairs) : E * (1.0 - std::pow(1.0 - 1.0 / E, pairs));
    for (int l = 0; l < c.n_layers; ++l) {
        const BlockWeight& b = w.layers[static_cast<size_t>(l)];
        const AttentionWeight& a = b.attn;
        std::vector<const LinearWeight*> lin = {&a.wq_a, &a.wq_b, &a.wkv, &a.wo_a, &a.wo_b, &b.ffn.gate,
                                                &b.ffn.shared.w1, &b.ffn.shared.w2, &b.ffn.shared.w3};
        if (a.compressor) lin.insert(lin.end(), {&a.compressor->wkv, &a.compressor->wgate});
        if (a.indexer) lin.insert(lin.end(), {&a.indexer->wq_b, &a.indexer->weights_proj});
        for (auto* x : lin) {
            k.weight_bytes += linear_bytes(*x);
            k.gemm_flops += linear_flops(*x) * rows;
        }
        const ExpertWeight& e0 = b.ffn.experts.at(0);
        const double expert_bytes = linear_bytes(e0.w1) + linear_bytes(e0.w2) + linear_bytes(e0.w3);
        k.weight_bytes += experts_hit * expert_bytes;
        k.gemm_flops += pairs * (linear_flops(e0.w1) + linear_flops(e0.w2) + linear_flops(e0.w3));
        // Attention reads per row: window keys, selected compressed keys, indexer keys (packed state entries).
        const AttentionLayerInfo& info = infos[static_cast<size_t>(l)];
        const StateLayout& L = m.layout();
        const LayerStateLayout& own = L.layers[static_cast<size_t>(l)];
        const double width = info.ratio > 0 ? static_cast<double>(ctx) / info.ratio : 0.0;
        const double win_keys = std::min<double>(c.window_size, ctx);
        const double comp_keys =
            info.ratio > 0 ? std::min<double>(info.attend_all_compressed ? width : c.index_topk, width) : 0.0;
        const double keys = win_keys + comp_keys;
        k.attn_flops += rows * 4.0 * c.n_heads * keys * c.head_dim;
        const size_t comp_bytes =
            info.comp_source >= 0 ? L.layers[static_cast<size_t>(info.comp_source)].comp.entry_bytes : 0;
        const size_t index_bytes =
            info.has_indexer ? L.layers[static_cast<size_t>(info.index_k_source)].index_k.entry_bytes : 0;
        const double per_row_state = win_keys * static_cast<double>(own.window.entry_bytes) +
                                     comp_keys * static_cast<double>(comp_bytes) +
                                     width * static_cast<double>(index_bytes);
        if (info.has_indexer) k.attn_flops += rows * 2.0 * c.index_n_heads * c.index_head_dim * width;
        // Decode rows read their own state; prefill rows of one sequence share it (count it once).
        k.state_bytes += (logit_rows == rows ? rows : 1) * per_row_state;
    }
    k.weight_bytes += linear_bytes(w.head) + static_cast<double>(rows) * c.dim * 2.0;
    k.gemm_flops += linear_flops(w.head) * logit_rows;
    return k;
}

// State bytes per token of a sequence, by kind (the entries' packed sizes over the tokens they cover).
struct StateBytes {
    double window = 0, comp = 0, index = 0;
    double total() const { return window + comp + index; }
};
StateBytes state_bytes(const Model& m) {
    StateBytes b;
    for (const LayerStateLayout& L : m.layout().layers) {
        if (L.window.present()) b.window += static_cast<double>(L.window.entry_bytes) / L.window.per_entry_tokens;
        if (L.comp.present()) b.comp += static_cast<double>(L.comp.entry_bytes) / L.comp.per_entry_tokens;
        if (L.index_k.present()) b.index += static_cast<double>(L.index_k.entry_bytes) / L.index_k.per_entry_tokens;
    }
    return b;
}

struct Measured {
    double ms = 0;
    double wait_ms = 0;  // of ms: the host waiting for the logits (the rest: the host enqueueing the step)
    std::map<std::string, double> ops;
};

// The sampler's rows for n logits rows at a step: top-p 0.95, row i seeded with i, the step's draw.
std::vector<SampleRow> top_p_rows(size_t n, int step) {
    std::vector<SampleRow> rows(n);
    SamplingParams sp;
    sp.top_p = 0.95f;
    for (size_t i = 0; i < n; ++i) {
        rows[i].row = static_cast<int>(i);
        rows[i].config = sample_config(sp);
        rows[i].seed = i;
        rows[i].index = static_cast<uint64_t>(step);
    }
    return rows;
}

// Runs `steps` timed forward steps (after one warm-up) of `n_seqs` sequences with cached context `ctx`,
// feeding `rows_per_seq` tokens each; the last step is profiled per op.
Measured run_steps(Model& m, Diagnostics& be, int n_seqs, int64_t ctx, int rows_per_seq, int steps,
                   double max_step_seconds, bool* too_slow, bool device_sampling = false, bool overlap = false) {
    // Untimed first steps: decode's second call at a batch size captures its CUDA graphs, so it warms up twice.
    const int warm = rows_per_seq == 1 && steps > 1 ? 2 : 1;
    CachedSequences seqs(m, be, n_seqs, ctx, static_cast<int64_t>(rows_per_seq) * (steps + warm + 1));
    DeviceSampler& sampler = m.backend().sampler();
    Measured r;
    std::vector<double> times, waits;
    be.take_host_wait_ms();
    for (int step = 0; step < warm + steps; ++step) {
        std::vector<int> logit_rows;
        ForwardBatch batch = seqs.next_batch(rows_per_seq, logit_rows);
        const bool last = step == warm + steps - 1;
        be.set_profiling(last);
        auto t0 = std::chrono::steady_clock::now();
        if (overlap) {
            // The engine's overlapped schedule: this step reads the previous step's samples on the device (deferred
            // ids), is enqueued, and only then are the previous step's ids taken. A step's time is one iteration:
            // in the steady state the longer of the host's enqueue and the device's step.
            if (step > 0)
                for (size_t i = 0; i < batch.token_ids.size(); ++i)
                    batch.token_ids[i] = DeviceSampler::deferred_id(static_cast<int>(i));
            sampler.start(m.forward(batch, logit_rows, false), top_p_rows(logit_rows.size(), step));
            if (step > 0) (void)sampler.finish();
        } else if (device_sampling) {  // logits stay on the device; the ids come back: the step is complete
            (void)sampler.sample(m.forward(batch, logit_rows, false), top_p_rows(logit_rows.size(), step));
        } else {
            Tensor logits = m.forward(batch, logit_rows);  // host logits: the step is complete
        }
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double wait = be.take_host_wait_ms();
        be.set_profiling(false);
        // The profiled step records events around every op (and launches eagerly where graphs would replay):
        // timed only when it is the one step.
        if ((step >= warm && (!last || steps == 1)) || steps == 0) {
            times.push_back(sec);
            waits.push_back(wait);
        }
        if (last) r.ops = be.profile();
        if (sec > max_step_seconds) {
            *too_slow = true;
            if (step == 0 && steps > 0) {  // no time for the timed steps: report the warm-up alone
                times.push_back(sec);
                waits.push_back(wait);
                r.ops = be.profile();
                break;
            }
        }
    }
    if (overlap) (void)sampler.finish();  // the last step's samples
    std::sort(times.begin(), times.end());
    std::sort(waits.begin(), waits.end());
    r.ms = times[times.size() / 2] * 1e3;  // median
    r.wait_ms = waits[waits.size() / 2];
    return r;
}

// A step (median of `steps` after two untimed, with the host's wait for the ids) of every sequence fed `tokens` rows,
// each row sampled on the device, as the engine samples and verifies: one row a sequence is a decode step (graphs
// where the backend has them), more a verify step of its token and drafts, cut back after it (the drafts rejected).
Measured sampled_step(Model& m, Diagnostics& be, CachedSequences& seqs, int tokens, int steps) {
    DeviceSampler& sampler = m.backend().sampler();
    std::vector<double> times, waits;
    for (int step = 0; step < steps + 2; ++step) {
        std::vector<int> rows;
        ForwardBatch b = tokens == 1 ? seqs.next_batch(1, rows) : seqs.verify_batch(tokens, rows);
        const std::vector<SampleRow> sample = top_p_rows(rows.size(), step);
        be.take_host_wait_ms();
        const auto t0 = std::chrono::steady_clock::now();
        (void)sampler.sample(m.forward(b, rows, false), sample);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const double wait = be.take_host_wait_ms();
        if (step >= 2) times.push_back(ms), waits.push_back(wait);
        if (tokens > 1) seqs.cut_back();
    }
    std::sort(times.begin(), times.end());
    std::sort(waits.begin(), waits.end());
    Measured r;
    r.ms = times[times.size() / 2];
    r.wait_ms = waits[waits.size() / 2];
    return r;
}

// Milliseconds to draft a block for each of n sequences (one pass of the DSpark head, greedy draws where the backend
// samples, as the engine drafts), median of steps; the ops of one more, profiled, into *ops.
double draft_ms(Model& m, Diagnostics& be, CachedSequences& seqs, int n, int steps,
                std::map<std::string, double>* ops) {
    std::vector<const SeqState*> all;
    std::vector<int32_t> anchors;
    for (int i = 0; i < n; ++i) all.push_back(&seqs.seq(static_cast<size_t>(i))), anchors.push_back(100 + i);
    auto greedy = [&](int, const Tensor& logits) {
        std::vector<SampleRow> rows(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) rows[static_cast<size_t>(i)].row = i;
        std::vector<int32_t> ids;
        for (const SampleResult& r : m.backend().sampler().sample(logits, rows)) ids.push_back(r.id);
        return ids;
    };
    std::vector<double> times;
    for (int step = 0; step < steps + 1; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        (void)m.draft(all, anchors, greedy);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (step >= 1) times.push_back(ms);
    }
    be.set_profiling(true);
    (void)m.draft(all, anchors, greedy);
    be.set_profiling(false);
    *ops = be.profile();
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

int run_bench(const BenchArgs& a) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a pipe even if the run is cut short
    PEREGRINE_CHECK(a.synthetic == "v41-flash", "--synthetic: only v41-flash is available");
    PEREGRINE_CHECK(a.device == "cuda", "bench engine measures the CUDA backend (--device cuda)");
    ModelConfig cfg = synthetic_v41_flash_config(a.layers, a.experts);
    if (a.synthetic_engram) add_synthetic_engram(cfg);
    if (a.synthetic_dspark) add_synthetic_dspark(cfg);
    ModelOptions opts;
    opts.device = "cuda";
    opts.engram_placement = a.engram_placement;
    auto t0 = std::chrono::steady_clock::now();
    auto model = Model::synthetic(cfg, opts);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Diagnostics* diag = model->backend().diagnostics();
    PEREGRINE_CHECK(diag != nullptr, "bench engine measures a backend with diagnostics (--device cuda)");
    Diagnostics& be = *diag;
    const double bw = be.copy_bandwidth_gbs(size_t(2) << 30, 20);
    be.set_balanced_routing(a.balanced);
    std::fflush(stdout);
    std::printf("bench engine: %s, %d layers (%d experts), balanced routing %s; synthetic weights in %.1f s\n",
                be.device_name().c_str(), a.layers, a.experts, a.balanced ? "on" : "off", load_s);
    if (a.synthetic_engram) {
        std::string layers, rows;
        for (size_t i = 0; i < cfg.engram_layer_ids.size(); ++i) {
            layers += fmt::format("{}{}", i ? ", " : "", cfg.engram_layer_ids[i]);
            rows += fmt::format("{}{}", i ? ", " : "", cfg.engram_num_embeddings[i]);
        }
        std::printf("engram layers %s: tables of %s rows (one shared table, %.1f GB) in %s memory\n",
                    layers.c_str(), rows.c_str(),
                    static_cast<double>(*std::max_element(cfg.engram_num_embeddings.begin(),
                                                          cfg.engram_num_embeddings.end())) *
                        (cfg.engram_head_dim + cfg.engram_head_dim / 32) / 1e9,
                    a.engram_placement == "host" ? "pinned host" : "device");
    }
    std::printf("measured device-to-device copy: %.0f GB/s (read + write); FP8 dense peak (datasheet): %.0f TFLOP/s\n",
                bw, kFp8DensePeakTflops);
    const StateBytes sb = state_bytes(*model);
    const StateLayout& layout = model->layout();
    const int64_t window_bytes = (layout.window_rows() + 1) * static_cast<int64_t>(layout.page_bytes[kWindowPages]);
    std::printf("state (packed entries): %.0f B/token (window K=V %.0f, compressed latents %.0f, indexer keys %.0f); "
                "pages of %d tokens: %zu B (window %zu, history %zu); held: %.0f B/token of history (with padding "
                "and the carry snapshot) + %lld window pages (%.0f KiB) per sequence\n",
                sb.total(), sb.window, sb.comp, sb.index, layout.page_tokens, layout.row_bytes(),
                layout.page_bytes[kWindowPages], layout.page_bytes[kHistoryPages],
                static_cast<double>(layout.page_bytes[kHistoryPages]) / layout.page_tokens,
                static_cast<long long>(layout.window_rows() + 1),
                static_cast<double>(window_bytes) / 1024);
    std::printf("CUDA graphs (PEREGRINE_CUDA_GRAPHS): %s\n",
                be.graphs() ? "on (decode attention and MoE blocks)" : "off");
    if (a.overlap)
        std::printf("decode schedule: overlapped (each step enqueued before the previous step's ids come back)\n");

    nlohmann::json out;
    out["device"] = be.device_name();
    out["layers"] = a.layers;
    out["experts"] = a.experts;
    out["device_sampling"] = a.device_sampling || a.overlap;
    out["overlap"] = a.overlap;
    out["balanced_routing"] = a.balanced;
    out["engram_layers"] = cfg.engram_layer_ids;
    out["engram_rows"] = cfg.engram_num_embeddings;
    out["engram_placement"] = a.engram_placement;
    out["copy_bandwidth_gbs"] = bw;
    out["cuda_graphs"] = be.graphs();
    out["fp8_dense_peak_tflops"] = kFp8DensePeakTflops;
    out["state_bytes_per_token"] = {
        {"window", sb.window}, {"compressed", sb.comp}, {"indexer", sb.index}, {"total", sb.total()},
        {"held_history_per_token",
         static_cast<double>(layout.page_bytes[kHistoryPages]) / layout.page_tokens},
        {"held_window_per_sequence", window_bytes}};
    auto save = [&] {  // after every point, so that a run cut short still leaves its results
        if (a.json.empty()) return;
        const std::string text = out.dump(2);
        write_file(a.json, text.data(), text.size());
    };
    auto ops_json = [](const std::map<std::string, double>& ops) {
        nlohmann::json j = nlohmann::json::object();
        for (auto& [k, v] : ops) j[k] = v;
        return j;
    };
    // The outermost ops' event-timed spans against the step's wall time. The spans include host work done
    // inside an op while the GPU waits (address tables, uploads); what lies outside every op (scheduling,
    // the logits copy) is the rest.
    auto ops_total_ms = [](const std::map<std::string, double>& ops) {
        double d = 0;
        for (auto& [k, v] : ops)
            if (k.find('.') == std::string::npos) d += v;
        return d;
    };
    auto ops_line = [&](const std::map<std::string, double>& ops, double wall_ms) {
        std::string s;
        for (auto& [k, v] : ops) s += fmt::format(" {}={:.2f}", k, v);
        return s +
               fmt::format(" | ops total={:.2f} outside ops={:.2f}", ops_total_ms(ops), wall_ms - ops_total_ms(ops));
    };
    // Where the host's time goes in a timed (unprofiled) step: enqueueing it, then waiting for the logits. A
    // wait near zero means the host, not the GPU, sets the step time.
    auto host_line = [](const Measured& r) {
        return fmt::format("    host (ms): enqueue={:.2f} wait for logits={:.2f}\n", r.ms - r.wait_ms, r.wait_ms);
    };
    // Warm the weight upload with a one-token step so that it does not land in the first timing.
    { bool slow = false; run_steps(*model, be, 1, 16, 1, 0, 1e9, &slow); }

    std::printf("\n%-8s %-8s %10s %10s %9s %9s %8s\n", "decode", "context", "ms/step", "tok/s", "GB/s", "of HBM",
                "TFLOP/s");
    for (int64_t ctx : parse_list(a.contexts)) {
        bool skip_rest = false;
        for (int64_t B : parse_list(a.decode_batches)) {
            nlohmann::json row{{"mode", "decode"}, {"batch", B}, {"context", ctx}};
            const double need = static_cast<double>(
                CachedSequences::bytes(model->layout(), static_cast<int>(B), ctx, a.steps + 3));
            if (skip_rest || need > 0.85 * static_cast<double>(be.free_memory())) {
                row["skipped"] = skip_rest ? "previous batch exceeded --max-step-seconds" : "state pages do not fit";
                std::printf("%-8lld %-8lld %10s\n", static_cast<long long>(B), static_cast<long long>(ctx),
                            skip_rest ? "(slow)" : "(no fit)");
                out["results"].push_back(row);
                continue;
            }
            bool slow = false;
            Measured r = run_steps(*model, be, static_cast<int>(B), ctx, 1, a.steps, a.max_step_seconds, &slow,
                                   a.device_sampling, a.overlap);
            Cost k = step_cost(*model, B, ctx, B, a.balanced);
            const double sec = r.ms * 1e-3;
            const double gbs = (k.weight_bytes + k.state_bytes) / sec / 1e9;
            const double tflops = (k.gemm_flops + k.attn_flops) / sec / 1e12;
            std::printf("%-8lld %-8lld %10.2f %10.1f %9.1f %8.1f%% %8.2f\n", static_cast<long long>(B),
                        static_cast<long long>(ctx), r.ms, B / sec, gbs, 100.0 * gbs / bw, tflops);
            std::printf("    ops (ms):%s\n", ops_line(r.ops, r.ms).c_str());
            std::printf("%s", host_line(r).c_str());
            // Without window release every row would keep its window page.
            const double full_rows = static_cast<double>(B * model->layout().pages_for(ctx + a.steps + 3)) *
                                     static_cast<double>(model->layout().row_bytes());
            row.update({{"state_gb", need / 1e9},
                        {"state_gb_every_window_page", full_rows / 1e9},
                        {"ms_per_step", r.ms},
                        {"host_wait_ms", r.wait_ms},
                        {"tokens_per_s", B / sec},
                        {"bytes", k.weight_bytes + k.state_bytes},
                        {"gb_per_s", gbs},
                        {"fraction_of_copy_bw", gbs / bw},
                        {"tflops", tflops},
                        {"ops_ms_total", ops_total_ms(r.ops)},
                        {"ops_ms", ops_json(r.ops)},
                        {"graph_memory_mib", be.graph_memory_bytes() / 1048576.0}});
            out["results"].push_back(row);
            save();
            skip_rest = slow;
        }
    }
    std::printf("CUDA graphs' memory (reserved, high-water mark): %.1f MiB\n",
                be.graph_memory_bytes() / 1048576.0);
    const Diagnostics::GraphCensus census = be.graph_census();
    std::printf("CUDA graphs captured: %lld kernel nodes, %lld other nodes; %lld of %lld kernel-to-kernel edges "
                "programmatic\n",
                static_cast<long long>(census.kernels), static_cast<long long>(census.other_nodes),
                static_cast<long long>(census.programmatic_edges), static_cast<long long>(census.kernel_edges));
    out["graph_census"] = {{"kernels", census.kernels},
                           {"other_nodes", census.other_nodes},
                           {"kernel_edges", census.kernel_edges},
                           {"programmatic_edges", census.programmatic_edges}};
    save();

    // Speculative decoding: what a step verifying drafts costs against a decode step, every row sampled on the
    // device both ways, and the TPOT speedup that implies at an accept length L (tokens a verify step emits, its
    // bonus token included): L x decode / (verify + drafting).
    const std::vector<int64_t> verify_tokens = parse_list(a.verify_tokens);
    if (!verify_tokens.empty()) {
        std::printf("\n%-8s %-6s %-7s %10s %9s %10s %10s %12s %12s\n", "verify", "batch", "tokens", "ms/step",
                    "x decode", "host wait", "draft ms", "speedup 2.5", "speedup 3.5");
        const int64_t most = *std::max_element(verify_tokens.begin(), verify_tokens.end());
        for (int64_t ctx : parse_list(a.contexts))
            for (int64_t B : parse_list(a.decode_batches)) {
                const int64_t extra = a.steps + 2 + most + 1;
                if (static_cast<double>(CachedSequences::bytes(model->layout(), static_cast<int>(B), ctx, extra)) >
                    0.85 * static_cast<double>(be.free_memory())) {
                    std::printf("%-8lld %-6lld (no fit)\n", static_cast<long long>(ctx), static_cast<long long>(B));
                    continue;
                }
                CachedSequences seqs(*model, be, static_cast<int>(B), ctx, extra);
                const Measured decode = sampled_step(*model, be, seqs, 1, a.steps);
                const bool dspark = model->has_dspark();
                std::map<std::string, double> draft_ops;
                const double drafting =
                    dspark ? draft_ms(*model, be, seqs, static_cast<int>(B), a.steps, &draft_ops) : 0;
                std::printf("%-8lld %-6lld %-7d %10.2f %9.2f %10.2f\n", static_cast<long long>(ctx),
                            static_cast<long long>(B), 1, decode.ms, 1.0, decode.wait_ms);
                if (dspark) std::printf("    draft ops (ms):%s\n", ops_line(draft_ops, drafting).c_str());
                for (int64_t t : verify_tokens) {
                    const Measured v = sampled_step(*model, be, seqs, static_cast<int>(t), a.steps);
                    auto speedup = [&](double L) {
                        return L <= t ? nlohmann::json(L * decode.ms / (v.ms + drafting)) : nlohmann::json();
                    };
                    auto cell = [](const nlohmann::json& x) {
                        return x.is_null() ? std::string("-") : fmt::format("{:.2f}", x.get<double>());
                    };
                    std::printf("%-8lld %-6lld %-7lld %10.2f %9.2f %10.2f %10s %12s %12s\n",
                                static_cast<long long>(ctx), static_cast<long long>(B), static_cast<long long>(t),
                                v.ms, v.ms / decode.ms, v.wait_ms,
                                dspark ? fmt::format("{:.2f}", drafting).c_str() : "-", cell(speedup(2.5)).c_str(),
                                cell(speedup(3.5)).c_str());
                    out["results"].push_back({{"mode", "verify"},
                                              {"context", ctx},
                                              {"batch", B},
                                              {"tokens", t},
                                              {"ms_per_step", v.ms},
                                              {"host_wait_ms", v.wait_ms},
                                              {"decode_ms_per_step", decode.ms},
                                              {"decode_host_wait_ms", decode.wait_ms},
                                              {"draft_ms", dspark ? nlohmann::json(drafting) : nlohmann::json()},
                                              {"speedup_at_accept_2_5", speedup(2.5)},
                                              {"speedup_at_accept_3_5", speedup(3.5)}});
                    save();
                }
            }
    }

    std::printf("\n%-8s %-8s %10s %10s %9s %10s %9s\n", "prefill", "context", "ms/step", "tok/s", "TFLOP/s",
                "GEMM TF/s", "of FP8");
    bool skip_rest = false;
    const int64_t ctx = a.prefill_context;
    for (int64_t B : parse_list(a.prefill_tokens)) {
        nlohmann::json row{{"mode", "prefill"}, {"new_tokens", B}, {"context", ctx}};
        if (skip_rest) {
            row["skipped"] = "previous size exceeded --max-step-seconds";
            std::printf("%-8lld %-8lld %10s\n", static_cast<long long>(B), static_cast<long long>(ctx), "(slow)");
            out["results"].push_back(row);
            continue;
        }
        bool slow = false;
        Measured r;
        try {
            r = run_steps(*model, be, 1, ctx, static_cast<int>(B), std::min(a.steps, 1), a.max_step_seconds, &slow);
        } catch (const std::exception& e) {  // e.g. the step's activations exceed device memory
            row["skipped"] = e.what();
            std::printf("%-8lld %-8lld %10s  %s\n", static_cast<long long>(B), static_cast<long long>(ctx), "(failed)",
                        e.what());
            out["results"].push_back(row);
            save();
            skip_rest = true;
            continue;
        }
        Cost k = step_cost(*model, B, ctx + B / 2, 1, a.balanced);
        const double sec = r.ms * 1e-3;
        const double tflops = (k.gemm_flops + k.attn_flops) / sec / 1e12;
        // GEMM share: the GEMM FLOPs over the time of the GEMM-bound ops (MoE and the linear projections).
        double gemm_ms = 0;
        for (auto& [name, ms] : r.ops)
            if (name == "moe" || name == "attn.q+kv projections" || name == "attn.output projection") gemm_ms += ms;
        const double gemm_tflops = gemm_ms > 0 ? k.gemm_flops / (gemm_ms * 1e-3) / 1e12 : 0.0;
        std::printf("%-8lld %-8lld %10.1f %10.1f %9.2f %10.2f %8.2f%%\n", static_cast<long long>(B),
                    static_cast<long long>(ctx), r.ms, B / sec, tflops, gemm_tflops,
                    100.0 * gemm_tflops / kFp8DensePeakTflops);
        std::printf("    ops (ms):%s\n", ops_line(r.ops, r.ms).c_str());
        row.update({{"ms_per_step", r.ms}, {"tokens_per_s", B / sec}, {"tflops", tflops}, {"gemm_tflops", gemm_tflops},
                    {"fraction_of_fp8_peak", gemm_tflops / kFp8DensePeakTflops}, {"ops_ms_total", ops_total_ms(r.ops)},
                    {"ops_ms", ops_json(r.ops)}});
        out["results"].push_back(row);
        save();
        skip_rest = slow;
    }
    if (!a.prompts.empty()) {
        const bool replay = model->replay_layer() < model->config().n_layers;
        std::printf("\n%-8s %-6s %12s %10s %14s %10s %8s\n", "prompt", "chunk", "full ms", "tok/s", "replay ms",
                    "tok/s", "saved");
        for (int64_t n : parse_list(a.prompts)) {
            prefill_prompt_ms(*model, std::min<int64_t>(n, a.prompt_chunk), a.prompt_chunk, 0);  // warm-up
            const double full = prefill_prompt_ms(*model, n, a.prompt_chunk, 0);
            const int64_t from = std::max<int64_t>(0, n - model->config().window_size) / model->layout().page_tokens *
                                 model->layout().page_tokens;
            const double rep = replay ? prefill_prompt_ms(*model, n, a.prompt_chunk, from) : 0.0;
            std::printf("%-8lld %-6d %12.1f %10.0f %14.1f %10.0f %7.1f%%\n", static_cast<long long>(n),
                        a.prompt_chunk, full, n / full * 1e3, rep, rep > 0 ? n / rep * 1e3 : 0.0,
                        rep > 0 ? 100.0 * (1.0 - rep / full) : 0.0);
            out["results"].push_back({{"mode", "prompt"},
                                      {"prompt_tokens", n},
                                      {"chunk", a.prompt_chunk},
                                      {"full_ms", full},
                                      {"decoder_replay_ms", replay ? nlohmann::json(rep) : nlohmann::json()},
                                      {"replay_layer", model->replay_layer()}});
            save();
        }
    }
    if (!a.json.empty()) std::printf("\nwrote %s\n", a.json.c_str());
    return 0;
}

RegisterCommand reg([](CLI::App& app, int& exit_code) {
    auto a = std::make_shared<BenchArgs>();
    auto* bench = app.add_subcommand("bench", "Benchmarks");
    bench->require_subcommand(1);
    auto* cmd = bench->add_subcommand("engine", "Forward-step timings of a synthetic model at real dimensions");
    cmd->add_option("--synthetic", a->synthetic, "Synthetic model (v41-flash)");
    cmd->add_option("--layers", a->layers, "Layers (cover the attention roles in order)")->check(CLI::Range(1, 40));
    cmd->add_option("--experts", a->experts, "Routed experts per layer (384 in the release)");
    cmd->add_flag("--balanced-routing", a->balanced, "Every expert equally loaded");
    cmd->add_flag("--synthetic-engram", a->synthetic_engram,
                  "V4.1-Flash's engram layers (1 and 14) with tables of the release's row count (one 101 GB table "
                  "shared by both)");
    cmd->add_flag("--synthetic-dspark", a->synthetic_dspark,
                  "V4.1-Flash's DSpark head (3 stages, 128 experts): the verify grid adds the time to draft");
    cmd->add_option("--verify-tokens", a->verify_tokens,
                    "Comma-separated tokens per sequence of speculative verify steps (its token + drafts, e.g. "
                    "2,3,4,5,6), timed against decode steps at each decode batch and context");
    cmd->add_option("--engram-placement", a->engram_placement, "Engram tables in device or pinned host memory")
        ->check(CLI::IsMember({"device", "host"}));
    cmd->add_flag("--device-sampling", a->device_sampling,
                  "Decode steps sample every row on the device (top-p 0.95, seeded) instead of copying the logits");
    cmd->add_flag(
        "--overlap", a->overlap,
        "Decode steps as the serving engine's overlapped schedule: step N+1 enqueued (reading step N's samples "
        "on the device) before step N's ids are taken");
    cmd->add_option("--device", a->device, "cuda");
    cmd->add_option("--decode-batches", a->decode_batches, "Comma-separated decode batch sizes");
    cmd->add_option("--contexts", a->contexts, "Comma-separated cached contexts for decode");
    cmd->add_option("--prefill-tokens", a->prefill_tokens, "Comma-separated new tokens per prefill step");
    cmd->add_option("--prefill-context", a->prefill_context, "Cached context under the prefill steps");
    cmd->add_option("--prompts", a->prompts,
                    "Comma-separated whole prompts to prefill from nothing, with and without decoder SWA bounded "
                    "replay (V4.1)");
    cmd->add_option("--prompt-chunk", a->prompt_chunk, "Tokens per prefill step of --prompts")
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--steps", a->steps, "Timed steps per point (median)");
    cmd->add_option("--max-step-seconds", a->max_step_seconds, "Skip larger points once a step takes longer");
    cmd->add_option("--json", a->json, "Write the results as JSON");
    cmd->add_option("--ep", a->ep, "Expert-parallel ranks (GPUs 0..N-1; batches and prefill tokens are per GPU)")
        ->check(CLI::Range(1, 64));
    cmd->callback([a, &exit_code] {
        PEREGRINE_CHECK(!(a->synthetic_engram && a->ep > 1), "--synthetic-engram: measured on one GPU (no --ep)");
        PEREGRINE_CHECK(!(a->overlap && a->ep > 1),
                        "--overlap: expert-parallel ranks step without the overlapped schedule");
        if (a->ep == 1) {
            exit_code = run_bench(*a);
            return;
        }
        EpBenchArgs e;
        e.ranks = a->ep;
        e.layers = a->layers;
        e.experts = a->experts;
        e.steps = a->steps;
        e.balanced = a->balanced;
        e.decode_batches = a->decode_batches;
        e.contexts = a->contexts;
        e.prefill_tokens = a->prefill_tokens;
        e.prefill_context = a->prefill_context;
        e.json = a->json;
        exit_code = run_bench_engine_ep(e);
    });
});

}  // namespace
}  // namespace peregrine
