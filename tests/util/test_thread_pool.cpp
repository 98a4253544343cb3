#include "util/thread_pool.h"

#include <atomic>
#include <gtest/gtest.h>
#include <stdexcept>
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

// A chunk that throws, the caller's or a worker's: the exception reaches the caller after every chunk is done, and
// the pool goes on serving (a failed engine step ends its requests with the error instead of stopping the process).
TEST(ThreadPool, AThrowingChunkReachesTheCaller) {
    ThreadPool pool(4);
    for (int64_t bad : {0, 999}) {  // in the caller's chunk, in the last worker's
        std::atomic<int> done{0};
        EXPECT_THROW(pool.parallel_for(1000,
                                       [&](int64_t b, int64_t e) {
                                           if (b <= bad && bad < e) throw std::runtime_error("a chunk failed");
                                           done += static_cast<int>(e - b);
                                       }),
                     std::runtime_error);
        EXPECT_EQ(done.load(), 750);  // the three other chunks ran to the end
        std::vector<std::atomic<int>> hits(100);
        pool.parallel_for(100, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        });
        for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    }
}
