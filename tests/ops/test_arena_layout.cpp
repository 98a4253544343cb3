// The capture arena's layout (src/ops/cuda/arena_layout.h) on the host: a freed block is handed out again only on
// its own stream and only to an allocation of at least half its size, and top() is the size that holds every block.
// Reuse across streams would let a graph branch overwrite memory another branch still reads.
#include "ops/cuda/arena_layout.h"

#include <gtest/gtest.h>

using peregrine::cuda::ArenaLayout;

namespace {
const int kMain = 0, kSide = 0;
const void* main_stream = &kMain;
const void* side_stream = &kSide;
}  // namespace

TEST(ArenaLayout, ReusesAFreedBlockOnItsOwnStreamOnly) {
    ArenaLayout a;
    const size_t x = a.take(1000, main_stream);
    EXPECT_EQ(x, 0u);
    EXPECT_EQ(a.size_of(x), 1024u);  // 256-byte blocks
    a.give(x, main_stream);
    const size_t side = a.take(1000, side_stream);  // freed on the main stream: not for the side stream
    EXPECT_EQ(side, 1024u);
    EXPECT_EQ(a.take(900, main_stream), x);  // the main stream's own block again
    EXPECT_EQ(a.top(), 2048u);
}

TEST(ArenaLayout, ReusesOnlyBlocksOfAboutTheSize) {
    ArenaLayout a;
    const size_t big = a.take(8192, main_stream);
    a.give(big, main_stream);
    const size_t small = a.take(1024, main_stream);  // 8 times smaller: a new block, the big one kept
    EXPECT_NE(small, big);
    EXPECT_EQ(a.take(5000, main_stream), big);  // within twice the request
    EXPECT_EQ(a.top(), 8192u + 1024u);
}

TEST(ArenaLayout, TopIsTheLargestSetOfLiveBlocks) {
    // A layer's allocations, freed before the next layer's: every layer after the first reuses its blocks.
    ArenaLayout a;
    for (int layer = 0; layer < 40; ++layer) {
        const size_t q = a.take(64 << 10, main_stream), kv = a.take(4 << 10, main_stream),
                     y = a.take(80 << 10, side_stream);
        a.give(q, main_stream);
        a.give(kv, main_stream);
        a.give(y, side_stream);
    }
    EXPECT_EQ(a.top(), size_t((64 + 4 + 80) << 10));
}
