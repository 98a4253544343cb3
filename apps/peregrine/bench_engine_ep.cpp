#include "bench_engine_ep.h"
#include "bench_steps.h"
#include "kv/page_pool.h"
#include "model/model.h"
#include "model/parallel_models.h"
#include "util/error.h"
#include "util/file.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <thread>

namespace peregrine {

namespace {

// The rank's backend's diagnostics (bench engine measures the CUDA backend).
Diagnostics& diagnostics_of(Model& m) {
    Diagnostics* d = m.backend().diagnostics();
    PEREGRINE_CHECK(d != nullptr, "bench engine measures a backend with diagnostics (--device cuda)");
    return *d;
}

struct RankResult {
    std::vector<double> step_s;
    std::map<std::string, double> ops;
    std::string error;
};

// One rank: `n_seqs` sequences with cached context `ctx` (random state), `rows` new tokens each per step;
// one warm-up step, then `steps` timed ones; the last is profiled per op.
RankResult run_rank(Model& m, int n_seqs, int64_t ctx, int rows, int steps) {
    RankResult r;
    Diagnostics& be = diagnostics_of(m);
    m.backend().bind_thread();
    CachedSequences seqs(m, be, n_seqs, ctx, static_cast<int64_t>(rows) * (steps + 2));
    for (int step = 0; step <= steps; ++step) {
        std::vector<int> logit_rows;
        ForwardBatch batch = seqs.next_batch(rows, logit_rows);
        be.set_profiling(step == steps);
        const auto t0 = std::chrono::steady_clock::now();
        m.forward(batch, logit_rows);
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        be.set_profiling(false);
        if (step > 0) r.step_s.push_back(sec);
        if (step == steps) r.ops = be.profile();
    }
    return r;
}

// Every rank runs the same point in lock-step; the step time is the slowest rank's median.
double run_point(ParallelModels& g, int n_seqs, int64_t ctx, int rows, int steps, std::map<std::string, double>* ops0) {
    const int n = static_cast<int>(g.models.size());
    std::vector<RankResult> res(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
            try {
                res[static_cast<size_t>(r)] = run_rank(*g.models[static_cast<size_t>(r)], n_seqs, ctx, rows, steps);
            } catch (const std::exception& e) {
                res[static_cast<size_t>(r)].error = e.what();
                g.comms[static_cast<size_t>(r)]->abort();
            }
        });
    for (auto& t : threads) t.join();
    double worst = 0;
    for (auto& r : res) {
        if (!r.error.empty()) fail("{}", r.error);
        std::sort(r.step_s.begin(), r.step_s.end());
        worst = std::max(worst, r.step_s[r.step_s.size() / 2]);
    }
    *ops0 = res[0].ops;
    return worst * 1e3;
}

std::string ops_text(const std::map<std::string, double>& ops, double wall_ms) {
    std::string s;
    double total = 0;
    for (auto& [k, v] : ops) {
        s += fmt::format(" {}={:.2f}", k, v);
        if (k.find('.') == std::string::npos) total += v;
    }
    return s + fmt::format(" | ops total={:.2f} outside ops (exchanges, host)={:.2f}", total, wall_ms - total);
}

}  // namespace

int run_bench_engine_ep(const EpBenchArgs& a) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    PEREGRINE_CHECK(a.ranks >= 2, "--ep {}: an expert-parallel group needs at least 2 GPUs", a.ranks);
    PEREGRINE_CHECK(a.experts % a.ranks == 0, "{} experts do not divide over {} ranks", a.experts, a.ranks);
    const ModelConfig cfg = synthetic_v41_flash_config(a.layers, a.experts);
    const auto t0 = std::chrono::steady_clock::now();
    ParallelModels g;
    g.comms = make_nccl_group(a.ranks);
    for (int r = 0; r < a.ranks; ++r) {
        ModelOptions o;
        o.device = "cuda";
        o.gpu = r;
        auto m = Model::synthetic(cfg, o);
        diagnostics_of(*m).set_balanced_routing(a.balanced);
        m->set_expert_parallel(std::make_shared<ExpertParallel>(*g.comms[static_cast<size_t>(r)],
                                                                ExpertPlacement::contiguous(a.experts, a.ranks)));
        g.models.push_back(std::move(m));
    }
    const std::string device = diagnostics_of(*g.models[0]).device_name();
    std::printf(
        "bench engine --ep %d: %d x %s, %d layers (%d experts, %d per GPU), balanced routing %s; weights in %.1f s\n",
        a.ranks, a.ranks, device.c_str(), a.layers, a.experts, a.experts / a.ranks,
        a.balanced ? "on" : "off", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    nlohmann::json out{{"ranks", a.ranks},
                       {"layers", a.layers},
                       {"experts", a.experts},
                       {"balanced_routing", a.balanced},
                       {"device", device}};
    auto save = [&] {
        if (a.json.empty()) return;
        const std::string text = out.dump(2);
        write_file(a.json, text.data(), text.size());
    };
    std::map<std::string, double> ops;
    run_point(g, 1, 16, 1, 1, &ops);  // weight uploads and NCCL connections out of the timings

    std::printf("\n%-12s %-8s %10s %14s %12s\n", "decode/GPU", "context", "ms/step", "tok/s per GPU", "tok/s total");
    for (int64_t ctx : parse_list(a.contexts))
        for (int64_t B : parse_list(a.decode_batches)) {
            nlohmann::json row{{"mode", "decode"}, {"batch_per_gpu", B}, {"context", ctx}};
            try {
                const double ms = run_point(g, static_cast<int>(B), ctx, 1, a.steps, &ops);
                std::printf("%-12lld %-8lld %10.2f %14.1f %12.1f\n", static_cast<long long>(B),
                            static_cast<long long>(ctx), ms, B / (ms * 1e-3), a.ranks * B / (ms * 1e-3));
                std::printf("    rank 0 ops (ms):%s\n", ops_text(ops, ms).c_str());
                row.update({{"ms_per_step", ms}, {"tokens_per_s_per_gpu", B / (ms * 1e-3)}, {"ops_ms_rank0", ops}});
            } catch (const std::exception& e) {
                std::printf("%-12lld %-8lld %10s  %s\n", static_cast<long long>(B), static_cast<long long>(ctx),
                            "(failed)", e.what());
                row["skipped"] = e.what();
                out["results"].push_back(row);
                save();
                return 1;  // the group is gone after a failure
            }
            out["results"].push_back(row);
            save();
        }
    std::printf("\n%-12s %-8s %10s %14s\n", "prefill/GPU", "context", "ms/step", "tok/s per GPU");
    for (int64_t B : parse_list(a.prefill_tokens)) {
        nlohmann::json row{{"mode", "prefill"}, {"new_tokens_per_gpu", B}, {"context", a.prefill_context}};
        try {
            const double ms = run_point(g, 1, a.prefill_context, static_cast<int>(B), std::min(a.steps, 1), &ops);
            std::printf("%-12lld %-8lld %10.1f %14.1f\n", static_cast<long long>(B),
                        static_cast<long long>(a.prefill_context), ms, B / (ms * 1e-3));
            std::printf("    rank 0 ops (ms):%s\n", ops_text(ops, ms).c_str());
            row.update({{"ms_per_step", ms}, {"tokens_per_s_per_gpu", B / (ms * 1e-3)}, {"ops_ms_rank0", ops}});
        } catch (const std::exception& e) {
            std::printf("%-12lld %-8lld %10s  %s\n", static_cast<long long>(B),
                        static_cast<long long>(a.prefill_context), "(failed)", e.what());
            row["skipped"] = e.what();
            out["results"].push_back(row);
            save();
            return 1;
        }
        out["results"].push_back(row);
        save();
    }
    if (!a.json.empty()) std::printf("\nwrote %s\n", a.json.c_str());
    return 0;
}

}  // namespace peregrine
