// Sampler, penalties, logit bias and logprobs against direct computations.
#include "engine/sampling_params.h"

#include <gtest/gtest.h>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
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
            while (keep < order.size() && std::exp(static_cast<double>(l[static_cast<size_t>(order[keep])] -
                                                                       l[static_cast<size_t>(order[0])])) >= 0.7)
                ++keep;
        } else {  // top-k 3000 then top-p 0.9 of it
            p.top_k = 3000;
            p.top_p = 0.9f;
            double zk = 0, cum = 0;
            for (int i = 0; i < 3000; ++i)
                zk += std::exp(static_cast<double>(l[static_cast<size_t>(order[static_cast<size_t>(i)])]));
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
            ASSERT_LT(rank[static_cast<size_t>(id)], static_cast<int>(keep))
                << "mode " << mode << " sampled " << id << " outside the kept set";
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

// ---- the counter-based generator and the integer weights shared with the device sampler ---------------

// Random123's known-answer vectors for Philox4x32-10 (its tests/kat_vectors).
TEST(Sampling, PhiloxKnownAnswers) {
    struct Kat {
        uint32_t ctr[4], key[2], out[4];
    };
    const Kat kats[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u},
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    for (const auto& k : kats) {
        uint32_t out[4];
        sampling::philox4x32_10(k.ctr, k.key, out);
        for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], k.out[i]) << i;
    }
    // A sample's bits: counter (index lo, index hi, 0, 0), key (seed lo, seed hi), words 0 and 1.
    const uint64_t seed = 0x299f31d0a4093822ull, index = 0x85a308d3243f6a88ull;
    const uint32_t ctr[4] = {0x243f6a88u, 0x85a308d3u, 0, 0}, key[2] = {0xa4093822u, 0x299f31d0u};
    uint32_t out[4];
    sampling::philox4x32_10(ctr, key, out);
    EXPECT_EQ(sampling::sample_random_bits(seed, index), (uint64_t(out[0]) << 32) | out[1]);
    EXPECT_EQ(sampling::mul_hi64(~0ull, 1000), 999u);
    EXPECT_EQ(sampling::mul_hi64(1ull << 63, 1000), 500u);
}

// floor(exp(x) * 2^44) within one unit of the double exp, monotone, 2^44 at 0 and 0 below the floor.
TEST(Sampling, IntegerWeightsFollowExp) {
    EXPECT_EQ(sampling::weight_of_scaled(0.0), uint64_t(1) << 44);
    EXPECT_EQ(sampling::weight_of_scaled(-31.0), 0u);
    EXPECT_EQ(sampling::weight_of_scaled(std::nan("")), 0u);
    uint64_t prev = 0;
    double worst = 0.0;
    for (int i = 0; i <= 3100000; ++i) {
        const double x = -31.0 + i * 1e-5;
        const uint64_t w = sampling::weight_of_scaled(x);
        const double ref = std::exp(x) * 17592186044416.0;
        worst = std::max(worst, std::abs(static_cast<double>(w) - ref) / std::max(1.0, ref * 1e-15));
        EXPECT_GE(w, prev) << x;
        if (w < prev) break;
        prev = w;
    }
    EXPECT_LE(worst, 2.0);  // |W - exp(x) 2^44| <= max(1, 2e-15 W)
}

namespace {

// The kept set and draw by a plain reading of the definition in ops/sampling.h: full sort, prefix walks.
int32_t reference_sample(const std::vector<float>& l, const SampleConfig& c, uint64_t seed, uint64_t index) {
    const int V = static_cast<int>(l.size());
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return sampling::logit_key(l[static_cast<size_t>(a)], a) > sampling::logit_key(l[static_cast<size_t>(b)], b);
    });
    const int32_t best = order[0];
    const float mx = l[static_cast<size_t>(best)];
    if (!(c.inv_t > 0.0) || !std::isfinite(mx)) return best;
    std::vector<uint64_t> W(static_cast<size_t>(V));
    for (int i = 0; i < V; ++i)
        W[static_cast<size_t>(i)] = sampling::token_weight(l[static_cast<size_t>(i)], mx, c.inv_t);
    const size_t k = c.top_k > 0 && c.top_k < V ? static_cast<size_t>(c.top_k) : order.size();
    std::vector<int32_t> k1(order.begin(), order.begin() + static_cast<long>(k)), k2;
    uint64_t total = 0;
    for (int32_t i : k1) total += W[static_cast<size_t>(i)];
    for (int32_t i : k1)
        if (W[static_cast<size_t>(i)] >= c.min_p_weight || i == best) k2.push_back(i);
    if (c.top_p < 1.0) {
        const double P = c.top_p * static_cast<double>(total);
        uint64_t cum = 0;
        for (size_t n = 0; n < k2.size(); ++n) {
            cum += W[static_cast<size_t>(k2[n])];
            if (static_cast<double>(cum) >= P) {
                k2.resize(n + 1);
                break;
            }
        }
    }
    std::vector<uint64_t> kept(static_cast<size_t>(V), 0);
    uint64_t mass = 0;
    for (int32_t i : k2) kept[static_cast<size_t>(i)] = W[static_cast<size_t>(i)], mass += W[static_cast<size_t>(i)];
    const uint64_t target = sampling::mul_hi64(sampling::sample_random_bits(seed, index), mass);
    uint64_t cum = 0;
    for (int i = 0; i < V; ++i)
        if ((cum += kept[static_cast<size_t>(i)]) > target) return i;
    return -1;
}

}  // namespace

// The sampler (alive-token prefix, nth_element, growing sorted prefixes) draws exactly the reference's token.
TEST(Sampling, SamplerMatchesThePlainDefinition) {
    std::mt19937_64 rng(11);
    std::normal_distribution<float> g(0.0f, 1.0f);
    struct P {
        float t;
        int k;
        float p, minp;
    };
    const P params[] = {{1.0f, 0, 1.0f, 0.0f},     {0.7f, 0, 0.9f, 0.0f},  {1.0f, 40, 1.0f, 0.0f},
                        {1.0f, 1, 1.0f, 0.0f},     {1.0f, 0, 1.0f, 0.05f}, {1.3f, 300, 0.95f, 0.01f},
                        {2.0f, 0, 0.5f, 0.0f},     {0.05f, 0, 1.0f, 0.0f}, {1.0f, 0, 0.0f, 0.0f},
                        {1.0f, 1999, 0.99f, 0.3f}, {0.0f, 0, 1.0f, 0.0f}};
    int distinct_total = 0;
    for (int kind = 0; kind < 3; ++kind) {
        const int V = 2000;
        std::vector<float> l(static_cast<size_t>(V));
        for (int i = 0; i < V; ++i) {
            float x = 3.0f * g(rng);
            if (kind == 1) x = std::round(x) * 0.5f;          // ties
            if (kind == 2) x = -0.001f * std::abs(x);           // near-flat
            l[static_cast<size_t>(i)] = x;
        }
        if (kind == 1) l[5] = -INFINITY, l[6] = -0.0f, l[7] = 0.0f;
        for (const P& p : params) {
            SamplingParams sp;
            sp.temperature = p.t, sp.top_k = p.k, sp.top_p = p.p, sp.min_p = p.minp;
            const SampleConfig c = sample_config(sp);
            SampleScratch s;
            std::vector<char> seen(static_cast<size_t>(V), 0);
            for (uint64_t idx = 0; idx < 200; ++idx) {
                const int32_t want = reference_sample(l, c, 99, idx);
                const int32_t got = sample_token(l.data(), V, c, 99, idx, s);
                ASSERT_EQ(got, want) << "kind " << kind << " t " << p.t << " k " << p.k << " p " << p.p << " min_p "
                                     << p.minp;
                distinct_total += !seen[static_cast<size_t>(got)];
                seen[static_cast<size_t>(got)] = 1;
            }
        }
    }
    EXPECT_GT(distinct_total, 1000);  // the draws do vary
}

// A request's token depends on its own logits, parameters, seed and sample index only: the same rows in
// another batch (other rows, another order) give the same ids.
TEST(Sampling, DrawsIndependentOfTheBatch) {
    const int V = 500, R = 12;
    std::mt19937_64 rng(5);
    std::normal_distribution<float> g(0.0f, 2.0f);
    std::vector<float> l(static_cast<size_t>(R) * V);
    for (auto& x : l) x = g(rng);
    std::vector<SampleRow> rows(R);
    for (int r = 0; r < R; ++r) {
        SamplingParams p;
        p.top_p = 0.9f;
        rows[static_cast<size_t>(r)].row = r;
        rows[static_cast<size_t>(r)].config = sample_config(p);
        rows[static_cast<size_t>(r)].seed = 7 + static_cast<uint64_t>(r % 3);
        rows[static_cast<size_t>(r)].index = static_cast<uint64_t>(r);
    }
    const auto all = sample_rows_host(l.data(), V, rows);
    std::vector<SampleRow> rev(rows.rbegin(), rows.rend());
    rev.resize(5);
    const auto some = sample_rows_host(l.data(), V, rev);
    for (size_t i = 0; i < some.size(); ++i) EXPECT_EQ(some[i].id, all[static_cast<size_t>(R - 1) - i].id);
    // The Sampler is the same draw sequence.
    SamplingParams p;
    p.top_p = 0.9f;
    p.seed = 7;
    Sampler s(p);
    EXPECT_EQ(s.sample(l.data(), V), all[0].id);  // row 0: seed 7, index 0
    EXPECT_EQ(s.next_index(), 1u);
}

// The adjustment list: one entry per id, repeated biases summed in order, masks last.
TEST(Sampling, AdjustmentListMergesPerId) {
    SamplingParams p;
    p.logit_bias = {{4, 1.0f}, {2, 0.5f}, {4, 0.25f}, {99, 3.0f}};
    p.frequency_penalty = 1.0f;
    PenaltyState st;
    st.add_generated(2, 10);
    st.add_generated(2, 10);
    const std::vector<int32_t> masked = {4};
    const auto adj = logit_adjustments(p, st, masked, 10);
    ASSERT_EQ(adj.size(), 2u);  // id 99 is outside the vocabulary
    EXPECT_EQ(adj[0].id, 2);
    EXPECT_EQ(adj[0].count, 2);
    EXPECT_FLOAT_EQ(adj[0].bias, 0.5f);
    EXPECT_EQ(adj[1].id, 4);
    EXPECT_FLOAT_EQ(adj[1].bias, 1.25f);
    std::vector<float> l(10, 1.0f);
    apply_adjustments(l.data(), 10, adj, penalties_of(p));
    EXPECT_FLOAT_EQ(l[2], 1.5f - 2.0f);
    EXPECT_EQ(l[4], -INFINITY);
    EXPECT_FLOAT_EQ(l[0], 1.0f);
    // Logprobs of the adjusted row and a masked id never drawn.
    std::vector<SampleRow> rows(1);
    rows[0].adjust = adj;
    rows[0].penalties = penalties_of(p);
    rows[0].config = sample_config(p);
    rows[0].logprobs = true;
    rows[0].top_logprobs = 3;
    std::vector<float> raw(10, 1.0f);
    for (uint64_t i = 0; i < 50; ++i) {
        rows[0].index = i;
        const auto r = sample_rows_host(raw.data(), 10, rows);
        EXPECT_NE(r[0].id, 4);
        EXPECT_EQ(r[0].top.size(), 3u);
    }
    EXPECT_EQ(raw[4], 1.0f);  // the caller's logits are untouched
}
