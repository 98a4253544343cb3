// Sampler, penalties, logit bias and logprobs against direct computations.
#include "engine/sampling.h"

#include <gtest/gtest.h>
#include <cmath>
#include <map>

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
