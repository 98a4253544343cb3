// Entry-address tables built on the device from the step's page tables (Numerics::Fast). The arithmetic is
// StateLayout::entry's and the window order attention_plan.cpp's window_list's, so the tables hold exactly
// the addresses the host would have listed; the kernels that read them are unchanged.
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/pdl.cuh"
#include "ops/draft_window.h"

#include <algorithm>

namespace peregrine::cuda {

namespace {

__device__ __forceinline__ const uint8_t* paged_entry(const PagedSeqs& p, const PagedSection& sec, int s,
                                                      int64_t index) {
    const int64_t* m = p.seq + kSeqFields * static_cast<int64_t>(s);
    const uint8_t* base = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(seq_table_base(m, sec.table)));
    return base + paged_entry_offset(p.pages + m[1] * kPageTables, p.page_tokens, p.page_bytes[sec.table], sec,
                                     index);
}

// A sequence's rows see window positions from window_lowest to the step's end.
__device__ __forceinline__ int64_t window_lo(const int64_t* m, int W) { return window_lowest(m[2], m[5], W); }

// Each row's window list: the positions' state entries, or with `rows`, their decoded rows (seq_entries_kernel's
// window order from row_base[s], row_bytes apart).
__global__ void window_table_kernel(PagedSeqs p, PagedSection sec, int64_t T, int W, bool ring_before_full,
                                    const int64_t* row_base, const uint8_t* rows, int64_t row_bytes,
                                    const uint8_t** win, int32_t* nwin) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= T * W) return;
    const int64_t t = i / W;
    const int j = static_cast<int>(i % W);
    const int s = p.row_seq[t];
    const int64_t* m = p.seq + kSeqFields * static_cast<int64_t>(s);
    int n = 0;
    const int64_t at = window_position(m[2], m[3], m[6] != 0, m[5], p.row_pos[t], W, ring_before_full, j, &n);
    if (j == 0) nwin[t] = n;
    if (!(j < n && at >= 0)) win[i] = nullptr;
    else if (rows) win[i] = rows + (row_base[s] + at - window_lo(m, W)) * row_bytes;
    else win[i] = paged_entry(p, sec, s, at);
}

// Grid: x over entries, y over sequences. Sequence s's entries first .. first + count - 1 into table from
// base[s]: every compressed entry (W = 0: ratio's), or the window positions its rows see (W > 0).
__global__ void seq_entries_kernel(PagedSeqs p, PagedSection sec, int ratio, int W, const int64_t* base,
                                   const uint8_t** table) {
    pdl_enter();
    const int s = blockIdx.y;
    const int64_t* m = p.seq + kSeqFields * static_cast<int64_t>(s);
    if (m[3] <= 0) return;
    const int64_t first = W > 0 ? window_lo(m, W) : 0;
    const int64_t count = W > 0 ? m[2] + m[3] - first : (m[2] + m[3]) / ratio;
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < count;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x)
        table[base[s] + j] = paged_entry(p, sec, s, first + j);
}

// V4 HCA: row t attends to every compressed entry of its sequence (a one-shot prefill: the step's width,
// lists_step_width; else the visible ones), invisible ones as -1, the list padded with -1 to kmax.
__global__ void all_entries_kernel(PagedSeqs p, int ratio, int64_t T, int kmax, int32_t* list, int32_t* counts) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= T * kmax) return;
    const int64_t t = i / kmax;
    const int j = static_cast<int>(i % kmax);
    const int64_t* m = p.seq + kSeqFields * static_cast<int64_t>(p.row_seq[t]);
    const int64_t visible = (p.row_pos[t] + 1) / ratio;
    const int64_t count = m[2] == 0 && m[6] == 0 ? (m[2] + m[3]) / ratio : visible;
    if (j == 0) counts[t] = static_cast<int32_t>(count);
    list[i] = j < count && j < visible ? j : -1;
}

// A thread per querying draft row: list r is sequence j's row i = B - R + r % R (the step's row j is the sequence
// at its last stored position).
__global__ void draft_keys_kernel(PagedSeqs p, PagedSection sec, int N, int B, int R, int W, bool chain,
                                  const uint8_t* block, int64_t entry_bytes, int maxk, const uint8_t** keys,
                                  int32_t* nkeys) {
    pdl_enter();
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= N * R) return;
    const int j = r / R, i = B - R + r % R;
    const int64_t* m = p.seq + kSeqFields * static_cast<int64_t>(j);
    const uint8_t** out = keys + static_cast<int64_t>(r) * maxk;
    int n = 0;
    for_each_draft_window_key(m[2], m[2] + 1 + i, W, m[5], chain, [&](int64_t at) {
        if (n < maxk) out[n] = paged_entry(p, sec, j, at);  // (maxk bounds n: the guards only keep writes in bounds)
        ++n;
    });
    for (int k = 0; k < (chain ? i + 1 : B); ++k, ++n)
        if (n < maxk) out[n] = block + static_cast<int64_t>(j * B + k) * entry_bytes;
    nkeys[r] = n < maxk ? n : maxk;
    for (; n < maxk; ++n) out[n] = nullptr;
}

// A thread per row of a decode-form step (DecodeRows).
__global__ void decode_rows_kernel(PagedSeqs p, int64_t T, int ratio, int64_t cap, int64_t carry_offset,
                                   int64_t snapshot_offset, const float* state_base, DecodeRows o) {
    pdl_enter();
    const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (t >= T) return;
    const int s = p.row_seq[t];
    const int64_t pos = p.row_pos[t];
    const int64_t* m = p.seq + kSeqFields * static_cast<int64_t>(s);
    o.width[t] = (pos + 1) / ratio;
    o.base[t] = s * cap;
    o.seq_base[t] = t * cap;
    o.rows[t] = static_cast<int32_t>(t);
    o.gpos[t] = pos / ratio * ratio;
    if (!o.meta) return;
    if (pos == m[2]) {  // the sequence's first row: its compressor fields, its tokens' snapshots and slots from here
        const int64_t carry = p.carry[s] + carry_offset;
        int64_t* mt = o.meta + 6 * static_cast<int64_t>(s);
        mt[0] = pos;
        mt[1] = m[3];
        mt[2] = t;
        mt[3] = t;
        const int64_t base = static_cast<int64_t>(reinterpret_cast<uintptr_t>(state_base));
        mt[4] = (carry - base) / static_cast<int64_t>(sizeof(float));
        mt[5] = t;
    }
    const int64_t step = p.row_step ? p.row_step[t] : 0;
    o.step[t] = step ? reinterpret_cast<float*>(static_cast<uintptr_t>(step + carry_offset)) : nullptr;
    float* snap = nullptr;
    if ((pos + 1) % p.page_tokens == 0) {
        uint8_t* pool = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(seq_table_base(m, kHistoryPages)));
        const int64_t page = p.pages[(m[1] + pos / p.page_tokens) * kPageTables + kHistoryPages];
        snap = reinterpret_cast<float*>(pool + page * p.page_bytes[kHistoryPages] + snapshot_offset + carry_offset);
    }
    o.snap[t] = snap;
}

// seq_entries_kernel over the sequences, each with up to max_entries entries.
void launch_seq_entries(const PagedSeqs& p, const PagedSection& sec, int ratio, int W, const int64_t* base,
                        int64_t max_entries, const uint8_t** table) {
    const dim3 grid(std::min<unsigned>(blocks_for(max_entries), 1u << 16), static_cast<unsigned>(p.n_seqs));
    launch_pdl(seq_entries_kernel, grid, dim3(kThreads), 0, p, sec, ratio, W, base, table);
}

}  // namespace

void paged_all_entries(const PagedSeqs& p, int ratio, int64_t T, int kmax, int32_t* list, int32_t* counts) {
    if (T * kmax == 0) return;
    launch_pdl(all_entries_kernel, dim3(blocks_for(T * kmax)), dim3(kThreads), 0, p, ratio, T, kmax, list, counts);
}

void paged_decode_rows(const PagedSeqs& p, int64_t T, int ratio, int64_t cap, int64_t carry_offset,
                       int64_t snapshot_offset, const float* state_base, const DecodeRows& out) {
    if (T == 0) return;
    if (ratio < 1 || (out.meta && !p.carry))
        cuda_fail(cudaErrorInvalidValue, "paged_decode_rows: bad ratio or no carries", __FILE__, __LINE__);
    launch_pdl(decode_rows_kernel, dim3(blocks_for(T)), dim3(kThreads), 0, p, T, ratio, cap, carry_offset,
               snapshot_offset, state_base, out);
}

void paged_entry_table(const PagedSeqs& p, const PagedSection& sec, int ratio, const int64_t* seq_base,
                       int64_t max_entries, const uint8_t** table) {
    if (p.n_seqs == 0 || max_entries <= 0) return;
    if (p.n_seqs > 65535 || ratio <= 0)
        cuda_fail(cudaErrorInvalidValue, "paged_entry_table: bad sequence count or ratio", __FILE__, __LINE__);
    launch_seq_entries(p, sec, ratio, 0, seq_base, max_entries, table);
}

void paged_window_table(const PagedSeqs& p, const PagedSection& sec, int64_t T, int W, bool ring_before_full,
                        const uint8_t** win, int32_t* nwin) {
    if (T * W == 0) return;
    launch_pdl(window_table_kernel, dim3(blocks_for(T * W)), dim3(kThreads), 0, p, sec, T, W, ring_before_full,
               nullptr, nullptr, int64_t{0}, win, nwin);
}

void paged_window_rows(const PagedSeqs& p, const PagedSection& sec, int W, const int64_t* row_base,
                       int64_t max_entries, const uint8_t** table) {
    if (p.n_seqs == 0 || max_entries <= 0) return;
    if (p.n_seqs > 65535 || W <= 0)
        cuda_fail(cudaErrorInvalidValue, "paged_window_rows: bad sequence count or window", __FILE__, __LINE__);
    launch_seq_entries(p, sec, 1, W, row_base, max_entries, table);
}

void paged_window_rows_table(const PagedSeqs& p, int64_t T, int W, bool ring_before_full, const int64_t* row_base,
                             const uint8_t* rows, int64_t row_bytes, const uint8_t** win, int32_t* nwin) {
    if (T * W == 0) return;
    launch_pdl(window_table_kernel, dim3(blocks_for(T * W)), dim3(kThreads), 0, p, PagedSection{}, T, W,
               ring_before_full, row_base, rows, row_bytes, win, nwin);
}

void paged_draft_keys(const PagedSeqs& p, const PagedSection& sec, int N, int B, int R, int W, bool chain,
                      const uint8_t* block, int64_t entry_bytes, int maxk, const uint8_t** keys, int32_t* nkeys) {
    if (N * R == 0) return;
    if (R < 1 || R > B)
        cuda_fail(cudaErrorInvalidValue, "paged_draft_keys: bad count of querying rows", __FILE__, __LINE__);
    launch_pdl(draft_keys_kernel, dim3(blocks_for(N * R)), dim3(kThreads), 0, p, sec, N, B, R, W, chain, block,
               entry_bytes, maxk, keys, nkeys);
}

}  // namespace peregrine::cuda
