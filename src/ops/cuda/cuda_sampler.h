#pragma once
// The CUDA backend's sampler (sampling.cpp): logits stay on the device and only the chosen ids (and logprobs when
// asked) come back (PEREGRINE_SAMPLING=host: the logits are copied and sampled on the host, to A/B). In the
// overlapped schedule start() queues the sampler and the copy of its results into page-locked memory and returns;
// the backend's ops read deferred ids from the sampler's output on the device (resolve_deferred).
#include "ops/device_sampler.h"

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

namespace peregrine::cuda {

class CudaBackend;

class CudaSampler final : public DeviceSampler {
public:
    CudaSampler(CudaBackend& be, int vocab) : be_(be), vocab_(vocab) {}
    bool on_device() const override;
    std::vector<SampleResult> sample(const Tensor& logits, const std::vector<SampleRow>& rows) override;
    Tensor rows_to_host(const Tensor& logits, const std::vector<int>& rows) override;
    bool async() const override { return on_device(); }
    bool takes_deferred_ids() const override { return true; }
    void start(const Tensor& logits, const std::vector<SampleRow>& rows) override;
    std::vector<SampleResult> finish() override;
    void discard() override;
    int32_t started_id(int j) const override;

    // Replaces the deferred ids of `ids` (already uploaded to ids_d) by the latest start()'s samples, on the device.
    void resolve_deferred(int32_t* ids_d, const std::vector<int32_t>& ids);
    // start() calls so far (ids resolved before the latest one are stale).
    uint64_t generation() const { return generation_; }

private:
    // A sampler call: its results on the device (the deferred ids' source) and on their way to the host.
    struct Started;
    std::shared_ptr<Started> launch(const Tensor& logits, const std::vector<SampleRow>& rows);
    std::vector<SampleResult> collect(Started& s);

    CudaBackend& be_;
    int vocab_;
    std::deque<std::shared_ptr<Started>> started_;
    std::shared_ptr<Started> deferred_source_;  // the latest start()'s
    int deferred_rows_ = 0;
    uint64_t generation_ = 0;
};

}  // namespace peregrine::cuda
