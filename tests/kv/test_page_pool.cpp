// The state layout's placement, and the page pool's sequences: pages, fresh and resumed carries, carry slots
// owned by one sequence at a time.
#include "kv/page_pool.h"
#include "util/error.h"
#include "kv_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

using namespace peregrine;
using test::small_layout;

TEST(StateLayout, WindowPagesApartFromHistoryPages) {
    const StateLayout L = small_layout();
    ASSERT_EQ(L.layers.size(), 2u);
    const LayerStateLayout &a = L.layers[0], &b = L.layers[1];
    // The window table: every layer's window entries.
    EXPECT_EQ(a.window.table, kWindowPages);
    EXPECT_EQ(b.window.table, kWindowPages);
    EXPECT_EQ(a.window.offset, 0u);
    EXPECT_EQ(a.window.entries_per_page, 8);
    EXPECT_EQ(b.window.offset, 8u * a.window.entry_bytes);
    EXPECT_EQ(L.page_bytes[kWindowPages], (b.window.offset + 8u * b.window.entry_bytes + 63) / 64 * 64);
    // The history table: compressed entries, indexer keys, then the snapshot.
    EXPECT_FALSE(a.comp.present());
    EXPECT_EQ(b.comp.table, kHistoryPages);
    EXPECT_EQ(b.index_k.table, kHistoryPages);
    EXPECT_EQ(b.comp.offset, 0u);
    EXPECT_EQ(b.comp.entries_per_page, 2);
    EXPECT_EQ(b.index_k.offset, b.comp.offset + 2u * b.comp.entry_bytes);
    EXPECT_EQ(L.snapshot_offset, b.index_k.offset + 2u * b.index_k.entry_bytes);
    EXPECT_EQ(b.carry_offset, 0u);
    EXPECT_EQ(b.carry_bytes, 2u * 4 * 64 * sizeof(float));
    EXPECT_EQ(b.index_carry_offset, b.carry_bytes);
    EXPECT_EQ(L.carry_bytes, b.carry_bytes + b.index_carry_bytes);
    EXPECT_EQ(L.page_bytes[kHistoryPages] % 64, 0u);
    EXPECT_GE(L.page_bytes[kHistoryPages], L.snapshot_offset + L.carry_bytes);
    EXPECT_EQ(L.row_bytes(), L.page_bytes[kHistoryPages] + L.page_bytes[kWindowPages]);
}

TEST(StateLayout, EntriesFollowTheirTablesPages) {
    const StateLayout L = small_layout();
    const LayerStateLayout& b = L.layers[1];
    std::vector<uint8_t> history(4 * L.page_bytes[kHistoryPages]), window(4 * L.page_bytes[kWindowPages]);
    SeqState s;
    s.pool = {history.data(), window.data()};
    s.pages = {{3, 1}, {0, 2}};  // row 1: history page 0, window page 2
    // Window entry 9 (token 9): row 1, slot 1 of the window table's page 2.
    EXPECT_EQ(L.entry<uint8_t>(s, b.window, 9),
              window.data() + 2 * L.page_bytes[kWindowPages] + b.window.offset + b.window.entry_bytes);
    // Compressed entry 3 (ratio 4: tokens 12..15): row 1, slot 1 of the history table's page 0.
    EXPECT_EQ(L.entry<uint8_t>(s, b.comp, 3), history.data() + b.comp.offset + b.comp.entry_bytes);
    EXPECT_EQ(L.snapshot(s, 0), history.data() + 3 * L.page_bytes[kHistoryPages] + L.snapshot_offset);
    s.pages[1][kWindowPages] = -1;  // a released window page
    EXPECT_THROW(L.entry<uint8_t>(s, b.window, 9), Error);
    EXPECT_NO_THROW(L.entry<uint8_t>(s, b.comp, 3));
}

TEST(StateLayout, RatiosAndPagesMustDivide) {
    StateSpec spec;
    spec.layers.resize(1);
    spec.layers[0].window = {fp8_entry_format(64, 64, 32), 1};
    spec.layers[0].comp = {fp4_entry_format(64, 16, true), 3};
    EXPECT_THROW(make_state_layout(spec, 8), Error);
    spec.layers[0].comp.per_entry_tokens = 128;  // spans 16 pages: lives in the page of its last token
    const StateLayout L = make_state_layout(spec, 8);
    EXPECT_EQ(L.layers[0].comp.entries_per_page, 1);
    SeqState s;
    for (int i = 0; i < 32; ++i) s.pages.push_back({100 + i, i});
    std::vector<uint8_t> history(132 * L.page_bytes[kHistoryPages]);
    s.pool[kHistoryPages] = history.data();
    EXPECT_EQ(L.entry<uint8_t>(s, L.layers[0].comp, 1) - history.data(),
              static_cast<ptrdiff_t>(131 * L.page_bytes[kHistoryPages] + L.layers[0].comp.offset));
}

TEST(PagePool, FreshCarryScoresStartAtMinusInfinity) {
    HostStateMemory mem;
    const StateLayout L = small_layout();
    PagePool pool(mem, L, 4);
    SeqState s;
    pool.init(s);
    ASSERT_TRUE(s.carry);
    const float* f = reinterpret_cast<const float*>(s.carry.get());
    const size_t kv = 4 * 64, ikv = 4 * 32;
    for (size_t i = 0; i < kv; ++i) {
        EXPECT_EQ(f[i], 0.0f);
        EXPECT_TRUE(std::isinf(f[kv + i]) && f[kv + i] < 0);
    }
    const float* g = f + 2 * kv;
    for (size_t i = 0; i < ikv; ++i) {
        EXPECT_EQ(g[i], 0.0f);
        EXPECT_TRUE(std::isinf(g[ikv + i]) && g[ikv + i] < 0);
    }
    EXPECT_EQ(s.n_cached, 0);
    EXPECT_EQ(s.pool[kHistoryPages], pool.base(kHistoryPages));
    EXPECT_EQ(s.pool[kWindowPages], pool.base(kWindowPages));
}

TEST(PagePool, RestoreTakesThePagesSnapshot) {
    HostStateMemory mem;
    const StateLayout L = small_layout();
    PagePool pool(mem, L, 4);
    SeqState a;
    pool.init(a);
    ASSERT_TRUE(pool.reserve(a, 16));
    EXPECT_EQ(pool.used_pages(), 2);
    a.tokens.assign(16, 7);
    a.n_cached = 16;
    // What a compressor would have left in page 1's snapshot at its last token.
    uint8_t* snap = L.snapshot(a, 1);
    for (size_t i = 0; i < L.carry_bytes; ++i) snap[i] = static_cast<uint8_t>(i * 7 + 1);
    SeqState b;
    b.pages = a.pages;
    b.tokens = a.tokens;
    pool.restore(b, 16);
    EXPECT_EQ(b.n_cached, 16);
    ASSERT_TRUE(b.carry);
    EXPECT_NE(b.carry.get(), a.carry.get());
    EXPECT_EQ(std::memcmp(b.carry.get(), snap, L.carry_bytes), 0);
    EXPECT_THROW(pool.restore(b, 12), Error);  // not a page boundary
    b.pages.clear();                           // a's pages
}

TEST(PagePool, CarrySlotsAreOwnedAndReused) {
    HostStateMemory mem;
    const StateLayout L = small_layout();
    PagePool pool(mem, L, 64);
    std::vector<SeqState> v(40);  // more than a chunk of slots
    for (auto& s : v) pool.init(s);
    std::set<uint8_t*> distinct;
    for (auto& s : v) distinct.insert(s.carry.get());
    EXPECT_EQ(distinct.size(), v.size());
    uint8_t* p = v[3].carry.get();
    SeqState moved = std::move(v[3]);
    EXPECT_EQ(moved.carry.get(), p);
    EXPECT_FALSE(v[3].carry);
    pool.release(moved);
    EXPECT_FALSE(moved.carry);
    SeqState again;
    pool.init(again);
    EXPECT_EQ(again.carry.get(), p);  // the freed slot comes back first
    v.clear();
}

TEST(PagePool, ReserveIsAllOrNothing) {
    HostStateMemory mem;
    const StateLayout L = small_layout();
    PagePool pool(mem, L, 3);
    SeqState s;
    pool.init(s);
    EXPECT_FALSE(pool.reserve(s, 40));  // 5 pages of 8
    EXPECT_TRUE(s.pages.empty());
    EXPECT_EQ(pool.free_rows(), 3);
    EXPECT_TRUE(pool.reserve(s, 17));
    EXPECT_EQ(s.pages.size(), 3u);
    pool.release(s);
    EXPECT_EQ(pool.free_rows(), 3);
}
