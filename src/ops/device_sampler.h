#pragma once
// A backend's sampler: the tokens of logits rows where the backend computed them (the CPU backend's in host memory,
// the CUDA backend's on the device, where only the chosen ids and logprobs come back), and the overlapped
// schedule's asynchronous form.
#include "ops/sampling.h"
#include "tensor/tensor.h"
#include "util/error.h"

#include <cstdint>
#include <deque>
#include <vector>

namespace peregrine {

class DeviceSampler {
public:
    virtual ~DeviceSampler() = default;

    // Whether Backend::logits(..., to_host = false) leaves the logits on the device and sample() runs there.
    virtual bool on_device() const = 0;
    // The tokens of `rows` (adjustments, penalties, truncation, seeded draw, logprobs: ops/sampling.h) from logits
    // as Backend::logits returned them.
    virtual std::vector<SampleResult> sample(const Tensor& logits, const std::vector<SampleRow>& rows) = 0;
    // Rows `rows` of such logits in host memory [rows.size(), vocab].
    virtual Tensor rows_to_host(const Tensor& logits, const std::vector<int>& rows) = 0;

    // The overlapped schedule. start() starts sample() and, where async(), returns before the ids exist; finish()
    // returns the results of the oldest unfinished call; discard() drops every started call (after a failed step),
    // once the device is done with them. Until the next start(), a step may name row j of the latest call as the
    // token id deferred_id(j): where takes_deferred_ids(), the backend's ops read it where it is (the CUDA backend:
    // on the device); otherwise the model replaces it with started_id(j) first.
    static constexpr int32_t deferred_id(int j) { return -1 - j; }
    static constexpr int deferred_row(int32_t id) { return -1 - id; }
    virtual bool async() const = 0;
    virtual bool takes_deferred_ids() const = 0;
    virtual void start(const Tensor& logits, const std::vector<SampleRow>& rows) = 0;
    virtual std::vector<SampleResult> finish() = 0;
    virtual void discard() = 0;
    virtual int32_t started_id(int j) const = 0;
};

// Sampling logits in host memory, one call at a time (start() samples at once).
class HostSampler final : public DeviceSampler {
public:
    bool on_device() const override { return false; }
    std::vector<SampleResult> sample(const Tensor& logits, const std::vector<SampleRow>& rows) override;
    Tensor rows_to_host(const Tensor& logits, const std::vector<int>& rows) override;
    bool async() const override { return false; }
    bool takes_deferred_ids() const override { return false; }
    void start(const Tensor& logits, const std::vector<SampleRow>& rows) override;
    std::vector<SampleResult> finish() override;
    void discard() override;
    int32_t started_id(int j) const override;

private:
    std::deque<std::vector<SampleResult>> started_;  // results not yet finished
    std::vector<int32_t> started_ids_;               // the latest call's ids
};

}  // namespace peregrine
