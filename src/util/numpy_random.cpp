#include "util/numpy_random.h"
#include "util/error.h"

namespace peregrine {

namespace {

constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixL = 0xca01f9dd, kMixR = 0x4973f715;
constexpr int kPool = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
    value ^= hash_const;
    hash_const *= kMultA;
    value *= hash_const;
    return value ^ (value >> 16);
}

uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t r = kMixL * x - kMixR * y;
    return r ^ (r >> 16);
}

// SeedSequence(seed).generate_state(4, uint64).
void seed_sequence_state(uint64_t seed, uint64_t out[4]) {
    std::vector<uint32_t> entropy;
    do {  // the integer as little-endian 32-bit words
        entropy.push_back(static_cast<uint32_t>(seed));
        seed >>= 32;
    } while (seed);
    uint32_t pool[kPool];
    uint32_t h = kInitA;
    for (int i = 0; i < kPool; ++i) pool[i] = hashmix(i < static_cast<int>(entropy.size()) ? entropy[i] : 0, h);
    for (int s = 0; s < kPool; ++s)
        for (int d = 0; d < kPool; ++d)
            if (s != d) pool[d] = mix(pool[d], hashmix(pool[s], h));
    for (size_t s = kPool; s < entropy.size(); ++s)
        for (int d = 0; d < kPool; ++d) pool[d] = mix(pool[d], hashmix(entropy[s], h));
    uint32_t words[8];
    uint32_t hb = kInitB;
    for (int i = 0; i < 8; ++i) {
        uint32_t v = pool[i % kPool];
        v ^= hb;
        hb *= kMultB;
        v *= hb;
        words[i] = v ^ (v >> 16);
    }
    for (int i = 0; i < 4; ++i)
        out[i] = static_cast<uint64_t>(words[2 * i]) | (static_cast<uint64_t>(words[2 * i + 1]) << 32);
}

const unsigned __int128 kMult = (static_cast<unsigned __int128>(2549297995355413924ULL) << 64) + 4865540595714422341ULL;

}  // namespace

NumpyPcg64::NumpyPcg64(uint64_t seed) {
    uint64_t v[4];
    seed_sequence_state(seed, v);
    unsigned __int128 initstate = (static_cast<unsigned __int128>(v[0]) << 64) | v[1];
    unsigned __int128 initseq = (static_cast<unsigned __int128>(v[2]) << 64) | v[3];
    state_ = 0;
    inc_ = (initseq << 1) | 1;
    state_ = state_ * kMult + inc_;
    state_ += initstate;
    state_ = state_ * kMult + inc_;
}

uint64_t NumpyPcg64::next_u64() {
    state_ = state_ * kMult + inc_;
    uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
    unsigned rot = static_cast<unsigned>(state_ >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
}

std::vector<int64_t> NumpyPcg64::integers(int64_t low, int64_t high, int n) {
    PEREGRINE_CHECK(high > low, "integers: empty range");
    const uint64_t rng = static_cast<uint64_t>(high) - static_cast<uint64_t>(low) - 1;
    std::vector<int64_t> out;
    if (rng <= 0xFFFFFFFFULL) {  // NumPy's 32-bit buffered Lemire path
        uint64_t buf = 0;
        int bcnt = 0;
        auto next32 = [&] {
            if (!bcnt) {
                buf = next_u64();
                bcnt = 1;
            } else {
                buf >>= 32;
                --bcnt;
            }
            return static_cast<uint32_t>(buf);
        };
        const uint32_t r32 = static_cast<uint32_t>(rng);
        for (int i = 0; i < n; ++i) {
            if (r32 == 0xFFFFFFFFU) {
                out.push_back(low + next32());
                continue;
            }
            const uint32_t excl = r32 + 1;
            uint64_t m = static_cast<uint64_t>(next32()) * excl;
            uint32_t left = static_cast<uint32_t>(m);
            if (left < excl) {
                const uint32_t threshold = (0xFFFFFFFFU - r32) % excl;
                while (left < threshold) {
                    m = static_cast<uint64_t>(next32()) * excl;
                    left = static_cast<uint32_t>(m);
                }
            }
            out.push_back(low + static_cast<int64_t>(m >> 32));
        }
        return out;
    }
    for (int i = 0; i < n; ++i) {
        const uint64_t excl = rng + 1;
        unsigned __int128 m = static_cast<unsigned __int128>(next_u64()) * excl;
        uint64_t left = static_cast<uint64_t>(m);
        if (left < excl) {
            const uint64_t threshold = (UINT64_MAX - rng) % excl;
            while (left < threshold) {
                m = static_cast<unsigned __int128>(next_u64()) * excl;
                left = static_cast<uint64_t>(m);
            }
        }
        out.push_back(low + static_cast<int64_t>(m >> 64));
    }
    return out;
}

}  // namespace peregrine
