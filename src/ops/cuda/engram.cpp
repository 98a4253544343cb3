// Engram on the GPU: the fp8 table rows are read either from device memory or, with the host placement,
// straight from pinned host memory mapped into the device's address space (the table never moves).
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_check.h"
#include "util/error.h"

#include <cuda_runtime.h>

#include <cstring>

namespace peregrine::cuda {

void CudaBackend::engram(Tensor& h, const EngramWeight& w, const std::vector<int64_t>& rows) {
    OpTimer op_(*this, "engram");
    auto rows_d = upload(rows);
    engram_rows_d(h, w, rows_d.ptr);
}

void CudaBackend::engram_hashed(Tensor& h, const EngramWeight& w, const EngramHash& hash,
                                const std::vector<int32_t>& windows) {
    OpTimer op_(*this, "engram");
    const int64_t T = h.dim(0), nc = static_cast<int64_t>(hash.max_ngram - 1) * hash.n_heads;
    PEREGRINE_CHECK(nc == w.n_cols && static_cast<int64_t>(windows.size()) == T * hash.max_ngram,
                    "engram: {} windows of {} tokens for {} rows of {} columns", windows.size(), hash.max_ngram, T,
                    w.n_cols);
    for (int32_t id : windows)
        PEREGRINE_CHECK(id < 0 || id < static_cast<int64_t>(hash.token_map->size()),
                        "engram: token id {} has no compressed id", id);
    auto win = upload(windows);
    sampler_.resolve_deferred(win.ptr, windows);
    auto rows = device_alloc(sizeof(int64_t) * static_cast<size_t>(T * nc));
    engram_hash_rows(win.ptr, T, hash.max_ngram, hash.n_heads, weights_.i32(*hash.token_map),
                     static_cast<int64_t>(hash.token_map->size()), hash.pad,
                     weights_.i64(hash.multipliers, static_cast<size_t>(hash.max_ngram)),
                     weights_.i64(hash.primes, static_cast<size_t>(nc)), weights_.i64(hash.offsets, static_cast<size_t>(nc)),
                     static_cast<int64_t*>(rows.get()));
    engram_rows_d(h, w, static_cast<const int64_t*>(rows.get()));
}

void CudaBackend::engram_rows_d(Tensor& h, const EngramWeight& w, const int64_t* rows_d) {
    const int64_t T = h.dim(0), hd = w.head_dim, ncol = w.n_cols;
    const auto [table, scale] = weights_.engram_table(w);
    Tensor emb = empty(DType::F32, {T, ncol * hd});
    engram_gather(table, scale, rows_d, T * ncol, static_cast<int>(hd), emb.f32());
    Tensor kv = linear_.run(emb, w.wkv);
    engram_gate(h.f32(), kv.f32(), weights_.engram_gate(w), T, cfg_.hc_mult, cfg_.dim, eps());
}

}  // namespace peregrine::cuda
