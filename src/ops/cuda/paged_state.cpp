#include "ops/cuda/paged_state.h"

#include "ops/attention_plan.h"
#include "ops/cuda/cuda_backend.h"
#include "util/error.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace peregrine::cuda {

namespace {
// The packed layout: the int64 arrays first (8-byte aligned), then the int32 ones, the pages last.
struct StepLayout {
    size_t seq, pos, carry, step, rows, pages, total;
    StepLayout(int64_t S, int64_t T, int64_t n_pages) {
        seq = 0;
        pos = seq + static_cast<size_t>(kSeqFields * S) * 8;
        carry = pos + static_cast<size_t>(T) * 8;
        step = carry + static_cast<size_t>(S) * 8;
        rows = step + static_cast<size_t>(T) * 8;
        pages = rows + static_cast<size_t>(T) * 4;
        total = pages + static_cast<size_t>(n_pages) * kPageTables * 4;
    }
};
}  // namespace

size_t paged_step_bytes(int64_t S, int64_t T, int64_t n_pages) { return StepLayout(S, T, n_pages).total; }

PagedStep upload_paged_step(const StateLayout& layout, const ForwardBatch& batch,
                            const std::vector<int64_t>* carries, std::shared_ptr<void> into, size_t into_bytes) {
    const int64_t S = static_cast<int64_t>(batch.seqs.size()), T = batch.rows();
    int64_t n_pages = 0;
    for (int64_t s = 0; s < S; ++s) {
        const BatchSeq& b = batch.seqs[static_cast<size_t>(s)];
        const int64_t n = layout.pages_for(b.start_pos + b.n_tokens);
        PEREGRINE_CHECK(b.state && static_cast<int64_t>(b.state->pages.size()) >= n, "sequence {} lacks pages", s);
        n_pages += n;
    }
    // One buffer, reused from step to step: at batch 128 and a 128K context the tables are 4 MB, and fresh memory
    // each step cost its page faults (several ms of host time a step on the GPU machine).
    const StepLayout at(S, T, n_pages);
    thread_local std::vector<uint8_t> buf;
    buf.resize(std::max<size_t>(at.total, 8));
    auto* seq = reinterpret_cast<int64_t*>(buf.data() + at.seq);
    auto* row_pos = reinterpret_cast<int64_t*>(buf.data() + at.pos);
    auto* carry = reinterpret_cast<int64_t*>(buf.data() + at.carry);
    auto* row_step = reinterpret_cast<int64_t*>(buf.data() + at.step);
    auto* pages = reinterpret_cast<int32_t*>(buf.data() + at.pages);
    auto* row_seq = reinterpret_cast<int32_t*>(buf.data() + at.rows);
    if (carries) {
        PEREGRINE_CHECK(static_cast<int64_t>(carries->size()) == S, "upload_paged_step: {} carries for {} sequences",
                        carries->size(), S);
        std::memcpy(carry, carries->data(), static_cast<size_t>(S) * 8);
    }
    int64_t first = 0;
    for (int64_t s = 0; s < S; ++s) {
        const BatchSeq& b = batch.seqs[static_cast<size_t>(s)];
        const int64_t n = layout.pages_for(b.start_pos + b.n_tokens);
        int64_t* m = seq + kSeqFields * s;
        m[0] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.state->pool[kHistoryPages]));
        m[1] = first;
        m[2] = b.start_pos;
        m[3] = b.n_tokens;
        m[4] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.state->pool[kWindowPages]));
        m[5] = b.window_floor;
        m[6] = keys_as_decode(b) ? 1 : 0;
        static_assert(sizeof(PageRow) == kPageTables * sizeof(int32_t), "page rows are packed ids");
        if (n > 0)
            std::memcpy(pages + first * kPageTables, b.state->pages.data(), sizeof(PageRow) * static_cast<size_t>(n));
        first += n;
        for (int i = 0; i < b.n_tokens; ++i) {
            row_pos[b.row0 + i] = b.start_pos + i;
            row_seq[b.row0 + i] = static_cast<int32_t>(s);
            // A speculative step keeps the carry after each of its tokens but the last (BatchSeq::speculative).
            const bool kept = carries && b.speculative && i + 1 < b.n_tokens;
            row_step[b.row0 + i] =
                kept ? static_cast<int64_t>(reinterpret_cast<uintptr_t>(
                           b.state->step_carries.at(static_cast<size_t>(i + 1)).get()))
                     : 0;
        }
    }
    PagedStep out;
    if (into) {
        PEREGRINE_CHECK(buf.size() <= into_bytes, "page tables of {} bytes over the {} of their buffer", buf.size(),
                        into_bytes);
        copy_to_device(into.get(), buf.data(), buf.size());
        out.keep = std::move(into);
    } else {
        out.keep = upload(buf).keep;
    }
    const auto* d = static_cast<const uint8_t*>(out.keep.get());
    out.seqs.seq = reinterpret_cast<const int64_t*>(d + at.seq);
    out.seqs.row_pos = reinterpret_cast<const int64_t*>(d + at.pos);
    out.seqs.carry = carries ? reinterpret_cast<const int64_t*>(d + at.carry) : nullptr;
    out.seqs.row_step = carries ? reinterpret_cast<const int64_t*>(d + at.step) : nullptr;
    out.seqs.pages = reinterpret_cast<const int32_t*>(d + at.pages);
    out.seqs.row_seq = reinterpret_cast<const int32_t*>(d + at.rows);
    out.seqs.n_seqs = static_cast<int>(S);
    out.seqs.page_tokens = layout.page_tokens;
    for (int t = 0; t < kPageTables; ++t)
        out.seqs.page_bytes[t] = static_cast<int64_t>(layout.page_bytes[static_cast<size_t>(t)]);
    return out;
}

namespace {
// Device room for n entry addresses.
AddressTable address_table(int64_t n) {
    AddressTable t;
    t.keep = device_alloc(sizeof(uint8_t*) * static_cast<size_t>(std::max<int64_t>(n, 1)));
    t.table = static_cast<const uint8_t**>(t.keep.get());
    t.n = n;
    return t;
}
// Device room for T rows' window lists of W addresses and their counts.
WindowTable window_table(int64_t T, int W) {
    WindowTable w;
    w.win = address_table(T * W);
    w.nwin_keep = device_alloc(sizeof(int32_t) * static_cast<size_t>(std::max<int64_t>(T, 1)));
    w.nwin = static_cast<int32_t*>(w.nwin_keep.get());
    return w;
}
}  // namespace

AddressTable device_entry_table(const PagedSeqs& p, const ForwardBatch& batch, const StateSection& sec, int ratio,
                                std::vector<int64_t>& rowbase) {
    rowbase.resize(static_cast<size_t>(batch.rows()));
    std::vector<int64_t> seq_base(batch.seqs.size());
    int64_t most = 0, n = 0;
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
        const BatchSeq& s = batch.seqs[i];
        seq_base[i] = n;
        for (int r = 0; r < s.n_tokens; ++r) rowbase[static_cast<size_t>(s.row0 + r)] = n;
        if (s.n_tokens <= 0) continue;
        const int64_t count = (s.start_pos + s.n_tokens) / ratio;
        n += count;
        most = std::max(most, count);
    }
    AddressTable t = address_table(n);
    auto sb = upload(seq_base);  // freed in stream order, after the kernel
    paged_entry_table(p, paged_section(sec), ratio, sb.ptr, most, t.table);
    return t;
}

AddressTable decode_entry_table(const PagedSeqs& p, const StateSection& sec, int ratio, const int64_t* base, int64_t T,
                                int64_t cap) {
    AddressTable t = address_table(T * cap);
    paged_entry_table(p, paged_section(sec), ratio, base, cap, t.table);
    return t;
}

WindowTable device_window_table(const PagedSeqs& p, const StateSection& sec, int64_t T, int W,
                                bool ring_before_full) {
    WindowTable w = window_table(T, W);
    paged_window_table(p, paged_section(sec), T, W, ring_before_full, w.win.table, w.nwin);
    return w;
}

WindowRows device_window_rows(const PagedSeqs& p, const ForwardBatch& batch, const StateSection& sec, int W,
                              bool ring_before_full) {
    std::vector<int64_t> seq_base(batch.seqs.size());
    int64_t most = 0, n = 0;
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
        seq_base[i] = n;
        const int64_t count = window_rows_of(batch.seqs[i], W);
        n += count;
        most = std::max(most, count);
    }
    const int64_t T = batch.rows(), row_bytes = 2 * static_cast<int64_t>(sec.format.dim);
    WindowRows w;
    w.src = address_table(n);
    auto sb = upload(seq_base);  // freed in stream order, after the kernels
    paged_window_rows(p, paged_section(sec), W, sb.ptr, most, w.src.table);
    w.rows = device_alloc(static_cast<size_t>(std::max<int64_t>(n, 1) * row_bytes));
    gather_keys_bf16(w.src.table, n, sec.format, static_cast<uint16_t*>(w.rows.get()));
    w.table = window_table(T, W);
    paged_window_rows_table(p, T, W, ring_before_full, sb.ptr, static_cast<const uint8_t*>(w.rows.get()), row_bytes,
                            w.table.win.table, w.table.nwin);
    return w;
}

}  // namespace peregrine::cuda
