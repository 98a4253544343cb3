#include "ops/cuda/weight_cache.h"
#include "ops/attention_plan.h"
#include "ops/cuda/device_memory.h"
#include "ops/cuda/launch_check.h"
#include "util/error.h"

#include <cuda_runtime.h>

#include <cstring>

namespace peregrine::cuda {

const void* WeightCache::raw(const Tensor& t) {
    if (t.device() == Device::CUDA) return t.raw();
    auto it = raw_.find(t.raw());
    if (it != raw_.end()) return it->second.get();
    auto keep = device_alloc(t.nbytes());
    upload_weight(keep.get(), t.raw(), t.nbytes());
    return raw_.emplace(t.raw(), keep).first->second.get();
}

const float* WeightCache::f32(const Tensor& t) {
    auto it = f32_.find(t.raw());
    if (it != f32_.end()) return static_cast<const float*>(it->second.get());
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
        switch (t.dtype()) {
            case DType::F32: v[i] = t.data<float>()[i]; break;
            case DType::BF16: v[i] = bf16_to_f32(t.data<uint16_t>()[i]); break;
            default: fail("unsupported parameter dtype {}", dtype_name(t.dtype()));
        }
    }
    auto a = upload(v);
    return static_cast<const float*>(f32_.emplace(t.raw(), a.keep).first->second.get());
}

const int64_t* WeightCache::i64(const int64_t* host, size_t n) {
    auto it = tables_.find(host);
    if (it == tables_.end()) it = tables_.emplace(host, upload(std::vector<int64_t>(host, host + n)).keep).first;
    return static_cast<const int64_t*>(it->second.get());
}

const int32_t* WeightCache::i32(const std::vector<int32_t>& host) {
    auto it = tables_.find(host.data());
    if (it == tables_.end()) it = tables_.emplace(host.data(), upload(host).keep).first;
    return static_cast<const int32_t*>(it->second.get());
}

LinearDev WeightCache::linear(const LinearWeight& w) {
    LinearDev d;
    d.kind = static_cast<int>(w.kind);
    d.out = w.out;
    d.in = w.in;
    d.weight_block = w.weight_block;
    d.act_block = w.act_block;
    d.w_bf16 = w.w.dtype() == DType::BF16;
    d.w = raw(w.w);
    d.scale = w.scale.empty() ? nullptr : static_cast<const uint8_t*>(raw(w.scale));
    return d;
}

const ExpertTables& WeightCache::experts(const MoEWeight& w) {
    // Experts this rank does not hold (expert parallelism) are empty: null pointers, never routed to here.
    const ExpertWeight* first = nullptr;
    for (const ExpertWeight& x : w.experts)
        if (!x.w1.empty()) {
            first = &x;
            break;
        }
    PEREGRINE_CHECK(first != nullptr, "a MoE layer holds no expert");
    const void* key = first->w1.w.raw();
    auto it = experts_.find(key);
    if (it != experts_.end()) return it->second;
    const size_t E = w.experts.size();
    std::vector<const void*> ptrs(6 * E, nullptr);
    for (size_t e = 0; e < E; ++e) {
        const ExpertWeight& x = w.experts[e];
        if (x.w1.empty()) continue;
        for (const LinearWeight* l : {&x.w1, &x.w2, &x.w3})
            PEREGRINE_CHECK(l->kind == first->w1.kind && l->in == (l == &x.w2 ? first->w2.in : first->w1.in),
                            "experts of one layer must share formats and shapes");
        ptrs[e] = raw(x.w1.w);
        ptrs[E + e] = x.w1.scale.empty() ? nullptr : raw(x.w1.scale);
        ptrs[2 * E + e] = raw(x.w2.w);
        ptrs[3 * E + e] = x.w2.scale.empty() ? nullptr : raw(x.w2.scale);
        ptrs[4 * E + e] = raw(x.w3.w);
        ptrs[5 * E + e] = x.w3.scale.empty() ? nullptr : raw(x.w3.scale);
    }
    auto d = upload(ptrs);
    auto p = reinterpret_cast<const void* const*>(d.ptr);
    ExpertTables t;
    t.keep = d.keep;
    t.first = first;
    t.aligned16 = true;
    for (const void* q : ptrs) t.aligned16 = t.aligned16 && reinterpret_cast<uintptr_t>(q) % 16 == 0;
    t.w1 = {p, reinterpret_cast<const uint8_t* const*>(p + E)};
    t.w2 = {p + 2 * E, reinterpret_cast<const uint8_t* const*>(p + 3 * E)};
    t.w3 = {p + 4 * E, reinterpret_cast<const uint8_t* const*>(p + 5 * E)};
    return experts_.emplace(key, t).first->second;
}

const float* WeightCache::rope(const AttentionLayerInfo& info) {
    auto key = std::make_pair(info.rope_theta, info.yarn);
    auto it = ropes_.find(key);
    if (it == ropes_.end()) {
        auto f = rope_frequencies(cfg_.rope_head_dim, info.rope_theta, info.yarn ? cfg_.original_seq_len : 0,
                                  cfg_.rope_factor, cfg_.beta_fast, cfg_.beta_slow, format_.yarn_ramp);
        it = ropes_.emplace(key, upload(f).keep).first;
    }
    return static_cast<const float*>(it->second.get());
}

std::pair<const uint8_t*, const uint8_t*> WeightCache::engram_table(const EngramWeight& w) {
    if (engram_ == EngramPlacement::Host) {
        for (const Tensor* t : {&w.table, &w.table_scale})
            if (!raw_.count(t->raw()))
                raw_.emplace(t->raw(), std::const_pointer_cast<void>(pin_host_memory(t->raw(), t->nbytes())));
        return {static_cast<const uint8_t*>(raw_.at(w.table.raw()).get()),
                static_cast<const uint8_t*>(raw_.at(w.table_scale.raw()).get())};
    }
    return {static_cast<const uint8_t*>(raw(w.table)), static_cast<const uint8_t*>(raw(w.table_scale))};
}

const float* WeightCache::engram_gate(const EngramWeight& w) {
    auto it = engram_gate_.find(w.q_weight.raw());
    if (it != engram_gate_.end()) return static_cast<const float*>(it->second.get());
    const int64_t n = w.q_weight.numel();
    std::vector<float> v(static_cast<size_t>(n));
    auto at = [](const Tensor& t, int64_t i) {
        return t.dtype() == DType::BF16 ? bf16_to_f32(t.data<uint16_t>()[i]) : t.data<float>()[i];
    };
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = at(w.q_weight, i) * at(w.k_weight, i);
    return static_cast<const float*>(engram_gate_.emplace(w.q_weight.raw(), upload(v).keep).first->second.get());
}

const void* const* WeightCache::group_table(const uint16_t* w, int G, int R, int GD) {
    auto& table = groups_[w];
    if (!table) {
        std::vector<const void*> ptrs(static_cast<size_t>(2 * G), nullptr);
        for (int g = 0; g < G; ++g) ptrs[static_cast<size_t>(g)] = w + static_cast<size_t>(g) * R * GD;
        table = upload(ptrs).keep;
    }
    return static_cast<const void* const*>(table.get());
}

}  // namespace peregrine::cuda
