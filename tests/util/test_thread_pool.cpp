#include "util/thread_pool.h"

#include <atomic>
#include <gtest/gtest.h>
#include <vector>

using namespace peregrine;

TEST(ThreadPool, CoversEveryIndexOnce) {
    ThreadPool pool(4);
    for (int64_t n : {0, 1, 3, 17, 1000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        });
        for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    }
}
