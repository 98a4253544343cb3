#include "ops/sampling.h"

#include "util/error.h"
#include "util/thread_pool.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace peregrine {

using sampling::logit_key;
using sampling::kWeightFloor;

int32_t argmax(const float* logits, int vocab) {
    int32_t best = 0;
    for (int i = 1; i < vocab; ++i)
        if (logits[i] > logits[best]) best = i;
    return best;
}

void apply_adjustments(float* logits, int vocab, std::span<const LogitAdjust> adj, const sampling::Penalties& pen) {
    for (const auto& a : adj)
        if (a.id >= 0 && a.id < vocab) logits[a.id] = sampling::adjust_logit(logits[a.id], a, pen);
}

TokenLogprob chosen_logprob(const float* logits, int vocab, int32_t chosen, std::vector<TokenLogprob>* top, int top_n) {
    double mx = -INFINITY;
    for (int i = 0; i < vocab; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
    const double lse = mx + std::log(sum);
    auto lp = [&](int32_t id) { return static_cast<float>(static_cast<double>(logits[id]) - lse); };
    if (top && top_n > 0) {
        std::vector<int32_t> idx(static_cast<size_t>(vocab));
        std::iota(idx.begin(), idx.end(), 0);
        const size_t n = std::min(idx.size(), static_cast<size_t>(top_n));
        std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(n), idx.end(), [&](int32_t a, int32_t b) {
            return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
        });
        top->clear();
        for (size_t i = 0; i < n; ++i) top->push_back({idx[i], lp(idx[i])});
    }
    return {chosen, lp(chosen)};
}

// Reads as the definition at the top of sampling.h; the device sampler (cuda/sampling.cu) finds the same
// cut-off keys by radix selection instead of sorting.
int32_t sample_token(const float* logits, int vocab, const SampleConfig& c, uint64_t seed, uint64_t index,
                     SampleScratch& s) {
    PEREGRINE_CHECK(vocab > 0, "sampling from an empty vocabulary");
    int32_t best = 0;
    uint64_t best_key = logit_key(logits[0], 0);
    for (int i = 1; i < vocab; ++i) {
        const uint64_t k = logit_key(logits[i], i);
        if (k > best_key) best_key = k, best = i;
    }
    const float mx = logits[best];
    if (!(c.inv_t > 0.0) || !std::isfinite(mx)) return best;

    // Alive tokens (scaled logit above the weight floor) are a prefix of the ranking; all others weigh 0
    // and play no part. keys: the alive tokens' keys.
    const size_t V = static_cast<size_t>(vocab);
    s.weight.assign(V, 0);
    s.keys.clear();
    for (int i = 0; i < vocab; ++i) {
        const double x = sampling::scaled_logit(logits[i], mx, c.inv_t);
        if (!(x > kWeightFloor)) continue;
        s.weight[static_cast<size_t>(i)] = sampling::weight_of_scaled(x);
        s.keys.push_back(logit_key(logits[i], i));
    }
    auto by_key_desc = [](uint64_t a, uint64_t b) { return a > b; };
    // 1. top-k: the cut-off key c1 of the k best (all when at most k are alive).
    uint64_t c1 = 0;
    if (c.top_k > 0 && c.top_k < vocab && s.keys.size() > static_cast<size_t>(c.top_k)) {
        const auto kth = s.keys.begin() + (c.top_k - 1);
        std::nth_element(s.keys.begin(), kth, s.keys.end(), by_key_desc);
        c1 = *kth;
        s.keys.resize(static_cast<size_t>(c.top_k));
    }
    auto W = [&](uint64_t key) { return s.weight[static_cast<size_t>(sampling::key_id(key))]; };
    uint64_t total = 0;
    for (uint64_t k : s.keys) total += W(k);
    // 2. min-p: keys of the kept tokens that weigh anything.
    std::erase_if(s.keys, [&](uint64_t k) { return W(k) == 0 || (W(k) < c.min_p_weight && k != best_key); });
    // 3. top-p: the key c3 at which the cumulative weight in rank order first reaches top_p x total.
    uint64_t c3 = 0;
    if (c.top_p < 1.0) {
        const double P = c.top_p * static_cast<double>(total);
        if (!(P > 0.0)) {
            c3 = best_key;
        } else {  // sort growing prefixes: the cut usually lies in the first few
            size_t sorted = 0, want = std::min<size_t>(s.keys.size(), 1024);
            uint64_t cum = 0;
            for (;;) {
                std::partial_sort(s.keys.begin() + static_cast<long>(sorted), s.keys.begin() + static_cast<long>(want),
                                  s.keys.end(), by_key_desc);
                for (; sorted < want; ++sorted) {
                    cum += W(s.keys[sorted]);
                    if (static_cast<double>(cum) >= P) break;
                }
                if (sorted < want) {
                    c3 = s.keys[sorted];
                    break;
                }
                if (want == s.keys.size()) break;  // never reached: all of them
                want = std::min(s.keys.size(), want * 8);
            }
        }
    }
    // The draw: inverse CDF in id order over the kept tokens.
    uint64_t mass = 0;
    for (uint64_t k : s.keys)
        if (k >= c3) mass += W(k);
    const uint64_t target = sampling::mul_hi64(sampling::sample_random_bits(seed, index), mass);
    auto kept = [&](int i) {
        const uint64_t w = s.weight[static_cast<size_t>(i)];
        if (w == 0) return uint64_t(0);
        const uint64_t k = logit_key(logits[i], i);
        if (k < c1 || k < c3 || (w < c.min_p_weight && k != best_key)) return uint64_t(0);
        return w;
    };
    uint64_t cum = 0;
    for (int i = 0; i < vocab; ++i) {
        cum += kept(i);
        if (cum > target) return i;
    }
    return best;  // unreachable: target < mass
}

std::vector<SampleResult> sample_rows_host(const float* logits, int vocab, const std::vector<SampleRow>& rows) {
    std::vector<SampleResult> out(rows.size());
    parallel_for(static_cast<int64_t>(rows.size()), [&](int64_t r0, int64_t r1) {
        SampleScratch s;
        for (int64_t r = r0; r < r1; ++r) {
            const SampleRow& row = rows[static_cast<size_t>(r)];
            const float* src = logits + static_cast<int64_t>(row.row) * vocab;
            s.row.assign(src, src + vocab);
            apply_adjustments(s.row.data(), vocab, row.adjust, row.penalties);
            SampleResult& res = out[static_cast<size_t>(r)];
            res.id = sample_token(s.row.data(), vocab, row.config, row.seed, row.index, s);
            if (row.logprobs)
                res.logprob = chosen_logprob(s.row.data(), vocab, res.id, &res.top,
                                             std::min(row.top_logprobs, kMaxTopLogprobs)).logprob;
        }
    });
    return out;
}

}  // namespace peregrine
