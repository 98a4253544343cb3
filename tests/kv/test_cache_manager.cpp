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
    CacheManager m(mem, small_layout(P), {16, 16}, true);
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
    CacheManager m(mem, small_layout(P), {16, 16}, true);
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
    CacheManager m(mem, small_layout(P), {4, 4}, true);
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
    CacheManager m(mem, small_layout(P), {16, 16}, true);
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
    CacheManager m(mem, small_layout(P), {16, 16}, true);
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
    CacheManager m(mem, small_layout(P), {8, 8}, false);
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

// ---- window pages: a sequence holds its last window only, the cache keeps tails

namespace {
constexpr int W = 16;  // a window of 16 tokens: a resume at a page boundary reads the 2 rows before it

// Computes t[start, end) as steps of `step` tokens, sharing completed pages after each (as the engine does).
void run(CacheManager& m, CachedSequence& s, const std::vector<int32_t>& t, int64_t end, int step, bool share) {
    for (int64_t pos = s.state.n_cached; pos < end; pos = s.state.n_cached) {
        const int64_t next = std::min<int64_t>(end, pos + step);
        ASSERT_TRUE(m.reserve(s, next + 1));
        s.state.tokens.assign(t.begin(), t.begin() + next);
        s.state.n_cached = next;
        if (share) m.share(s, next);
    }
}

// Rows of the sequence that hold a window page.
std::vector<int64_t> window_rows(const CachedSequence& s) {
    std::vector<int64_t> rows;
    for (size_t r = 0; r < s.state.pages.size(); ++r)
        if (s.state.pages[r][kWindowPages] >= 0) rows.push_back(static_cast<int64_t>(r));
    return rows;
}
}  // namespace

TEST(CacheManager, RunningSequenceHoldsOnlyItsWindow) {
    HostStateMemory mem;
    const StateLayout L = small_layout(P, W);
    ASSERT_EQ(L.window_rows(), 2);
    CacheManager m(mem, L, {32, 5}, false);  // 5 window pages: 2 read, the row written, a chunk's second row
    const auto t = tokens(25 * P);
    CachedSequence a;
    ASSERT_EQ(m.admit(a, t), 0);
    for (int step : {P, 3}) {  // page-sized steps, then steps across page boundaries
        run(m, a, t, step == P ? 12 * P : 25 * P - 1, step, false);
        ASSERT_TRUE(m.reserve(a, a.state.n_cached + 1));
        const int64_t first = L.window_first_row(a.state.n_cached);
        EXPECT_EQ(window_rows(a).front(), first) << "rows before the window keep no window page";
        EXPECT_LE(m.stats().window_pages_used, 4);
        EXPECT_EQ(m.stats().pages_used, static_cast<int64_t>(a.state.pages.size())) << "history stays whole";
    }
    m.release(a, a.state.n_cached);
    EXPECT_EQ(m.stats().window_pages_used, 0);
    EXPECT_EQ(m.stats().pages_used, 0);
}

TEST(CacheManager, FinishedSequenceLeavesItsWindowTail) {
    HostStateMemory mem;
    const StateLayout L = small_layout(P, W);
    CacheManager m(mem, L, {32, 8}, true);
    const auto t = tokens(10 * P + 3);
    CachedSequence a;
    ASSERT_EQ(m.admit(a, t), 0);
    run(m, a, t, static_cast<int64_t>(t.size()), P, false);
    m.release(a, static_cast<int64_t>(t.size()));
    EXPECT_EQ(m.stats().pages_cached, 10);
    // The last two rows, the ones a resume at the end reads, keep their window pages.
    EXPECT_EQ(m.stats().window_pages_cached, 2);

    // The next turn resumes at the end of the tail; its window rows are the cached ones.
    auto next = t;
    next.resize(10 * P);
    for (int i = 0; i < 9; ++i) next.push_back(7000 + i);
    CachedSequence b;
    EXPECT_EQ(m.admit(b, next), 10 * P);
    EXPECT_EQ(window_rows(b), (std::vector<int64_t>{8, 9}));
    m.release(b, 10 * P);

    // A prompt that leaves the path where no window was kept cannot resume there.
    auto fork = t;
    fork.resize(5 * P);
    for (int i = 0; i < 9; ++i) fork.push_back(9000 + i);
    CachedSequence c;
    EXPECT_EQ(m.admit(c, fork), 0);
    m.release(c, 0);
    EXPECT_EQ(m.stats().window_pages_used, m.stats().window_pages_cached);
}

TEST(CacheManager, SharedRowsKeepWindowsUntilTheTableRunsShort) {
    HostStateMemory mem;
    const StateLayout L = small_layout(P, W);
    CacheManager m(mem, L, {64, 9}, true);
    const auto t = tokens(16 * P);
    CachedSequence a;
    ASSERT_EQ(m.admit(a, t), 0);
    run(m, a, t, 6 * P, P, true);  // rows 0..5 shared while a runs
    // A request forking after row 5 resumes there while a still runs: the cache holds rows 4 and 5's windows.
    auto fork = t;
    fork.resize(6 * P);
    fork.push_back(9999);
    CachedSequence b;
    EXPECT_EQ(m.admit(b, fork), 6 * P);
    m.release(b, 6 * P);

    // a runs on: the window pages it passes become evictable, and are evicted as it needs new ones.
    run(m, a, t, 16 * P, P, true);
    EXPECT_EQ(m.stats().pages_cached, 16);
    CachedSequence c;
    EXPECT_EQ(m.admit(c, fork), 0) << "the least recently used windows went first";
    m.release(c, 0);
    m.release(a, a.state.n_cached);
    // A flush drops every window page no sequence reads, and every row.
    EXPECT_EQ(m.flush(), 16);
    EXPECT_EQ(m.stats().window_pages_used, 0);
    EXPECT_EQ(m.stats().pages_used, 0);
}

TEST(CacheManager, WindowPagesSizedFromTheRunningCap) {
    const StateLayout L = small_layout(P, W);
    EXPECT_EQ(window_pages_wanted(L, 4, 64, 3), 4 * (2 + 2) + 8 + 3 * 2);
    EXPECT_EQ(window_pages_wanted(small_layout(P), 4, 64, 3), INT64_MAX);
    const auto history = static_cast<int64_t>(L.page_bytes[kHistoryPages]);
    const auto window = static_cast<int64_t>(L.page_bytes[kWindowPages]);
    const int64_t bytes = 100 * (history + window);
    EXPECT_EQ(PagePool::pages_for_budget(L, bytes, 1000), (PagePool::Pages{100, 100}));
    EXPECT_EQ(PagePool::pages_for_budget(L, bytes, 20), (PagePool::Pages{(bytes - 20 * window) / history, 20}));
    // Window-only layers: empty history pages.
    StateSpec spec;
    spec.window_tokens = W;
    spec.layers.resize(1);
    spec.layers[0].window = {fp8_entry_format(64, 64, 32), 1};
    const StateLayout windows_only = make_state_layout(spec, P);
    ASSERT_EQ(windows_only.page_bytes[kHistoryPages], 0u);
    const auto w1 = static_cast<int64_t>(windows_only.page_bytes[kWindowPages]);
    EXPECT_EQ(PagePool::pages_for_budget(windows_only, 100 * w1, 20), (PagePool::Pages{80 * w1 / 64, 20}));
}
