#include "kv/state_layout.h"
#include "util/error.h"

#include <cmath>
#include <cstring>

namespace peregrine {

StateLayout make_state_layout(const StateSpec& spec, int page_tokens) {
    PEREGRINE_CHECK(page_tokens > 0, "pages need at least one token, not {}", page_tokens);
    StateLayout s;
    s.page_tokens = page_tokens;
    s.window_tokens = spec.window_tokens;
    std::array<size_t, kPageTables> off{};  // bytes so far in a page of each table
    auto place = [&](const SectionSpec& in, PageTable table) {
        StateSection sec;
        if (!in.present()) return sec;
        const int n = in.per_entry_tokens;
        sec.table = table;
        sec.offset = off[table];
        sec.format = in.format;
        sec.entry_bytes = static_cast<size_t>(in.format.bytes);
        sec.per_entry_tokens = n;
        if (n <= page_tokens) {
            if (page_tokens % n != 0) fail("page size {} is not a multiple of the compression ratio {}", page_tokens, n);
            sec.entries_per_page = page_tokens / n;
        } else {
            if (n % page_tokens != 0) fail("compression ratio {} is not a multiple of the page size {}", n, page_tokens);
            sec.entries_per_page = 1;
        }
        off[table] += sec.entry_bytes * static_cast<size_t>(sec.entries_per_page);
        return sec;
    };
    auto carry = [&](int64_t floats, size_t& offset, size_t& bytes) {
        if (floats <= 0) return;
        offset = s.carry_bytes;
        bytes = 2 * static_cast<size_t>(floats) * sizeof(float);
        s.carry_bytes += bytes;
    };
    for (const LayerStateSpec& in : spec.layers) {
        LayerStateLayout L;
        L.window = place(in.window, kWindowPages);
        L.comp = place(in.comp, kHistoryPages);
        L.index_k = place(in.index_k, kHistoryPages);
        carry(in.carry_floats, L.carry_offset, L.carry_bytes);
        carry(in.index_carry_floats, L.index_carry_offset, L.index_carry_bytes);
        s.layers.push_back(L);
    }
    if (spec.hidden_floats > 0) {
        s.hidden_offset = s.carry_bytes;
        s.hidden_bytes = static_cast<size_t>(spec.hidden_floats) * sizeof(float);
        s.carry_bytes += s.hidden_bytes;
    }
    s.snapshot_offset = off[kHistoryPages];
    s.page_bytes[kHistoryPages] = (off[kHistoryPages] + s.carry_bytes + 63) / 64 * 64;
    s.page_bytes[kWindowPages] = (off[kWindowPages] + 63) / 64 * 64;
    return s;
}

std::vector<uint8_t> StateLayout::initial_carry() const {
    std::vector<uint8_t> c(carry_bytes, 0);
    auto scores_from_minus_inf = [&](size_t offset, size_t bytes) {
        float* f = reinterpret_cast<float*>(c.data() + offset);
        const size_t half = bytes / sizeof(float) / 2;
        for (size_t i = 0; i < half; ++i) f[half + i] = -INFINITY;
    };
    for (const LayerStateLayout& L : layers) {
        if (L.carry_bytes) scores_from_minus_inf(L.carry_offset, L.carry_bytes);
        if (L.index_carry_bytes) scores_from_minus_inf(L.index_carry_offset, L.index_carry_bytes);
    }
    return c;
}

}  // namespace peregrine
