#include "util/numpy_random.h"

#include <gtest/gtest.h>

using namespace peregrine;

namespace {
struct Case {
    uint64_t seed;
    int64_t low, high;
    std::vector<int64_t> expect;
};
const Case kCases[] = {
#include "numpy_random_cases.inc"
};
}  // namespace

TEST(NumpyRandom, IntegersMatchNumpy) {
    for (const auto& c : kCases) {
        NumpyPcg64 rng(c.seed);
        EXPECT_EQ(rng.integers(c.low, c.high, 6), c.expect)
            << "seed " << c.seed << " range [" << c.low << ", " << c.high << ")";
    }
}
