#pragma once
// Encoding a row of QDQ'd values into its packed state entry (kv/entry_format.h) by a CTA, and a paged row's entry
// address: state_entries.cu's stores, shared with the kernels that store the rows they make (norm_hc.cu's
// rms_norm_rope_qdq with a PagedRowStore).
#include "ops/cuda/kernels.h"

#include <cstdint>

namespace peregrine::cuda {

constexpr int kMaxEntryDim = 1024, kMaxEntryBlocks = 128;

// One CTA per entry, with encode_entry's bytes: the values staged in shared memory; e4m3 and ue8m0-scaled e2m1
// codes a byte per thread (each block's scale first, a thread per block; encode_entry_block's helpers);
// e2m1 under e4m3 scales (a search over the scales of each block) a thread per block. Then the bf16 tail and the
// padding. (A thread per block reading global memory took ~10 us an entry.)
__device__ inline void encode_entry_cta(const EntryFormat& f, const float* x, uint8_t* e,
                                        unsigned long long* failures) {
    __shared__ float xs[kMaxEntryDim];
    __shared__ int ks[kMaxEntryBlocks];
    const int nblocks = f.quant_dims / f.block, tid = threadIdx.x;
    const bool staged = f.dim <= kMaxEntryDim && nblocks <= kMaxEntryBlocks;  // uniform
    if (staged) {
        for (int c = tid; c < f.dim; c += blockDim.x) xs[c] = x[c];
        __syncthreads();
        x = xs;
    }
    bool ok = true;
    if (!staged || f.kind == kEntryFp4E4m3) {
        for (int b = tid; b < nblocks; b += blockDim.x) ok = encode_entry_block(f, x, b * f.block, e) && ok;
    } else {
        const bool fp8 = f.kind == kEntryFp8;
        for (int b = tid; b < nblocks; b += blockDim.x) {
            ks[b] = entry_scale_exp(fp8, entry_block_amax(f, x, b * f.block));
            e[f.scale_offset + b] = static_cast<uint8_t>(ks[b] + 127);
        }
        __syncthreads();
        // Value c under its block's scale: encode_entry_block's code and check.
        auto code_of = [&](int c, uint8_t& code) { return encode_entry_code(fp8, x[c], ks[c / f.block], &code); };
        if (fp8) {
            for (int c = tid; c < f.quant_dims; c += blockDim.x) {
                uint8_t code;
                ok = code_of(c, code) && ok;
                e[c] = code;
            }
        } else {  // two values a byte, the even one in the low nibble (a block never splits a byte: blocks are even)
            for (int i = tid; i < f.quant_dims / 2; i += blockDim.x) {
                uint8_t lo, hi;
                ok = code_of(2 * i, lo) && ok;
                ok = code_of(2 * i + 1, hi) && ok;
                e[i] = static_cast<uint8_t>((lo & 15) | (hi << 4));
            }
        }
    }
    if (f.kind == kEntryFp8)
        for (int c = f.quant_dims + tid; c < f.dim; c += blockDim.x) ok = encode_entry_bf16(f, x, c, e) && ok;
    const int used = f.scale_offset + nblocks;
    for (int i = used + tid; i < f.bytes; i += blockDim.x) e[i] = 0;
    if (!ok) atomicAdd(failures, 1ull);
}

// The entry of row t of a paged step in section `sec` at entry index `index` (its position over the section's
// ratio): the sequence's table base plus the entry's offset in its pages.
__device__ inline uint8_t* paged_row_entry(const PagedSeqs& p, const PagedSection& sec, int64_t t, int64_t index) {
    const int64_t* m = p.seq + kSeqFields * static_cast<int64_t>(p.row_seq[t]);
    uint8_t* base = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(seq_table_base(m, sec.table)));
    return base + paged_entry_offset(p.pages + m[1] * kPageTables, p.page_tokens, p.page_bytes[sec.table], sec, index);
}

}  // namespace peregrine::cuda
