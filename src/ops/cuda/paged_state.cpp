#include "ops/cuda/paged_state.h"

#include "ops/cuda/cuda_backend.h"
#include "util/error.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace peregrine::cuda {

PagedStep upload_paged_step(const StateLayout& layout, const ForwardBatch& batch) {
    const int64_t S = static_cast<int64_t>(batch.seqs.size()), T = batch.rows();
    std::vector<int64_t> seq(static_cast<size_t>(4 * S));
    std::vector<int32_t> pages;
    for (int64_t s = 0; s < S; ++s) {
        const BatchSeq& b = batch.seqs[static_cast<size_t>(s)];
        const int64_t n = layout.pages_for(b.start_pos + b.n_tokens);
        PEREGRINE_CHECK(b.state && static_cast<int64_t>(b.state->pages.size()) >= n, "sequence {} lacks pages", s);
        seq[static_cast<size_t>(4 * s)] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.state->pool));
        seq[static_cast<size_t>(4 * s + 1)] = static_cast<int64_t>(pages.size());
        seq[static_cast<size_t>(4 * s + 2)] = b.start_pos;
        seq[static_cast<size_t>(4 * s + 3)] = b.n_tokens;
        pages.insert(pages.end(), b.state->pages.begin(), b.state->pages.begin() + n);
    }
    std::vector<int64_t> row_pos(static_cast<size_t>(T));
    std::vector<int32_t> row_seq(static_cast<size_t>(T));
    for (int64_t s = 0; s < S; ++s) {
        const BatchSeq& b = batch.seqs[static_cast<size_t>(s)];
        for (int i = 0; i < b.n_tokens; ++i) {
            row_pos[static_cast<size_t>(b.row0 + i)] = b.start_pos + i;
            row_seq[static_cast<size_t>(b.row0 + i)] = static_cast<int32_t>(s);
        }
    }
    // One buffer: the int64 arrays first (8-byte aligned), then the int32 ones.
    const size_t b_seq = 0, b_pos = b_seq + seq.size() * 8, b_pages = b_pos + row_pos.size() * 8,
                 b_rows = b_pages + pages.size() * 4, total = b_rows + row_seq.size() * 4;
    std::vector<uint8_t> buf(std::max<size_t>(total, 8));
    if (!seq.empty()) std::memcpy(buf.data() + b_seq, seq.data(), seq.size() * 8);
    if (!row_pos.empty()) std::memcpy(buf.data() + b_pos, row_pos.data(), row_pos.size() * 8);
    if (!pages.empty()) std::memcpy(buf.data() + b_pages, pages.data(), pages.size() * 4);
    if (!row_seq.empty()) std::memcpy(buf.data() + b_rows, row_seq.data(), row_seq.size() * 4);
    auto dev = CudaBackend::upload(buf);
    PagedStep out;
    out.keep = dev.keep;
    const uint8_t* d = dev.ptr;
    out.seqs.seq = reinterpret_cast<const int64_t*>(d + b_seq);
    out.seqs.row_pos = reinterpret_cast<const int64_t*>(d + b_pos);
    out.seqs.pages = reinterpret_cast<const int32_t*>(d + b_pages);
    out.seqs.row_seq = reinterpret_cast<const int32_t*>(d + b_rows);
    out.seqs.n_seqs = static_cast<int>(S);
    out.seqs.page_tokens = layout.page_tokens;
    out.seqs.page_bytes = static_cast<int64_t>(layout.page_bytes);
    return out;
}

}  // namespace peregrine::cuda
