// Expert parallelism on the GPU: ranks (threads) with their own sequences and a share of the experts, on
// one GPU through the loopback group and on several GPUs through NCCL. With exact numerics every rank's
// logits equal one GPU model's bit for bit; with fast numerics (whose rounding depends on how many rows an
// expert gets) the greedy tokens agree and the logits stay within the fast-numerics bound.
#include "cuda_test_util.h"
#include "model/fixture.h"
#include "model/parallel_models.h"
#include "model/parallel_run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <thread>

namespace peregrine {
namespace {

using test::fixture_dir;

struct NumericsScope {  // backends read PEREGRINE_CUDA_NUMERICS when they are made
    explicit NumericsScope(const char* v) { setenv("PEREGRINE_CUDA_NUMERICS", v, 1); }
    ~NumericsScope() { unsetenv("PEREGRINE_CUDA_NUMERICS"); }
};

// Runs the three prompts on `ranks` (sequence s on rank s % n) in threads, and on one GPU model; compares.
void compare_with_one_gpu(const std::string& fx, std::vector<Model*> ranks, bool exact, const char* what) {
    const int steps = 5, n = static_cast<int>(ranks.size());
    auto all = test::parallel_prompts(fx);
    ModelOptions o;
    o.device = "cuda";
    auto single = Model::load(fixture_dir(fx), o);
    std::vector<int> every(all.size());
    std::iota(every.begin(), every.end(), 0);
    const auto ref = test::run_sequences(*single, all, every, steps);

    std::vector<std::vector<int>> mine(static_cast<size_t>(n));
    for (int s = 0; s < static_cast<int>(all.size()); ++s) mine[static_cast<size_t>(s % n)].push_back(s);
    std::vector<std::vector<test::SeqLogits>> got(static_cast<size_t>(n));
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
            try {
                got[static_cast<size_t>(r)] =
                    test::run_sequences(*ranks[static_cast<size_t>(r)], all, mine[static_cast<size_t>(r)], steps);
            } catch (const std::exception& e) {
                errors[static_cast<size_t>(r)] = e.what();
                ranks[static_cast<size_t>(r)]->expert_parallel()->comm().abort();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    float worst = 0.0f;
    int top1 = 0, rows = 0;
    for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < mine[static_cast<size_t>(r)].size(); ++i) {
            const int s = mine[static_cast<size_t>(r)][i];
            for (int step = 0; step < steps; ++step) {
                const auto& a = got[static_cast<size_t>(r)][i].logits[static_cast<size_t>(step)];
                const auto& b = ref[static_cast<size_t>(s)].logits[static_cast<size_t>(step)];
                ASSERT_EQ(a.size(), b.size());
                for (size_t v = 0; v < a.size(); ++v) worst = std::max(worst, std::abs(a[v] - b[v]));
                top1 += std::max_element(a.begin(), a.end()) - a.begin() ==
                        std::max_element(b.begin(), b.end()) - b.begin();
                ++rows;
            }
        }
    std::printf("PARITY ep %s %s %s ranks=%d max|d|=%.3g top1=%d/%d\n", what, fx.c_str(), exact ? "exact" : "fast", n,
                worst, top1, rows);
    if (exact) EXPECT_EQ(worst, 0.0f) << fx;
    else EXPECT_LT(worst, 5e-2f) << fx;
    EXPECT_EQ(top1, rows) << fx;
}

TEST(CudaExpertParallel, LoopbackRanksOnOneGpuMatchOneModel) {
    REQUIRE_GPU();
    for (const char* numerics : {"exact", "fast"})
        for (const char* fx : {"dsv41-tiny-a", "dsv4-tiny-a"}) {
            NumericsScope scope(numerics);
            const int n = 2;
            auto group = make_loopback_group(n);
            std::vector<std::unique_ptr<Model>> models;
            std::vector<Model*> ptrs;
            ModelOptions o;
            o.device = "cuda";
            for (int r = 0; r < n; ++r) {
                models.push_back(Model::load(fixture_dir(fx), o));
                const int E = models.back()->config().n_routed_experts;
                models.back()->set_expert_parallel(std::make_shared<ExpertParallel>(*group[static_cast<size_t>(r)],
                                                                                    ExpertPlacement::contiguous(E, n)));
                ptrs.push_back(models.back().get());
            }
            compare_with_one_gpu(fx, ptrs, std::string(numerics) == "exact", "loopback-1gpu");
        }
}

TEST(CudaExpertParallel, NcclRanksOnSeveralGpusMatchOneModel) {
    REQUIRE_GPU();
    int gpus = 0;
    cudaGetDeviceCount(&gpus);
    if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << gpus << " visible";
    for (const char* numerics : {"exact", "fast"})
        for (const char* fx : {"dsv41-tiny-a", "dsv4-tiny-a"}) {
            NumericsScope scope(numerics);
            ModelOptions o;
            o.device = "cuda";
            ExpertParallelOptions ep;
            ep.ranks = std::min(gpus, 4);
            while (ep.ranks > 1 && load_model_config(fixture_dir(fx)).n_routed_experts % ep.ranks != 0) --ep.ranks;
            auto group = ParallelModels::load(fixture_dir(fx), o, ep);
            compare_with_one_gpu(fx, group.ranks(), std::string(numerics) == "exact", "nccl");
        }
}

}  // namespace
}  // namespace peregrine
