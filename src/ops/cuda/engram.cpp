// Engram on the GPU: the fp8 table rows are read either from device memory or, with the host placement,
// straight from pinned host memory mapped into the device's address space (the table never moves).
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_check.h"
#include "util/error.h"

#include <cuda_runtime.h>

#include <cstring>

namespace peregrine::cuda {

const float* CudaBackend::engram_weight(const EngramWeight& w) {
    auto it = engram_w_.find(w.q_weight.raw());
    if (it != engram_w_.end()) return static_cast<const float*>(it->second.get());
    const int64_t n = w.q_weight.numel();
    std::vector<float> v(static_cast<size_t>(n));
    auto at = [](const Tensor& t, int64_t i) {
        return t.dtype() == DType::BF16 ? bf16_to_f32(t.data<uint16_t>()[i]) : t.data<float>()[i];
    };
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = at(w.q_weight, i) * at(w.k_weight, i);
    return static_cast<const float*>(engram_w_.emplace(w.q_weight.raw(), upload(v).keep).first->second.get());
}

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
    engram_hash_rows(win.ptr, T, hash.max_ngram, hash.n_heads, dev_i32(*hash.token_map),
                     static_cast<int64_t>(hash.token_map->size()), hash.pad,
                     dev_i64(hash.multipliers, static_cast<size_t>(hash.max_ngram)),
                     dev_i64(hash.primes, static_cast<size_t>(nc)), dev_i64(hash.offsets, static_cast<size_t>(nc)),
                     static_cast<int64_t*>(rows.get()));
    engram_rows_d(h, w, static_cast<const int64_t*>(rows.get()));
}

const int64_t* CudaBackend::dev_i64(const int64_t* host, size_t n) {
    auto it = tables_.find(host);
    if (it == tables_.end()) it = tables_.emplace(host, upload(std::vector<int64_t>(host, host + n)).keep).first;
    return static_cast<const int64_t*>(it->second.get());
}

const int32_t* CudaBackend::dev_i32(const std::vector<int32_t>& host) {
    auto it = tables_.find(host.data());
    if (it == tables_.end()) it = tables_.emplace(host.data(), upload(host).keep).first;
    return static_cast<const int32_t*>(it->second.get());
}

void CudaBackend::engram_rows_d(Tensor& h, const EngramWeight& w, const int64_t* rows_d) {
    const int64_t T = h.dim(0), hd = w.head_dim, ncol = w.n_cols;
    const uint8_t* table;
    const uint8_t* scale;
    if (engram_placement_ == EngramPlacement::Host) {
        auto it = raw_.find(w.table.raw());
        if (it == raw_.end()) {
            // Pinned, mapped host copies of the table and its scales; the GPU reads them over the bus.
            for (const Tensor* t : {&w.table, &w.table_scale}) {
                void* p = nullptr;
                PG_CUDA(cudaHostAlloc(&p, t->nbytes(), cudaHostAllocMapped));
                std::memcpy(p, t->raw(), t->nbytes());
                pinned_.push_back(p);
                void* dp = nullptr;
                PG_CUDA(cudaHostGetDevicePointer(&dp, p, 0));
                raw_.emplace(t->raw(), std::shared_ptr<void>(dp, [](void*) {}));
            }
        }
        table = static_cast<const uint8_t*>(raw_.at(w.table.raw()).get());
        scale = static_cast<const uint8_t*>(raw_.at(w.table_scale.raw()).get());
    } else {
        table = static_cast<const uint8_t*>(dev_raw(w.table));
        scale = static_cast<const uint8_t*>(dev_raw(w.table_scale));
    }
    Tensor emb = empty(DType::F32, {T, ncol * hd});
    engram_gather(table, scale, rows_d, T * ncol, static_cast<int>(hd), emb.f32());
    Tensor kv = run_linear(emb, w.wkv);
    engram_gate(h.f32(), kv.f32(), engram_weight(w), T, cfg_.hc_mult, cfg_.dim, eps());
}

}  // namespace peregrine::cuda
