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

// Decode steps at every batch size in `sizes`, twice each (the second captures the step's graphs), over sequences
// of a few tokens: no request waits for a capture, and the graphs' memory is taken before the state pages.
void capture_decode_graphs(Model& m, const std::vector<int>& sizes) {
    if (sizes.empty() || m.expert_parallel()) return;  // expert-parallel ranks step together: captured in service
    const int most = *std::max_element(sizes.begin(), sizes.end());
    const int64_t tokens = 2 * static_cast<int64_t>(sizes.size()) + 2;
    PagePool pool(m.backend().state_memory(), m.layout(), most * m.layout().pages_for(tokens));
    std::vector<SeqState> seqs(static_cast<size_t>(most));
    ForwardBatch first;
    for (int i = 0; i < most; ++i) {
        SeqState& s = seqs[static_cast<size_t>(i)];
        pool.init(s);
        PEREGRINE_CHECK(pool.reserve(s, tokens), "graph warm-up: no state pages");
        first.seqs.push_back({&s, 0, 1, i});
        first.token_ids.push_back(i % m.config().vocab_size);
    }
    first.mode = BatchMode::prefill;
    m.forward(first, {});
    for (int T : sizes)
        for (int rep = 0; rep < 2; ++rep) {
            ForwardBatch d;
            std::vector<int> rows;
            for (int i = 0; i < T; ++i) {
                SeqState& s = seqs[static_cast<size_t>(i)];
                d.seqs.push_back({&s, s.n_cached, 1, i});
                d.token_ids.push_back((i + 1) % m.config().vocab_size);
                rows.push_back(i);
            }
            d.mode = BatchMode::decode;
            m.forward(d, rows);
        }
    for (SeqState& s : seqs) pool.release(s);
}

}  // namespace

std::string DeviceMemoryPlan::describe() const {
    std::string s = fmt::format("{} {}: weights {}, activations {} (a {}-token step), CUDA graphs {}, state pages {} "
                                "(--mem-fraction-static {}), {} left; warm-up {:.1f} s",
                                device, gib(total), gib(weights), gib(activations), chunk_tokens, gib(graphs),
                                gib(state), fraction, gib(left), warmup_s);
    if (in_use == 0) return s;
    // What the device shows in use (nvidia-smi), item by item: the rest is the CUDA context and the libraries'
    // workspaces.
    const size_t known = weights + graphs + state_allocated + pool_kept;
    return s + fmt::format("; in use at ready {} = weights + graphs + state pages {} + freed activations kept {} + "
                           "CUDA context and libraries {}",
                           gib(in_use), gib(state_allocated), gib(pool_kept), gib(in_use > known ? in_use - known : 0));
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
            capture_decode_graphs(*m, d->graph_batch_sizes());
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
        plan.graphs = std::max(plan.graphs, d->graph_memory_bytes());
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
