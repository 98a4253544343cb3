// The engine's page accounting: admission against the prefix cache, growth with eviction, release of known pages
// only, sharing while running, and the pool without a cache.
#include "kv/cache_manager.h"
#include "kv_test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

using namespace peregrine;
using test::small_layout;

namespace {
constexpr int P = 8;

std::vector<int32_t> tokens(int n, int first = 1) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    std::iota(v.begin(), v.end(), first);
    return v;
}

// Runs a sequence "through the model": its pages cover the tokens, each page's snapshot gets a mark.
void compute(CacheManager& m, CachedSequence& s, const std::vector<int32_t>& t) {
    ASSERT_TRUE(m.reserve(s, static_cast<int64_t>(t.size()) + 1));
    s.state.tokens = t;
    s.state.n_cached = static_cast<int64_t>(t.size());
    const StateLayout& L = m.layout();
    for (size_t p = 0; p < t.size() / P; ++p)
        std::memset(L.snapshot(s.state, static_cast<int64_t>(p)), static_cast<int>(p + 1), L.carry_bytes);
}
}  // namespace

TEST(CacheManager, ReleasedPagesServeTheNextAdmission) {
    HostStateMemory mem;
    CacheManager m(mem, small_layout(P), 16, true);
    const auto t = tokens(3 * P + 3);
    CachedSequence a;
    EXPECT_EQ(m.admit(a, t), 0);
    compute(m, a, t);
    m.release(a, static_cast<int64_t>(t.size()));
    EXPECT_TRUE(a.state.pages.empty());
    EXPECT_FALSE(a.state.carry);
    EXPECT_EQ(m.stats().pages_cached, 3);
    EXPECT_EQ(m.stats().pages_used, 3);  // the partial page went back

    CachedSequence b;
    EXPECT_EQ(m.admit(b, t), 3 * P);
    EXPECT_EQ(b.state.n_cached, 3 * P);
    EXPECT_EQ(b.shared_pages, 3);
    ASSERT_TRUE(b.state.carry);
    EXPECT_EQ(b.state.carry.get()[0], 3);  // resumed from the third page's snapshot
    EXPECT_EQ(m.stats().pages_evictable, 0);
    m.release(b, 3 * P);
    EXPECT_EQ(m.stats().pages_evictable, 3);

    // A prompt of exactly three pages keeps its last token to compute: two pages are reused.
    CachedSequence c;
    EXPECT_EQ(m.admit(c, tokens(3 * P)), 2 * P);
    m.release(c, 2 * P);
}

TEST(CacheManager, UnknownTokensAreNeverCached) {
    HostStateMemory mem;
    CacheManager m(mem, small_layout(P), 16, true);
    const auto t = tokens(2 * P + 1);
    CachedSequence a;
    ASSERT_EQ(m.admit(a, t), 0);
    compute(m, a, t);
    m.release(a, P + 3);  // the token at P + 3 was never known (a failed step)
    EXPECT_EQ(m.stats().pages_cached, 1);
    EXPECT_EQ(m.stats().pages_used, 1);
}

TEST(CacheManager, ShortAdmissionHoldsNothingAndGrowthEvicts) {
    HostStateMemory mem;
    CacheManager m(mem, small_layout(P), 4, true);
    const auto t = tokens(3 * P);
    CachedSequence a;
    ASSERT_EQ(m.admit(a, t), 0);
    compute(m, a, t);  // 4 pages: 3 full + room for one more token
    m.release(a, 3 * P);
    EXPECT_EQ(m.available_pages(), 4);
    EXPECT_EQ(m.stats().pages_cached, 3);

    CachedSequence big;
    EXPECT_EQ(m.admit(big, tokens(5 * P, 1000)), -1);
    EXPECT_EQ(m.stats().pages_evictable, 3);  // nothing locked by the failed admission
    CachedSequence other;
    ASSERT_EQ(m.admit(other, tokens(2 * P, 500)), 0);
    EXPECT_TRUE(m.reserve(other, 4 * P));  // evicts the three cached pages
    EXPECT_EQ(m.stats().pages_cached, 0);
    EXPECT_FALSE(m.reserve(other, 5 * P));
    m.release(other, 0);
    EXPECT_EQ(m.available_pages(), 4);
}

TEST(CacheManager, RunningSequencesShareCompletedPages) {
    HostStateMemory mem;
    CacheManager m(mem, small_layout(P), 16, true);
    const auto t = tokens(2 * P + 2);
    CachedSequence a;
    ASSERT_EQ(m.admit(a, t), 0);
    compute(m, a, t);
    m.share(a, a.state.n_cached);
    EXPECT_EQ(a.shared_pages, 2);
    EXPECT_EQ(m.stats().pages_cached, 2);
    EXPECT_EQ(m.stats().pages_evictable, 0);  // a still uses them
    CachedSequence b;
    EXPECT_EQ(m.admit(b, t), 2 * P);  // while a runs
    m.release(b, 2 * P);
    m.release(a, a.state.n_cached);
    EXPECT_EQ(m.stats().pages_cached, 2);
    EXPECT_EQ(m.stats().pages_evictable, 2);
    EXPECT_EQ(m.flush(), 2);
    EXPECT_EQ(m.stats().pages_used, 0);
}

TEST(CacheManager, ConcurrentDuplicatesKeepTheirOwnPages) {
    HostStateMemory mem;
    CacheManager m(mem, small_layout(P), 16, true);
    const auto t = tokens(2 * P + 2);
    CachedSequence a, b;
    ASSERT_EQ(m.admit(a, t), 0);
    ASSERT_EQ(m.admit(b, t), 0);  // both admitted before either computed
    compute(m, a, t);
    compute(m, b, t);
    m.share(a, a.state.n_cached);
    m.share(b, b.state.n_cached);
    EXPECT_TRUE(b.sharing_stopped);
    EXPECT_EQ(b.shared_pages, 0);
    EXPECT_EQ(m.stats().pages_cached, 2);
    m.release(b, b.state.n_cached);  // its duplicate pages go back to the pool
    m.release(a, a.state.n_cached);
    EXPECT_EQ(m.stats().pages_used, 2);
}

TEST(CacheManager, WithoutPrefixCacheEverythingGoesBack) {
    HostStateMemory mem;
    CacheManager m(mem, small_layout(P), 8, false);
    const auto t = tokens(2 * P + 1);
    CachedSequence a;
    ASSERT_EQ(m.admit(a, t), 0);
    compute(m, a, t);
    m.share(a, a.state.n_cached);
    m.release(a, a.state.n_cached);
    EXPECT_EQ(m.stats().pages_used, 0);
    CachedSequence b;
    EXPECT_EQ(m.admit(b, t), 0);
    m.release(b, 0);
}
