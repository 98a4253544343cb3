// Radix cache bookkeeping: page-granular matching, sharing, duplicate pages, locking and LRU eviction.
#include "kv/radix_cache.h"

#include <gtest/gtest.h>
#include <numeric>

using namespace peregrine;

namespace {

const int P = 16;

// Pages of one layer's window entries (the cache only needs page_tokens).
const StateLayout& layout() {
    static const StateLayout L = [] {
        StateSpec spec;
        spec.layers.resize(1);
        spec.layers[0].window = {fp8_entry_format(64, 64, 32), 1};
        return make_state_layout(spec, P);
    }();
    return L;
}
HostStateMemory memory;

std::vector<int32_t> seq(int n, int start = 0) {
    std::vector<int32_t> v(static_cast<size_t>(n) * P / 4);
    std::iota(v.begin(), v.end(), start);
    return v;
}

std::vector<PageRow> take(PagePool& pool, int n) {
    std::vector<PageRow> p;
    for (int i = 0; i < n; ++i) p.push_back(pool.alloc());
    return p;
}

}  // namespace

TEST(RadixCache, MatchesWholePagesOnly) {
    PagePool pool(memory, layout(), 32);
    ASSERT_EQ(layout().page_tokens, P);
    RadixCache cache(pool);
    auto t = seq(11);  // 2 full pages + 3 tokens
    auto pages = take(pool, 3);
    cache.insert(t, pages, 2);
    pool.free(pages[2]);
    EXPECT_EQ(cache.stats().cached_pages, 2);
    EXPECT_EQ(pool.used_pages(), 2);

    auto m = cache.match(t, 100);
    EXPECT_EQ(m.pages, std::vector<PageRow>(pages.begin(), pages.begin() + 2));
    EXPECT_EQ(cache.stats().evictable_pages, 0);
    cache.unlock(m.last);
    EXPECT_EQ(cache.stats().evictable_pages, 2);

    auto limited = cache.match(t, 1);  // e.g. a prompt of exactly one page keeps its last token to compute
    EXPECT_EQ(limited.pages.size(), 1u);
    cache.unlock(limited.last);

    auto other = seq(8, 0);
    other[5 * P / 4] = 99;  // diverges inside the second page
    auto m2 = cache.match(other, 100);
    EXPECT_EQ(m2.pages.size(), 1u);
    cache.unlock(m2.last);

    auto none = cache.match(seq(3), 100);  // shorter than a page
    EXPECT_TRUE(none.pages.empty());
    EXPECT_EQ(none.last, nullptr);
}

TEST(RadixCache, DuplicatePagesReturnToPool) {
    PagePool pool(memory, layout(), 32);
    ASSERT_EQ(layout().page_tokens, P);
    RadixCache cache(pool);
    auto t = seq(12);
    cache.insert(t, take(pool, 3), 3);
    auto again = take(pool, 3);  // a second sequence computed the same prefix concurrently
    cache.insert(t, again, 3);
    EXPECT_EQ(cache.stats().cached_pages, 3);
    EXPECT_EQ(pool.used_pages(), 3);
}

TEST(RadixCache, SharedPrefixBranches) {
    PagePool pool(memory, layout(), 32);
    ASSERT_EQ(layout().page_tokens, P);
    RadixCache cache(pool);
    auto a = seq(12), b = seq(12);
    b[9 * P / 4] = 77;  // same first two pages
    auto pa = take(pool, 3);
    cache.insert(a, pa, 3);
    auto m = cache.match(b, 100);
    ASSERT_EQ(m.pages.size(), 2u);
    std::vector<PageRow> pb = m.pages;
    pb.push_back(pool.alloc());
    cache.insert(b, pb, 3);
    cache.unlock(m.last);
    EXPECT_EQ(cache.stats().cached_pages, 4);
    EXPECT_EQ(pool.used_pages(), 4);
    EXPECT_EQ(cache.match(a, 100).pages, pa);
}

TEST(RadixCache, EvictsLeastRecentlyUsedUnreferencedLeaves) {
    PagePool pool(memory, layout(), 32);
    ASSERT_EQ(layout().page_tokens, P);
    RadixCache cache(pool);
    auto a = seq(8, 0), b = seq(8, 1000), c = seq(8, 2000);
    cache.insert(a, take(pool, 2), 2);
    cache.insert(b, take(pool, 2), 2);
    cache.insert(c, take(pool, 2), 2);
    cache.unlock(cache.match(a, 100).last);  // a is now the most recently used
    auto held = cache.match(c, 100);         // c is in use: never evicted
    EXPECT_EQ(cache.stats().evictable_pages, 4);

    EXPECT_EQ(cache.evict(2), 2);  // b goes first (oldest), leaf then its parent
    EXPECT_EQ(cache.match(b, 100).pages.size(), 0u);
    auto ma = cache.match(a, 100);
    EXPECT_EQ(ma.pages.size(), 2u);
    cache.unlock(ma.last);

    EXPECT_EQ(cache.evict(100), 2);  // only a remains evictable
    EXPECT_EQ(cache.stats().cached_pages, 2);
    EXPECT_EQ(pool.used_pages(), 2);
    cache.unlock(held.last);
    EXPECT_EQ(cache.clear(), 2);
    EXPECT_EQ(pool.used_pages(), 0);
}

// Eviction follows use through a shared prefix: the branch used last stays, the other goes leaf first, and the shared
// rows go only after every branch below them (the evictable set is kept as rows are used, locked and freed).
TEST(RadixCache, EvictionFollowsUseAcrossBranchesOfASharedPrefix) {
    PagePool pool(memory, layout(), 32);
    RadixCache cache(pool);
    auto x = seq(16, 0), y = seq(16, 0);  // pages 0-1 shared, 2-3 their own
    for (size_t i = 2 * P; i < y.size(); ++i) y[i] += 5000;
    cache.insert(x, take(pool, 4), 4);
    cache.insert(y, take(pool, 4), 4);  // its first two rows are x's: those go back to the pool
    EXPECT_EQ(cache.stats().cached_pages, 6);
    cache.unlock(cache.match(x, 100).last);  // x is the most recently used branch
    EXPECT_EQ(cache.evict(2), 2);            // y's own rows
    auto my = cache.match(y, 100);
    EXPECT_EQ(my.pages.size(), 2u);  // the shared rows remain
    cache.unlock(my.last);
    cache.unlock(cache.match(x, 100).last);
    EXPECT_EQ(cache.evict(1), 1);  // x's deepest row
    auto m = cache.match(x, 100);
    EXPECT_EQ(m.pages.size(), 3u);
    cache.unlock(m.last);
    EXPECT_EQ(cache.evict(3), 3);
    EXPECT_EQ(cache.stats().cached_pages, 0);
    EXPECT_EQ(pool.used_pages(), 0);
}

TEST(RadixCache, ParentOfLockedChildIsNotEvicted) {
    PagePool pool(memory, layout(), 32);
    ASSERT_EQ(layout().page_tokens, P);
    RadixCache cache(pool);
    auto a = seq(12);
    cache.insert(a, take(pool, 3), 3);
    auto m = cache.match(a, 3);
    EXPECT_EQ(cache.evict(100), 0);
    cache.unlock(m.last);
    EXPECT_EQ(cache.evict(1), 1);  // the deepest page first
    EXPECT_EQ(cache.match(a, 100).pages.size(), 2u);
}

TEST(RadixCache, RunningSequenceSharesPagesAndKeepsDuplicatesPrivate) {
    PagePool pool(memory, layout(), 32);
    RadixCache cache(pool);
    auto t = seq(16);  // 4 pages
    auto a = take(pool, 4);
    int64_t to = 2;
    RadixCache::Node* la = cache.extend(nullptr, t, a, 0, to);  // a has finished its first two pages
    EXPECT_EQ(to, 2);
    EXPECT_EQ(cache.stats().cached_pages, 2);
    EXPECT_EQ(cache.stats().evictable_pages, 0);  // locked for a
    EXPECT_EQ(cache.evict(100), 0);
    auto m = cache.match(t, 100);  // a newcomer reuses them while a runs
    EXPECT_EQ(m.pages, std::vector<PageRow>(a.begin(), a.begin() + 2));
    cache.unlock(m.last);

    auto b = take(pool, 4);  // b computed the same four pages privately
    to = 4;
    RadixCache::Node* lb = cache.extend(nullptr, t, b, 0, to);
    EXPECT_EQ(to, 0);  // its first page is a duplicate: nothing shared
    EXPECT_EQ(lb, nullptr);
    to = 4;
    la = cache.extend(la, t, a, 2, to);
    EXPECT_EQ(to, 4);
    EXPECT_EQ(cache.stats().cached_pages, 4);

    cache.insert(t, b, 4);  // b finishes: its duplicates go back to the pool
    EXPECT_EQ(pool.used_pages(), 4);
    cache.insert(t, a, 4);  // a finishes: its pages are the cached ones
    cache.unlock(la);
    EXPECT_EQ(cache.stats().evictable_pages, 4);
    EXPECT_EQ(pool.used_pages(), 4);
}
