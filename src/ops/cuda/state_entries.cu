// State entries in their packed formats (kv/entry_format.h): encoding rows of QDQ'd values into entries
// (exact: the same encode_entry_block as the CPU reference, one thread per scale block), decoding entries
// back to fp32, and making the benchmark's random pages valid entries.
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/entry_store.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/pdl.cuh"

namespace peregrine::cuda {

namespace {

__device__ unsigned long long g_encode_failures = 0;

constexpr int kEncodeThreads = 128;

__global__ void store_entries_kernel(const float* src, EntryFormat f, uint8_t* const* dst) {
    pdl_enter();
    const int64_t r = blockIdx.x;
    if (dst[r]) encode_entry_cta(f, src + r * f.dim, dst[r], &g_encode_failures);
}

__global__ void paged_store_entries_kernel(const float* src, EntryFormat f, PagedSeqs p, PagedSection sec, int ratio) {
    pdl_enter();
    const int64_t t = blockIdx.x, pos = p.row_pos[t];
    if ((pos + 1) % ratio != 0) return;
    encode_entry_cta(f, src + t * f.dim, paged_row_entry(p, sec, t, pos / ratio), &g_encode_failures);
}

__global__ void load_entries_kernel(const uint8_t* const* src, int64_t rows, EntryFormat f, float* out) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= rows * f.dim) return;
    const int64_t r = i / f.dim;
    const int c = static_cast<int>(i % f.dim);
    out[i] = src[r] ? entry_value(f, src[r], c) : 0.0f;
}

// Random bytes -> a valid entry: e4m3 codes lose their NaN pattern, scales land near 1 (ue8m0 2^-4..2^3,
// e4m3 0.5..0.94), bf16 values near 1 in magnitude.
__global__ void sanitize_kernel(uint8_t* pool, int64_t n_pages, int64_t page_bytes, int64_t offset, int per_page,
                                EntryFormat f) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n_pages * per_page) return;
    uint8_t* e = pool + (i / per_page) * page_bytes + offset + (i % per_page) * f.bytes;
    if (f.kind == kEntryFp8)
        for (int c = 0; c < f.quant_dims; ++c)
            if ((e[c] & 0x7f) == 0x7f) e[c] ^= 1;
    for (int c = f.quant_dims; c < f.dim && f.kind == kEntryFp8; ++c) {
        uint8_t* h = e + f.bf16_offset + 2 * (c - f.quant_dims);
        h[1] = static_cast<uint8_t>((h[1] & 0x80) | 0x3f);  // sign kept, exponent 2^-1..2^0
    }
    for (int b = 0; b < f.quant_dims / f.block; ++b) {
        uint8_t& s = e[f.scale_offset + b];
        s = f.kind == kEntryFp4E4m3 ? static_cast<uint8_t>(0x30 | (s & 15)) : static_cast<uint8_t>(123 + (s & 7));
    }
}

}  // namespace

void store_entries(const float* src, int64_t rows, const EntryFormat& f, uint8_t* const* dst) {
    if (rows == 0) return;
    if (rows > 0x7fffffff) cuda_fail(cudaErrorInvalidValue, "store_entries: too many rows", __FILE__, __LINE__);
    launch_pdl(store_entries_kernel, dim3(static_cast<unsigned>(rows)), dim3(kEncodeThreads), 0, src, f, dst);
}

void paged_store_entries(const float* src, int64_t T, const EntryFormat& f, const PagedSeqs& p,
                         const PagedSection& sec, int ratio) {
    if (T == 0) return;
    if (T > 0x7fffffff || ratio < 1)
        cuda_fail(cudaErrorInvalidValue, "paged_store_entries: too many rows or bad ratio", __FILE__, __LINE__);
    launch_pdl(paged_store_entries_kernel, dim3(static_cast<unsigned>(T)), dim3(kEncodeThreads), 0, src, f, p, sec,
               ratio);
}

void load_entries(const uint8_t* const* src, int64_t rows, const EntryFormat& f, float* out) {
    if (rows * f.dim == 0) return;
    launch_pdl(load_entries_kernel, dim3(blocks_for(rows * f.dim)), dim3(kThreads), 0, src, rows, f, out);
}

unsigned long long* state_encode_failure_counter() {
    static unsigned long long* counter = [] {
        void* p = nullptr;
        PG_CUDA(cudaGetSymbolAddress(&p, g_encode_failures));
        return static_cast<unsigned long long*>(p);
    }();
    return counter;
}

uint64_t state_encode_failures() {
    unsigned long long n = 0, zero = 0;
    PG_CUDA(cudaMemcpyFromSymbol(&n, g_encode_failures, sizeof(n)));
    PG_CUDA(cudaMemcpyToSymbol(g_encode_failures, &zero, sizeof(zero)));
    return n;
}

void sanitize_entries(uint8_t* pool, int64_t n_pages, int64_t page_bytes, int64_t offset, int per_page,
                      const EntryFormat& f) {
    if (n_pages * per_page == 0) return;
    launch_pdl(sanitize_kernel, dim3(blocks_for(n_pages * per_page)), dim3(kThreads), 0, pool, n_pages, page_bytes,
               offset, per_page, f);
}

}  // namespace peregrine::cuda
