// Entry-address tables built on the device from the step's page tables (Numerics::Fast). The arithmetic is
// StateLayout::entry's and the window order attention_plan.cpp's window_list's, so the tables hold exactly
// the addresses the host would have listed; the kernels that read them are unchanged.
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"

#include <algorithm>

namespace peregrine::cuda {

namespace {

__device__ __forceinline__ const float* paged_entry(const PagedSeqs& p, const PagedSection& sec, int s, int64_t index) {
    int64_t page, slot;
    if (sec.per_entry_tokens <= p.page_tokens) {
        const int64_t per_page = p.page_tokens / sec.per_entry_tokens;
        page = index / per_page;
        slot = index % per_page;
    } else {  // an entry spanning several pages lives in the page of its last token
        page = ((index + 1) * sec.per_entry_tokens - 1) / p.page_tokens;
        slot = 0;
    }
    const int64_t* m = p.seq + 4 * static_cast<int64_t>(s);
    const uint8_t* base = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(m[0]));
    const int64_t id = p.pages[m[1] + page];
    return reinterpret_cast<const float*>(base + id * p.page_bytes + sec.offset + slot * sec.entry_bytes);
}

// Grid: x over entries, y over sequences.
__global__ void entry_table_kernel(PagedSeqs p, PagedSection sec, int ratio, const int64_t* seq_base,
                                   const float** table) {
    const int s = blockIdx.y;
    const int64_t* m = p.seq + 4 * static_cast<int64_t>(s);
    if (m[3] <= 0) return;
    const int64_t count = (m[2] + m[3]) / ratio;
    const int64_t base = seq_base[s];
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < count;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x)
        table[base + j] = paged_entry(p, sec, s, j);
}

// window_list (attention_plan.cpp) entry j of the row at `pos`: a position or -1; *n the list's length.
__device__ __forceinline__ int64_t window_pos(int64_t start, int64_t n_tokens, int64_t pos, int W, bool v41, int j,
                                              int* n) {
    if (start == 0) {  // one-shot prefill: the query's window, oldest first
        const int64_t len = min(n_tokens, static_cast<int64_t>(W)), base = max(static_cast<int64_t>(0), pos - W + 1);
        *n = static_cast<int>(len);
        return j < len && base + j <= pos ? base + j : -1;
    }
    *n = W;
    if (n_tokens == 1 && (v41 || pos >= W - 1)) {  // decode: the ring from its oldest slot
        const int64_t slot = (pos % W + 1 + j) % W;
        return slot <= pos ? pos - ((pos - slot) % W) : -1;
    }
    const int64_t lo = max(static_cast<int64_t>(0), pos - W + 1);  // chunked prefill: oldest first, padded
    return lo + j <= pos ? lo + j : -1;
}

__global__ void window_table_kernel(PagedSeqs p, PagedSection sec, int64_t T, int W, bool v41, const float** win,
                                    int32_t* nwin) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= T * W) return;
    const int64_t t = i / W;
    const int j = static_cast<int>(i % W);
    const int s = p.row_seq[t];
    const int64_t* m = p.seq + 4 * static_cast<int64_t>(s);
    int n = 0;
    const int64_t at = window_pos(m[2], m[3], p.row_pos[t], W, v41, j, &n);
    if (j == 0) nwin[t] = n;
    win[i] = j < n && at >= 0 ? paged_entry(p, sec, s, at) : nullptr;
}

}  // namespace

void paged_entry_table(const PagedSeqs& p, const PagedSection& sec, int ratio, const int64_t* seq_base,
                       int64_t max_entries, const float** table) {
    if (p.n_seqs == 0 || max_entries <= 0) return;
    if (p.n_seqs > 65535 || ratio <= 0)
        cuda_fail(cudaErrorInvalidValue, "paged_entry_table: bad sequence count or ratio", __FILE__, __LINE__);
    const dim3 grid(std::min<unsigned>(blocks_for(max_entries), 1u << 16), static_cast<unsigned>(p.n_seqs));
    entry_table_kernel<<<grid, kThreads>>>(p, sec, ratio, seq_base, table);
    PG_LAUNCHED();
}

void paged_window_table(const PagedSeqs& p, const PagedSection& sec, int64_t T, int W, bool v41, const float** win,
                        int32_t* nwin) {
    if (T * W == 0) return;
    window_table_kernel<<<blocks_for(T * W), kThreads>>>(p, sec, T, W, v41, win, nwin);
    PG_LAUNCHED();
}

}  // namespace peregrine::cuda
