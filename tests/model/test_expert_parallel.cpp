// Expert parallelism over an in-process group: ranks in threads, each with its own copy of the model that
// holds only its experts, and its own sequences (attention data-parallel). Every rank's logits must equal,
// bit for bit, those of one model running every sequence: the dispatch, the experts on other ranks and the
// combine in the reference's order change nothing.
#include "kv/page_pool.h"
#include "model/expert_parallel.h"
#include "model/fixture.h"
#include "model/parallel_run.h"
#include "model/model.h"
#include "util/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <thread>

namespace peregrine {
namespace {

using test::fixture_dir;
using test::read_ids;

TEST(ExpertPlacement, ContiguousHoldsEachExpertOnce) {
    auto p = ExpertPlacement::contiguous(8, 4);
    for (int e = 0; e < 8; ++e) {
        ASSERT_EQ(p.replicas[static_cast<size_t>(e)].size(), 1u);
        EXPECT_EQ(p.serving_rank(e, 12345), e / 2);
        EXPECT_TRUE(p.holds(e / 2, e));
        EXPECT_FALSE(p.holds((e / 2 + 1) % 4, e));
    }
    EXPECT_THROW(ExpertPlacement::contiguous(6, 4), Error);
}

TEST(ExpertPlacement, BalancedSpreadsTheHotExperts) {
    // Skewed loads: a few hot experts. Contiguous placement overloads their rank; the balanced one copies
    // them and evens the ranks out.
    const int E = 32, n = 4, redundant = 2;
    std::vector<double> load(E);
    for (int e = 0; e < E; ++e) load[static_cast<size_t>(e)] = e < 3 ? 100.0 : 1.0 + e % 5;
    auto p = ExpertPlacement::balanced(load, n, redundant);
    std::vector<int> slots(n, 0);
    for (int e = 0; e < E; ++e) {
        const auto& reps = p.replicas[static_cast<size_t>(e)];
        ASSERT_GE(reps.size(), 1u);
        ASSERT_TRUE(std::is_sorted(reps.begin(), reps.end()));
        ASSERT_EQ(std::adjacent_find(reps.begin(), reps.end()), reps.end())
            << "two copies of expert " << e << " on a rank";
        for (int r : reps) ++slots[static_cast<size_t>(r)];
        // Pairs of an expert go to its copies in turn.
        for (uint64_t k = 0; k < reps.size(); ++k) EXPECT_EQ(p.serving_rank(e, k), reps[k]);
    }
    for (int r = 0; r < n; ++r) EXPECT_EQ(slots[static_cast<size_t>(r)], E / n + redundant);
    EXPECT_GE(p.replicas[0].size(), 2u);  // the hottest expert is copied
    auto spread = [](const std::vector<double>& v) {
        return *std::max_element(v.begin(), v.end()) / *std::min_element(v.begin(), v.end());
    };
    const double balanced = spread(p.rank_loads(load)),
                 contiguous = spread(ExpertPlacement::contiguous(E, n).rank_loads(load));
    EXPECT_LT(balanced, 1.25);
    EXPECT_GT(contiguous, 4.0);
}

TEST(Loopback, ExchangeRowsDeliversInRankOrder) {
    const int n = 3, width = 5;
    auto group = make_loopback_group(n);
    std::vector<Tensor> got(n);
    std::vector<std::vector<int64_t>> got_counts(n);
    auto cpu = make_cpu_backend(ModelConfig{}, ModelFormat{}, StateLayout{});
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
            // Rank r sends (r + d) rows to rank d, row values encode (source, destination, index).
            std::vector<int64_t> counts(n);
            int64_t total = 0;
            for (int d = 0; d < n; ++d) total += counts[static_cast<size_t>(d)] = r + d;
            Tensor send = Tensor::zeros(DType::F32, {total, width});
            int64_t row = 0;
            for (int d = 0; d < n; ++d)
                for (int i = 0; i < r + d; ++i, ++row)
                    for (int c = 0; c < width; ++c)
                        send.f32()[row * width + c] = static_cast<float>(r * 10000 + d * 100 + i + c * 0.5);
            got[static_cast<size_t>(r)] =
                group[static_cast<size_t>(r)]->exchange_rows(*cpu, send, counts, got_counts[static_cast<size_t>(r)]);
        });
    for (auto& t : threads) t.join();
    for (int d = 0; d < n; ++d) {
        int64_t row = 0;
        for (int src = 0; src < n; ++src) {
            ASSERT_EQ(got_counts[static_cast<size_t>(d)][static_cast<size_t>(src)], src + d);
            for (int i = 0; i < src + d; ++i, ++row)
                for (int c = 0; c < width; ++c)
                    ASSERT_EQ(got[static_cast<size_t>(d)].f32()[row * width + c],
                              static_cast<float>(src * 10000 + d * 100 + i + c * 0.5));
        }
        EXPECT_EQ(got[static_cast<size_t>(d)].dim(0), row);
    }
}

TEST(Loopback, AFailedRankReleasesTheOthers) {
    auto group = make_loopback_group(2);
    std::thread waiter([&] { EXPECT_THROW(group[0]->exchange_bytes({{1}, {2}}), Error); });
    group[1]->abort();
    waiter.join();
    EXPECT_THROW(group[1]->exchange_bytes({{1}, {2}}), Error);
}

void expect_expert_parallel_matches(const std::string& fx, int n_ranks, bool redundant) {
    const int steps = 5;
    auto all = test::parallel_prompts(fx);
    std::vector<int> every(all.size());
    std::iota(every.begin(), every.end(), 0);
    auto single = Model::load(fixture_dir(fx));
    const auto ref = test::run_sequences(*single, all, every, steps);

    const int E = single->config().n_routed_experts;
    ExpertPlacement placement = ExpertPlacement::contiguous(E, n_ranks);
    if (redundant) {  // made-up loads: expert e weighs e+1, one extra copy per rank
        std::vector<double> load(static_cast<size_t>(E));
        for (int e = 0; e < E; ++e) load[static_cast<size_t>(e)] = e + 1.0;
        placement = ExpertPlacement::balanced(load, n_ranks, 1);
    }
    auto group = make_loopback_group(n_ranks);
    std::vector<std::vector<int>> mine(static_cast<size_t>(n_ranks));
    for (int s = 0; s < static_cast<int>(all.size()); ++s) mine[static_cast<size_t>(s % n_ranks)].push_back(s);
    std::vector<std::vector<test::SeqLogits>> got(static_cast<size_t>(n_ranks));
    std::vector<std::string> errors(static_cast<size_t>(n_ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < n_ranks; ++r)
        threads.emplace_back([&, r] {
            Communicator& comm = *group[static_cast<size_t>(r)];
            try {
                auto model = Model::load(fixture_dir(fx));
                model->set_expert_parallel(std::make_shared<ExpertParallel>(comm, placement));
                got[static_cast<size_t>(r)] = test::run_sequences(*model, all, mine[static_cast<size_t>(r)], steps);
            } catch (const std::exception& e) {
                errors[static_cast<size_t>(r)] = e.what();
                comm.abort();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n_ranks; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    for (int r = 0; r < n_ranks; ++r)
        for (size_t i = 0; i < mine[static_cast<size_t>(r)].size(); ++i) {
            const int s = mine[static_cast<size_t>(r)][i];
            for (int step = 0; step < steps; ++step)
                ASSERT_EQ(got[static_cast<size_t>(r)][i].logits[static_cast<size_t>(step)],
                          ref[static_cast<size_t>(s)].logits[static_cast<size_t>(step)])
                    << fx << ": rank " << r << " sequence " << s << " step " << step;
        }
}

// Four ranks for three sequences: one rank runs idle steps and still serves its experts.
TEST(ExpertParallel, V41FourRanksMatchOneModel) { expect_expert_parallel_matches("dsv41-tiny-a", 4, false); }
TEST(ExpertParallel, V41TwoRanksWithRedundantExperts) { expect_expert_parallel_matches("dsv41-tiny-a", 2, true); }
// V4: a hash-routed first layer.
TEST(ExpertParallel, V4TwoRanksMatchOneModel) { expect_expert_parallel_matches("dsv4-tiny-a", 2, false); }

TEST(ExpertParallel, ARankDropsTheExpertsItDoesNotHold) {
    auto model = Model::load(fixture_dir("dsv41-tiny-a"));
    auto group = make_loopback_group(4);
    model->set_expert_parallel(std::make_shared<ExpertParallel>(*group[1], ExpertPlacement::contiguous(8, 4)));
    const auto& experts = model->weights().layers[0].ffn.experts;
    for (int e = 0; e < 8; ++e) EXPECT_EQ(experts[static_cast<size_t>(e)].w1.empty(), e / 2 != 1) << e;
}

}  // namespace
}  // namespace peregrine
