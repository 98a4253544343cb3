// Sampler, penalties, logit bias and logprobs against direct computations.
#include "engine/sampling.h"

#include <gtest/gtest.h>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>
#include <algorithm>

using namespace peregrine;

TEST(Sampling, PenaltiesAndBias) {
    std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f};
    SamplingParams p;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.repetition_penalty = 2.0f;
    p.logit_bias = {{2, 10.0f}};
    PenaltyState st;
    st.add_prompt(std::vector<int32_t>{1}, 4);
    st.add_generated(3, 4);
    st.add_generated(3, 4);
    apply_logit_adjustments(l.data(), 4, p, st);
    EXPECT_FLOAT_EQ(l[0], 2.0f);                        // untouched
    EXPECT_FLOAT_EQ(l[1], -2.0f);                       // prompt token, negative: multiplied
    EXPECT_FLOAT_EQ(l[2], 10.5f);                       // bias only
    EXPECT_FLOAT_EQ(l[3], 3.0f / 2.0f - 0.5f - 0.5f);   // repetition, presence, frequency x2
}

TEST(Sampling, LogprobsAreLogSoftmax) {
    std::vector<float> l = {1.0f, 2.0f, 3.0f, 3.0f};
    double z = 0;
    for (float v : l) z += std::exp(v);
    std::vector<TokenLogprob> top;
    auto c = chosen_logprob(l.data(), 4, 1, &top, 3);
    EXPECT_NEAR(c.logprob, 2.0 - std::log(z), 1e-6);
    ASSERT_EQ(top.size(), 3u);
    EXPECT_EQ(top[0].id, 2);  // ties by id
    EXPECT_EQ(top[1].id, 3);
    EXPECT_EQ(top[2].id, 1);
    EXPECT_NEAR(top[0].logprob, 3.0 - std::log(z), 1e-6);
}

TEST(Sampling, SeededDistributionFollowsSoftmaxWithinTolerance) {
    std::vector<float> l = {0.0f, 1.0f, 2.0f, -5.0f};
    SamplingParams p;
    p.seed = 3;
    p.temperature = 1.0f;
    Sampler s(p);
    std::map<int, int> hits;
    const int N = 20000;
    for (int i = 0; i < N; ++i) ++hits[s.sample(l.data(), 4)];
    double z = 0;
    for (float v : l) z += std::exp(v);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(hits[i] / double(N), std::exp(l[static_cast<size_t>(i)]) / z, 0.015) << i;
    // top_k 1 and a tiny top_p are greedy; min_p near 1 keeps only the best.
    for (auto mod : {0, 1, 2}) {
        SamplingParams q;
        q.seed = 1;
        if (mod == 0) q.top_k = 1;
        if (mod == 1) q.top_p = 0.01f;
        if (mod == 2) q.min_p = 0.99f;
        Sampler g(q);
        for (int i = 0; i < 50; ++i) EXPECT_EQ(g.sample(l.data(), 4), 2);
    }
    // Same seed, same stream.
    Sampler a(p), b(p);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(l.data(), 4), b.sample(l.data(), 4));
}

// Truncation over a large vocabulary whose cut lies beyond the first sorted prefix: the samples stay in
// the set a full sort gives, and cover it.
TEST(Sampling, TruncationBeyondTheFirstSortedPrefix) {
    const int V = 6000;
    std::vector<float> l(V);
    for (int i = 0; i < V; ++i) l[static_cast<size_t>(i)] = -0.0001f * static_cast<float>((i * 7919) % V);  // near-flat
    std::vector<int> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
    double z = 0;
    for (float v : l) z += std::exp(static_cast<double>(v));
    for (int mode : {0, 1, 2}) {
        SamplingParams p;
        p.seed = 7;
        size_t keep = 0;  // expected candidates, by a full sort
        if (mode == 0) {  // top-p 0.5: about half the vocabulary
            p.top_p = 0.5f;
            double cum = 0;
            while (cum < 0.5) cum += std::exp(static_cast<double>(l[static_cast<size_t>(order[keep++])])) / z;
        } else if (mode == 1) {  // min-p 0.7 relative to the best: logits >= max + ln(0.7)
            p.min_p = 0.7f;
            while (keep < order.size() && std::exp(static_cast<double>(l[static_cast<size_t>(order[keep])] - l[static_cast<size_t>(order[0])])) >= 0.7) ++keep;
        } else {  // top-k 3000 then top-p 0.9 of it
            p.top_k = 3000;
            p.top_p = 0.9f;
            double zk = 0, cum = 0;
            for (int i = 0; i < 3000; ++i) zk += std::exp(static_cast<double>(l[static_cast<size_t>(order[static_cast<size_t>(i)])]));
            while (cum < 0.9) cum += std::exp(static_cast<double>(l[static_cast<size_t>(order[keep++])])) / zk;
        }
        ASSERT_GT(keep, 1024u) << mode;
        std::vector<int> rank(V, V);
        for (size_t i = 0; i < keep; ++i) rank[static_cast<size_t>(order[i])] = static_cast<int>(i);
        Sampler s(p);
        std::vector<char> hit(V, 0);
        size_t distinct = 0, deep = 0;
        for (int i = 0; i < 3000; ++i) {
            const int32_t id = s.sample(l.data(), V);
            ASSERT_LT(rank[static_cast<size_t>(id)], static_cast<int>(keep)) << "mode " << mode << " sampled " << id << " outside the kept set";
            distinct += !hit[static_cast<size_t>(id)];
            deep += rank[static_cast<size_t>(id)] >= 1024;
            hit[static_cast<size_t>(id)] = 1;
        }
        // Near-flat: 3000 draws cover about keep * (1 - e^(-3000/keep)) ids, and many lie past the first 1024.
        ASSERT_LT(keep, static_cast<size_t>(V)) << mode;
        EXPECT_GT(static_cast<double>(distinct), 0.9 * keep * (1.0 - std::exp(-3000.0 / keep))) << mode;
        EXPECT_GT(deep, 3000u * (keep - 1024) / keep / 2) << mode;
    }
}
