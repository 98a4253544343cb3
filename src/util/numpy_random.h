#pragma once
// NumPy's default_rng(seed).integers(low, high, dtype=int64): SeedSequence -> PCG64 -> Lemire bounded
// integers, reproduced exactly so that values the reference derives from it (Engram hash multipliers)
// need no Python at run time.
#include <cstdint>
#include <vector>

namespace peregrine {

class NumpyPcg64 {
public:
    explicit NumpyPcg64(uint64_t seed);
    uint64_t next_u64();
    // `n` draws from [low, high), as Generator.integers(low, high, size=n, dtype=np.int64).
    std::vector<int64_t> integers(int64_t low, int64_t high, int n);

private:
    unsigned __int128 state_ = 0, inc_ = 0;
};

}  // namespace peregrine
