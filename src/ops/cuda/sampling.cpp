// CudaBackend::sample: packs the rows' parameters and adjustments, runs the device sampler on logits that
// never leave the device, and reads back only the chosen ids (and logprobs when asked).
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/sampling_kernels.h"
#include "util/error.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace peregrine::cuda {

bool CudaBackend::samples_on_device() const {
    static const bool host = [] {
        const char* v = std::getenv("PEREGRINE_SAMPLING");
        return v && std::strcmp(v, "host") == 0;
    }();
    return !host && cfg_.vocab_size > 0 && cfg_.vocab_size <= kSampleMaxVocab;
}

std::vector<SampleResult> CudaBackend::sample(const Tensor& logits, const std::vector<SampleRow>& rows) {
    if (rows.empty()) return {};
    if (logits.device() != Device::CUDA) return Backend::sample(logits, rows);
    OpTimer op_(*this, "sample");
    PEREGRINE_CHECK(logits.dtype() == DType::F32 && logits.ndim() == 2, "sample: logits must be f32 [rows, vocab]");
    const int64_t R = logits.dim(0);
    const int V = static_cast<int>(logits.dim(1));
    PEREGRINE_CHECK(V > 0 && R > 0, "sample: empty logits");
    if (V > kSampleMaxVocab) return Backend::sample(to_host(logits), rows);  // beyond the kernel's draw buffer
    std::vector<SampleRowDev> dev(rows.size());
    std::vector<LogitAdjust> adj;
    std::vector<char> used(static_cast<size_t>(R), 0);
    bool any_top = false;
    for (size_t i = 0; i < rows.size(); ++i) {
        const SampleRow& r = rows[i];
        PEREGRINE_CHECK(r.row >= 0 && r.row < R, "sample: logits row {} out of range", r.row);
        PEREGRINE_CHECK(!used[static_cast<size_t>(r.row)], "sample: logits row {} sampled twice", r.row);
        used[static_cast<size_t>(r.row)] = 1;
        SampleRowDev& d = dev[i];
        d.row = r.row;
        d.seed = r.seed;
        d.index = r.index;
        d.inv_t = r.config.inv_t;
        d.top_p = r.config.top_p;
        d.min_p_weight = r.config.min_p_weight;
        d.top_k = r.config.top_k;
        d.top_n = r.logprobs ? std::clamp(r.top_logprobs, 0, std::min(kMaxTopLogprobs, kSampleMaxTop)) : -1;
        any_top = any_top || d.top_n > 0;
        d.adj_begin = static_cast<int>(adj.size());
        d.adj_count = static_cast<int>(r.adjust.size());
        d.pen = r.penalties;
        adj.insert(adj.end(), r.adjust.begin(), r.adjust.end());
    }
    const int n = static_cast<int>(rows.size());
    auto d_rows = upload(dev);
    auto d_adj = upload(adj);
    auto d_out = device_alloc(sizeof(SampleOutDev) * static_cast<size_t>(n));
    const size_t top_elems = any_top ? static_cast<size_t>(n) * kSampleMaxTop : 1;
    auto d_top = device_alloc(sizeof(SampleOutDev) * top_elems);
    auto* out = static_cast<SampleOutDev*>(d_out.get());
    auto* top = static_cast<SampleOutDev*>(d_top.get());
    sample_rows(logits.f32(), V, d_rows.ptr, n, d_adj.ptr, out, top);

    // The step's one wait: for the ids (and logprobs).
    std::vector<SampleOutDev> h_out(static_cast<size_t>(n)), h_top(any_top ? top_elems : 0);
    PG_CUDA(cudaMemcpyAsync(h_out.data(), out, sizeof(SampleOutDev) * h_out.size(), cudaMemcpyDeviceToHost, 0));
    if (any_top) PG_CUDA(cudaMemcpyAsync(h_top.data(), top, sizeof(SampleOutDev) * top_elems, cudaMemcpyDeviceToHost, 0));
    const auto t0 = std::chrono::steady_clock::now();
    PG_CUDA(cudaStreamSynchronize(0));
    host_wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::vector<SampleResult> res(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
        res[i].id = h_out[i].id;
        res[i].logprob = h_out[i].logprob;
        for (int j = 0; j < std::min(dev[i].top_n, V); ++j) {
            const SampleOutDev& t = h_top[i * kSampleMaxTop + static_cast<size_t>(j)];
            res[i].top.push_back({t.id, t.logprob});
        }
    }
    return res;
}

Tensor CudaBackend::logits_to_host(const Tensor& logits, const std::vector<int>& rows) {
    if (logits.device() != Device::CUDA) return Backend::logits_to_host(logits, rows);
    return to_host_pinned(gather_rows(logits, rows), &host_wait_ms_);
}

}  // namespace peregrine::cuda
