#include "engine/memory_plan.h"
#include "engine/sequence_runner.h"
#include "ops/diagnostics.h"
#include "util/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace peregrine {

namespace {

std::string gib(size_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1u << 30)); }

}  // namespace

std::string DeviceMemoryPlan::describe() const {
    return fmt::format("{} {}: weights {}, activations {} (a {}-token step), state pages {} "
                       "(--mem-fraction-static {}), {} left; warm-up {:.1f} s",
                       device, gib(total), gib(weights), gib(activations), chunk_tokens, gib(state), fraction,
                       gib(left), warmup_s);
}

DeviceMemoryPlan plan_device_memory(const std::vector<Model*>& ranks, double fraction, int chunk_tokens) {
    PEREGRINE_CHECK(!ranks.empty(), "no model to plan for");
    DeviceMemoryPlan plan;
    plan.fraction = fraction;
    plan.chunk_tokens = chunk_tokens;
    plan.state = SIZE_MAX;
    plan.left = SIZE_MAX;
    const auto t0 = std::chrono::steady_clock::now();
    for (Model* m : ranks) {
        Diagnostics* d = m->backend().diagnostics();
        PEREGRINE_CHECK(d != nullptr, "--mem-fraction-static plans a GPU's memory; the {} backend has none",
                        m->backend().name());
        m->backend().bind_thread();
        d->memory_use(true);
        try {
            // The largest step a server runs, then a decode step (some weights take another form there): every
            // weight goes to the device on first use, activations peak.
            SequenceRunner warm(*m, chunk_tokens + 1);
            std::vector<int32_t> ids(static_cast<size_t>(chunk_tokens));
            for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % m->config().vocab_size);
            warm.feed(ids, chunk_tokens);
            warm.feed({ids[0]}, 1);
        } catch (const Error& e) {
            const Diagnostics::MemoryUse u = d->memory_use(false);
            fail("the warm-up step of {} tokens failed on {} with {} of weights and activations in use of {} ({}): "
                 "lower --chunked-prefill-size, or the model does not fit",
                 chunk_tokens, d->device_name(), gib(u.used_peak), gib(u.total), e.what());
        }
        const Diagnostics::MemoryUse u = d->memory_use(false);
        plan.device = d->device_name();
        plan.total = u.total;
        plan.weights = std::max(plan.weights, u.used_now);
        plan.activations = std::max(plan.activations, u.used_peak - u.used_now);
        const double budget = fraction * static_cast<double>(u.total);
        if (budget <= static_cast<double>(u.used_now))
            fail("the model does not fit on {}: its weights and tables take {}, more than --mem-fraction-static {} "
                 "of the device's {} ({})",
                 plan.device, gib(u.used_now), fraction, gib(u.total), gib(static_cast<size_t>(budget)));
        const size_t state = static_cast<size_t>(budget) - u.used_now;
        const size_t free = d->free_memory();
        plan.state = std::min(plan.state, state);
        plan.left = std::min(plan.left, free > state ? free - state : 0);
    }
    plan.warmup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (plan.left < plan.activations)
        fail("{} of state pages (--mem-fraction-static {}) would leave {} on {}, less than the {} a {}-token step "
             "needs: lower --mem-fraction-static or --chunked-prefill-size",
             gib(plan.state), fraction, gib(plan.left), plan.device, gib(plan.activations), chunk_tokens);
    return plan;
}

}  // namespace peregrine
