#include "model/synthetic_checkpoint.h"
#include "io/safetensors_writer.h"
#include "model/variant.h"
#include "util/error.h"
#include "util/file.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace peregrine {

SyntheticCheckpointPlan plan_synthetic_checkpoint(const ModelConfig& cfg, uint64_t seed, size_t shard_bytes) {
    PEREGRINE_CHECK(shard_bytes > 0, "the shard size must be positive");
    SyntheticCheckpointPlan plan;
    for (SyntheticTensor& t : synthetic_inventory(cfg, seed)) {
        const size_t n = t.nbytes();
        if (plan.shards.empty() || (plan.shards.back().bytes > 0 && plan.shards.back().bytes + n > shard_bytes))
            plan.shards.emplace_back();
        plan.shards.back().bytes += n;
        plan.shards.back().tensors.push_back(std::move(t));
        plan.total_bytes += n;
        ++plan.n_tensors;
    }
    const size_t n = plan.shards.size();
    for (size_t i = 0; i < n; ++i) {
        auto& s = plan.shards[i];
        s.file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
        // Widest elements first, as the safetensors library lays files out: every tensor starts aligned to its
        // element size (the payload starts 8-aligned), whatever the byte sizes of the scales before it.
        std::stable_sort(s.tensors.begin(), s.tensors.end(), [](const SyntheticTensor& a, const SyntheticTensor& b) {
            return dtype_size(a.dtype) > dtype_size(b.dtype);
        });
    }
    return plan;
}

void write_synthetic_checkpoint(const ModelConfig& cfg, const SyntheticCheckpointPlan& plan, const std::string& dir,
                                const std::function<void(const CheckpointWriteProgress&)>& progress) {
    const std::string config = model_config_json(cfg);  // before any shard: a config it cannot write fails first
    const auto t0 = std::chrono::steady_clock::now();
    CheckpointWriteProgress p;
    p.bytes_total = plan.total_bytes;
    p.shards_total = static_cast<int>(plan.shards.size());
    nlohmann::json weight_map = nlohmann::json::object();
    // The next tensor is made on another thread while this one is written (and its shard synced): making and
    // writing overlap, and at most two tensors are held.
    std::vector<const SyntheticTensor*> order;
    for (const auto& shard : plan.shards)
        for (const SyntheticTensor& t : shard.tensors) order.push_back(&t);
    auto make = [&cfg](const SyntheticTensor* t) { return synthetic_tensor(cfg, *t); };
    std::future<Tensor> next;
    if (!order.empty()) next = std::async(std::launch::async, make, order[0]);
    size_t i = 0;
    for (const auto& shard : plan.shards) {
        std::vector<TensorEntry> entries;
        for (const SyntheticTensor& t : shard.tensors) entries.push_back({t.name, t.dtype, t.shape});
        SafeTensorsWriter w(dir + "/" + shard.file, std::move(entries));
        for (const SyntheticTensor& t : shard.tensors) {
            const Tensor v = next.get();
            if (++i < order.size()) next = std::async(std::launch::async, make, order[i]);
            w.write(v.raw(), v.nbytes());
            weight_map[t.name] = shard.file;
            p.bytes_done += v.nbytes();
            p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (progress) progress(p);
        }
        w.finish();
        ++p.shards_done;
    }
    const nlohmann::json index = {{"metadata", {{"total_size", plan.total_bytes}}}, {"weight_map", weight_map}};
    const std::string index_text = index.dump(2) + "\n";
    write_file(dir + "/model.safetensors.index.json", index_text.data(), index_text.size());
    // No sampling defaults beyond the OpenAI ones, so serving it samples as serving the synthetic model does.
    const nlohmann::json gen = {{"_from_model_config", true}, {"bos_token_id", cfg.bos_token_id},
                                {"eos_token_id", cfg.eos_token_id}, {"do_sample", true},
                                {"temperature", 1.0}, {"top_p", 1.0}};
    const std::string gen_text = gen.dump(2) + "\n";
    write_file(dir + "/generation_config.json", gen_text.data(), gen_text.size());
    write_file(dir + "/config.json", config.data(), config.size());
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (progress) progress(p);
}

}  // namespace peregrine
