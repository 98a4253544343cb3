#include "ops/device_sampler.h"

#include <cstring>

namespace peregrine {

std::vector<SampleResult> HostSampler::sample(const Tensor& logits, const std::vector<SampleRow>& rows) {
    return sample_rows_host(logits.f32(), static_cast<int>(logits.dim(1)), rows);
}

Tensor HostSampler::rows_to_host(const Tensor& logits, const std::vector<int>& rows) {
    const int64_t V = logits.dim(1);
    Tensor out = Tensor::zeros(DType::F32, {static_cast<int64_t>(rows.size()), V});
    for (size_t i = 0; i < rows.size(); ++i)
        std::memcpy(out.f32() + static_cast<int64_t>(i) * V, logits.f32() + rows[i] * V,
                    sizeof(float) * static_cast<size_t>(V));
    return out;
}

void HostSampler::start(const Tensor& logits, const std::vector<SampleRow>& rows) {
    started_.push_back(sample(logits, rows));
    started_ids_.clear();
    for (const SampleResult& r : started_.back()) started_ids_.push_back(r.id);
}

std::vector<SampleResult> HostSampler::finish() {
    PEREGRINE_CHECK(!started_.empty(), "sample finish without start");
    std::vector<SampleResult> r = std::move(started_.front());
    started_.pop_front();
    return r;
}

void HostSampler::discard() {
    started_.clear();
    started_ids_.clear();
}

int32_t HostSampler::started_id(int j) const {
    PEREGRINE_CHECK(j >= 0 && j < static_cast<int>(started_ids_.size()),
                    "deferred id of row {}: the last sample start had {} rows", j, started_ids_.size());
    return started_ids_[static_cast<size_t>(j)];
}

}  // namespace peregrine
