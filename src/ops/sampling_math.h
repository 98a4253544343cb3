#pragma once
// The arithmetic that sampling shares between the host sampler (ops/sampling.cpp) and the device one
// (ops/cuda/sampling.cu), written once so that both pick the same token from the same logits, parameters
// and seed. Every decision rests on integers or on correctly rounded IEEE double operations (+, -, *, /,
// floor; no library exp/log, no fused multiply-add: sampling.cpp builds with -ffp-contract=off, the .cu
// files with --fmad=false), so host and device agree bit for bit:
//  - tokens are ranked by logit_key (logit descending, then id ascending; -0 == +0, NaN below -inf);
//  - a token weighs W = floor(exp((l - max) / T) * 2^44), an integer (the best token weighs exactly 2^44;
//    tokens more than 31 temperature-scaled nats below the best weigh 0 and are never drawn);
//  - sums of weights are exact uint64 sums, so their order does not matter;
//  - one 64-bit Philox4x32-10 draw per sample, keyed by the request's seed, counter = its sample index,
//    maps to a target in [0, mass) by a 64x64 -> 128-bit product (no rounding), and the token is the
//    first in id order whose cumulative weight exceeds it.
#include "util/host_device.h"

#include <cmath>
#include <cstdint>

namespace peregrine::sampling {

// ---- Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) -----------

PEREGRINE_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
    const uint64_t p = static_cast<uint64_t>(a) * b;
    hi = static_cast<uint32_t>(p >> 32);
    lo = static_cast<uint32_t>(p);
}

// out = Philox4x32-10(counter ctr, key key).
PEREGRINE_HD void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint32_t hi0, lo0, hi1, lo1;
        philox_mulhilo(0xD2511F53u, c0, hi0, lo0);
        philox_mulhilo(0xCD9E8D57u, c2, hi1, lo1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

// The 64 random bits of a request's sample `index` under `seed`: counter (index lo, index hi, 0, 0),
// key (seed lo, seed hi), the first two output words.
PEREGRINE_HD uint64_t sample_random_bits(uint64_t seed, uint64_t index) {
    const uint32_t ctr[4] = {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u};
    const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
    uint32_t out[4];
    philox4x32_10(ctr, key, out);
    return (static_cast<uint64_t>(out[0]) << 32) | out[1];
}

// floor(a * b / 2^64): a uniform 64-bit a maps to [0, b).
PEREGRINE_HD uint64_t mul_hi64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
    return __umul64hi(a, b);
#else
    return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

// ---- ranking --------------------------------------------------------------------------------------

// Monotone image of a logit: a > b (as floats) iff ordered(a) > ordered(b); -0 and +0 map alike, NaN to 0
// (below -inf).
PEREGRINE_HD uint32_t ordered_logit(float f) {
    if (f != f) return 0u;
    if (f == 0.0f) return 0x80000000u;
    const uint32_t u = float_bits(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// A token's rank key: larger is better (higher logit, then lower id); unique per token.
PEREGRINE_HD uint64_t logit_key(float l, int32_t id) {
    return (static_cast<uint64_t>(ordered_logit(l)) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
PEREGRINE_HD int32_t key_id(uint64_t key) { return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key)); }

// ---- weights --------------------------------------------------------------------------------------

constexpr int kWeightBits = 44;
constexpr double kWeightOne = 17592186044416.0;  // 2^44: the best token's weight
constexpr double kWeightFloor = -31.0;           // exp(-31) * 2^44 < 1: lighter tokens weigh 0

// x = (l - max) / T, computed as (double(l) - double(max)) * inv_t; the token can weigh anything only when
// x > kWeightFloor (this is monotone in l, so the tokens that can weigh anything are a prefix of the ranking).
PEREGRINE_HD double scaled_logit(float l, float max_logit, double inv_t) {
    return (static_cast<double>(l) - static_cast<double>(max_logit)) * inv_t;
}

// floor(exp(x) * 2^44) for x <= 0, by basic operations only: x = k ln2 + r, |r| <= ln2 / 2, exp(r) by
// its Taylor series to r^13 (relative error < 1e-16 there), times 2^k.
PEREGRINE_HD uint64_t weight_of_scaled(double x) {
    if (!(x > kWeightFloor)) return 0;  // NaN too
    if (x > 0.0) x = 0.0;
    const double kd = floor(x * 1.4426950408889634 + 0.5);
    const double r = (x - kd * 6.93147180369123816490e-01) - kd * 1.90821492927058770002e-10;
    double p = 1.0 / 6227020800.0;  // 1/13!
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    // 2^(k + 44) with k in [-45, 0]: an exact power of two.
    const int e = static_cast<int>(kd) + kWeightBits;
    const double scale = e >= 0 ? static_cast<double>(uint64_t(1) << e) : 0.5;
    const double w = p * scale;
    if (!(w >= 1.0)) return 0;
    const uint64_t wi = static_cast<uint64_t>(w);
    return wi > (uint64_t(1) << kWeightBits) ? (uint64_t(1) << kWeightBits) : wi;
}

PEREGRINE_HD uint64_t token_weight(float l, float max_logit, double inv_t) {
    return weight_of_scaled(scaled_logit(l, max_logit, inv_t));
}

// ---- logit adjustments ----------------------------------------------------------------------------

// What one token's logit gets before sampling: its logit_bias, the repetition penalty when it was seen (prompt
// or generated), presence/frequency penalties by its generated count, then -inf when masked (min_new_tokens).
struct LogitAdjust {
    int32_t id = 0;
    int32_t count = 0;      // times generated
    float bias = 0.0f;      // summed logit_bias
    uint32_t flags = 0;     // kSeen | kMasked | kBiased
    static constexpr uint32_t kSeen = 1, kMasked = 2, kBiased = 4;
};

struct Penalties {
    float repetition = 1.0f, presence = 0.0f, frequency = 0.0f;
};

PEREGRINE_HD float adjust_logit(float l, const LogitAdjust& a, const Penalties& p) {
    if (a.flags & LogitAdjust::kBiased) l = l + a.bias;
    if ((a.flags & LogitAdjust::kSeen) && p.repetition != 1.0f) l = l > 0.0f ? l / p.repetition : l * p.repetition;
    if (a.count > 0 && (p.presence != 0.0f || p.frequency != 0.0f))
        l = l - (p.presence + p.frequency * static_cast<float>(a.count));
    if (a.flags & LogitAdjust::kMasked) l = float_from_bits(0xFF800000u);  // -inf
    return l;
}

}  // namespace peregrine::sampling
