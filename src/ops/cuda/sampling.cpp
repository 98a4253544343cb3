// CudaSampler: packs the rows' parameters and adjustments, runs the device sampler on logits that never leave the
// device, and reads back only the chosen ids (and logprobs when asked).
#include "ops/cuda/cuda_backend.h"
#include "util/switches.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/sampling_kernels.h"
#include "util/error.h"

#include <algorithm>
#include <chrono>

namespace peregrine::cuda {

bool CudaSampler::on_device() const {
    static const bool host = switch_is("PEREGRINE_SAMPLING", "host");
    return !host && vocab_ > 0 && vocab_ <= kSampleMaxVocab;
}

// Results of one sampler call: on the device (read by deferred ids) and copied into page-locked memory; or, where
// the rows were sampled on the host, the results themselves (their ids uploaded for deferred ids).
struct CudaSampler::Started {
    std::shared_ptr<void> d_out, d_top, h_out, h_top;
    std::vector<int> top_n;
    std::vector<SampleResult> host;
    bool on_host = false;
    cudaEvent_t done = nullptr;
    ~Started() {
        if (done) cudaEventDestroy(done);
    }
};

std::shared_ptr<CudaSampler::Started> CudaSampler::launch(const Tensor& logits, const std::vector<SampleRow>& rows) {
    auto s = std::make_shared<Started>();
    const int V = static_cast<int>(logits.dim(1));
    if (rows.empty() || logits.device() != Device::CUDA ||
        V > kSampleMaxVocab) {  // the host sampler (beyond the kernel's draw buffer)
        s->on_host = true;
        const Tensor host = logits.device() == Device::CUDA ? to_host(logits) : logits;
        s->host = sample_rows_host(host.f32(), V, rows);
        std::vector<SampleOutDev> out(rows.size());
        for (size_t i = 0; i < rows.size(); ++i) out[i] = {s->host[i].id, s->host[i].logprob};
        s->d_out = upload(out).keep;
        return s;
    }
    PEREGRINE_CHECK(logits.dtype() == DType::F32 && logits.ndim() == 2, "sample: logits must be f32 [rows, vocab]");
    const int64_t R = logits.dim(0);
    PEREGRINE_CHECK(V > 0 && R > 0, "sample: empty logits");
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
        s->top_n.push_back(std::min(d.top_n, V));
    }
    const int n = static_cast<int>(rows.size());
    auto d_rows = upload(dev);
    auto d_adj = upload(adj);
    const size_t out_bytes = sizeof(SampleOutDev) * static_cast<size_t>(n);
    const size_t top_bytes = sizeof(SampleOutDev) * (any_top ? static_cast<size_t>(n) * kSampleMaxTop : 1);
    s->d_out = device_alloc(out_bytes);
    s->d_top = device_alloc(top_bytes);
    sample_rows(logits.f32(), V, d_rows.ptr, n, d_adj.ptr, static_cast<SampleOutDev*>(s->d_out.get()),
                static_cast<SampleOutDev*>(s->d_top.get()));
    // The results' way back: async copies into page-locked memory, then an event to wait on.
    s->h_out = pinned_host_buffer(out_bytes);
    PG_CUDA(cudaMemcpyAsync(s->h_out.get(), s->d_out.get(), out_bytes, cudaMemcpyDeviceToHost, 0));
    if (any_top) {
        s->h_top = pinned_host_buffer(top_bytes);
        PG_CUDA(cudaMemcpyAsync(s->h_top.get(), s->d_top.get(), top_bytes, cudaMemcpyDeviceToHost, 0));
    }
    PG_CUDA(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
    PG_CUDA(cudaEventRecord(s->done, 0));
    return s;
}

std::vector<SampleResult> CudaSampler::collect(Started& s) {
    if (s.on_host) return std::move(s.host);
    const auto t0 = std::chrono::steady_clock::now();  // the step's one wait: for the ids (and logprobs)
    PG_CUDA(cudaEventSynchronize(s.done));
    be_.host_wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const auto* out = static_cast<const SampleOutDev*>(s.h_out.get());
    const auto* top = static_cast<const SampleOutDev*>(s.h_top.get());
    std::vector<SampleResult> res(s.top_n.size());
    for (size_t i = 0; i < res.size(); ++i) {
        res[i].id = out[i].id;
        res[i].logprob = out[i].logprob;
        for (int j = 0; j < s.top_n[i]; ++j) {
            const SampleOutDev& t = top[i * kSampleMaxTop + static_cast<size_t>(j)];
            res[i].top.push_back({t.id, t.logprob});
        }
    }
    return res;
}

std::vector<SampleResult> CudaSampler::sample(const Tensor& logits, const std::vector<SampleRow>& rows) {
    if (rows.empty()) return {};
    OpTimer op_(be_, "sample");
    return collect(*launch(logits, rows));
}

void CudaSampler::start(const Tensor& logits, const std::vector<SampleRow>& rows) {
    OpTimer op_(be_, "sample");
    deferred_source_ = launch(logits, rows);
    ++generation_;
    deferred_rows_ = static_cast<int>(rows.size());
    started_.push_back(deferred_source_);
}

std::vector<SampleResult> CudaSampler::finish() {
    PEREGRINE_CHECK(!started_.empty(), "sample finish without start");
    auto s = std::move(started_.front());
    started_.pop_front();
    return collect(*s);
}

void CudaSampler::discard() {
    for (auto& s : started_)
        if (s->done) cudaEventSynchronize(s->done);  // its copies into page-locked memory are done
    started_.clear();
    deferred_source_.reset();
    deferred_rows_ = 0;
}

int32_t CudaSampler::started_id(int) const {
    fail("the CUDA backend reads deferred ids on the device (takes_deferred_ids)");
}

void CudaSampler::resolve_deferred(int32_t* ids_d, const std::vector<int32_t>& ids) {
    bool any = false;
    for (int32_t id : ids)
        if (id < 0 && id != Backend::kNoToken) {
            PEREGRINE_CHECK(deferred_source_ && deferred_row(id) < deferred_rows_,
                            "deferred id of row {}: the latest sample start had {} rows", deferred_row(id),
                            deferred_rows_);
            any = true;
        }
    static_assert(sizeof(SampleOutDev) == 2 * sizeof(int32_t), "SampleOutDev is {id, logprob}: ids every second int32");
    if (any)
        resolve_deferred_ids(ids_d, static_cast<int64_t>(ids.size()),
                             static_cast<const int32_t*>(deferred_source_->d_out.get()), 2);
}

DevArray<int32_t> CudaBackend::upload_ids(const std::vector<int32_t>& ids) {
    // A step's ops take the same ids (embedding, then every MoE layer): uploaded and resolved once.
    if (ids_cache_.keep && ids == ids_cache_host_ && ids_cache_gen_ == sampler_.generation()) return ids_cache_;
    auto d = upload(ids);
    sampler_.resolve_deferred(d.ptr, ids);
    ids_cache_ = d;
    ids_cache_host_ = ids;
    ids_cache_gen_ = sampler_.generation();
    return d;
}

Tensor CudaSampler::rows_to_host(const Tensor& logits, const std::vector<int>& rows) {
    if (logits.device() != Device::CUDA) return HostSampler().rows_to_host(logits, rows);
    return to_host_pinned(be_.gather_rows(logits, rows), &be_.host_wait_ms_);
}

}  // namespace peregrine::cuda
