// The address arithmetic the device uses to list state entries (ops/cuda/paged_address.h) against the host's
// StateLayout::entry, on the CPU: every section of a synthetic V4.1-Flash layout at several page sizes (compression
// ratios below, equal to and above the page size); the window lists (ops/window_order.h, shared by host and device)
// and the drafters' window keys (ops/draft_window.h) against their definitions.
#include "model/model.h"
#include "ops/attention_plan.h"
#include "ops/cuda/paged_address.h"
#include "ops/window_order.h"
#include "kv/sequence_state.h"
#include "kv/state_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>

using namespace peregrine;

namespace {

TEST(PagedAddress, EntryOffsetsMatchStateLayout) {
    const ModelConfig cfg = synthetic_v41_flash_config(4);
    int64_t checked = 0;
    for (int page_tokens : {4, 16, 64, 128, 256}) {
        const StateLayout layout = make_state_layout(cfg, page_tokens);
        // Each table's pages drawn in its own shuffled order.
        const size_t n = static_cast<size_t>(layout.pages_for(20000));
        SeqState st;
        std::array<std::vector<int32_t>, kPageTables> ids;
        for (int t = 0; t < kPageTables; ++t) {
            ids[t].resize(n);
            std::iota(ids[t].begin(), ids[t].end(), 0);
            std::shuffle(ids[t].begin(), ids[t].end(), std::mt19937(page_tokens + t));
            st.pool[t] = reinterpret_cast<uint8_t*>(uintptr_t{1 + static_cast<uintptr_t>(t)} << 40);  // never read
        }
        for (size_t i = 0; i < n; ++i) st.pages.push_back({ids[kHistoryPages][i], ids[kWindowPages][i]});
        for (const auto& L : layout.layers)
            for (const StateSection* s : {&L.window, &L.comp, &L.index_k}) {
                if (!s->present()) continue;
                const cuda::PagedSection ps{static_cast<int64_t>(s->offset), static_cast<int64_t>(s->entry_bytes),
                                            s->per_entry_tokens, s->table};
                for (int64_t i = 0; i < 20000 / s->per_entry_tokens; ++i, ++checked) {
                    const uint8_t* want = layout.entry<uint8_t>(st, *s, i);
                    const int64_t got = cuda::paged_entry_offset(
                        st.pages.front().data(), layout.page_tokens,
                        static_cast<int64_t>(layout.page_bytes[s->table]), ps, i);
                    ASSERT_EQ(want - st.pool[s->table], got)
                        << "page_tokens " << page_tokens << " ratio " << s->per_entry_tokens << " entry " << i;
                }
            }
    }
    EXPECT_GT(checked, 100000);
}

// window_list (window_position's entries, which the device's tables list too) against its definition: the
// query's window, positions max(0, pos - W + 1) .. pos, listed oldest first by a one-shot prefill (its length the
// step's rows, at most W) and by chunked prefill (padded to W); by slot from the oldest (slot (pos + 1 + j) % W holds
// the window's position of that residue, if any) by a row listing its keys as decoding does, once the window has
// filled (or with ring_before_full); positions below the window floor are absent (-1).
TEST(PagedAddress, WindowListsFollowTheirDefinition) {
    int64_t checked = 0, floored = 0;
    for (int W : {1, 4, 128})
        for (bool ring_before_full : {true, false})
            for (int64_t start : {0, 1, 3, 4, 5, 127, 128, 129, 1000})
                for (int n_tokens : {1, 2, 3, 5, 127, 128, 129, 300})
                    for (int64_t floor : {int64_t{0}, start, start - 3, start + 2})  // SWA bounded replay's floors
                    for (int kind : {0, 1, 2}) {  // a step; a verify step; batch-invariant keys
                        if (floor < 0 || (start == 0 && floor > 0) || (kind == 1 && start == 0)) continue;
                        BatchSeq s{nullptr, start, n_tokens, 0};
                        s.window_floor = floor;
                        s.speculative = kind == 1;
                        s.decode_keys = kind == 2;
                        const bool as_decode = keys_as_decode(s);
                        int64_t lowest = INT64_MAX;
                        for (int i = 0; i < n_tokens; ++i) {
                            const int64_t pos = start + i;
                            std::vector<int64_t> window, want;
                            for (int64_t p = std::max<int64_t>(0, pos - W + 1); p <= pos; ++p) window.push_back(p);
                            if (start == 0 && (!as_decode || pos == 0)) {
                                want = window;
                                want.resize(static_cast<size_t>(as_decode ? 1 : std::min(n_tokens, W)), -1);
                            } else if (as_decode && (ring_before_full || pos >= W - 1)) {
                                for (int j = 0; j < W; ++j) {
                                    const int64_t slot = (pos + 1 + j) % W;
                                    auto it = std::find_if(window.begin(), window.end(),
                                                           [&](int64_t p) { return p % W == slot; });
                                    want.push_back(it == window.end() ? -1 : *it);
                                }
                            } else {
                                want = window;
                                want.resize(static_cast<size_t>(W), -1);
                            }
                            for (int64_t& p : want)
                                if (p < floor) {
                                    floored += p >= 0;
                                    p = -1;
                                }
                            ASSERT_EQ(window_list(s, pos, W, ring_before_full), want)
                                << start << "+" << n_tokens << " floor " << floor << " pos " << pos << " kind "
                                << kind;
                            checked += static_cast<int64_t>(want.size());
                            for (int64_t p : want)
                                if (p >= 0) lowest = std::min(lowest, p);
                        }
                        // window_lowest bounds every listed position (device_window_rows decodes from there).
                        if (lowest != INT64_MAX) ASSERT_GE(lowest, window_lowest(start, floor, W));
                    }
    EXPECT_GT(checked, 100000);
    EXPECT_GT(floored, 1000);  // the floors took positions out of the lists
}

}  // namespace

// The drafters' window keys (for_each_draft_window_key, which draft_window_keys and the device's paged_draft_keys
// both enumerate) against their definition: a block's, the positions max(0, pos - W + 1, floor) .. pos listed by ring
// slot (position % W ascending); a chain's, max(floor + 1, row_pos - W + 1) .. pos oldest first.
TEST(PagedAddress, DraftWindowKeysFollowTheirDefinition) {
    int64_t lists = 0, nonempty = 0;
    for (int W : {1, 4, 8, 128})
        for (int64_t pos = 0; pos < 300; pos += pos < 20 ? 1 : 37)
            for (int64_t floor : {int64_t{0}, int64_t{1}, pos / 2, pos})
                for (int i = 0; i < 5; ++i)
                    for (bool chain : {false, true}) {
                        const int64_t row_pos = pos + 1 + i;
                        std::vector<int64_t> want;
                        if (chain) {
                            for (int64_t p = std::max(floor + 1, row_pos - W + 1); p <= pos; ++p) want.push_back(p);
                        } else {
                            for (int64_t p = std::max({int64_t{0}, pos - W + 1, floor}); p <= pos; ++p)
                                want.push_back(p);
                            std::stable_sort(want.begin(), want.end(),
                                             [&](int64_t a, int64_t b) { return a % W < b % W; });
                        }
                        ASSERT_EQ(peregrine::draft_window_keys(pos, row_pos, W, floor, chain), want)
                            << "W " << W << " pos " << pos << " floor " << floor << " i " << i << " chain " << chain;
                        ++lists;
                        nonempty += !want.empty();
                    }
    EXPECT_GT(nonempty, lists / 2);
}
