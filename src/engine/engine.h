#pragma once
// The serving engine: one thread owns the model, the page pool and the prefix cache, and runs the
// scheduler loop (continuous batching: requests join and leave at every step; prefill chunks under a
// token budget mixed with decodes; preemption when state pages run out). Clients submit prompt ids from
// any thread and read a RequestStream; cancel() frees the request's memory at the next step.
#include "engine/metrics.h"
#include "engine/request.h"
#include "kv/cache_manager.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

namespace peregrine {

struct EngineOptions {
    int max_running_requests = 64;
    int max_queued_requests = 1024;
    int chunked_prefill_size = 512;  // tokens per step, prefill chunks and decodes together
    int64_t kv_pages = 0;            // history pages (rows) in the pool (required)
    int64_t window_pages = 0;        // window pages in the pool (0: as many as kv_pages)
    bool radix_cache = true;
    HiCacheOptions hicache;          // host memory and storage tiers below the device's pages (per rank)
    SwaReplay swa_replay;            // SWA bounded replay (kv/cache_manager.h)
    int64_t context_length = 0;      // 0: the model's max_position_embeddings
    // The overlapped schedule: the next step is built and enqueued while the device runs the current one, its
    // input ids read on the device from the current step's samples. -1: where the backend samples
    // asynchronously (CUDA); 0: off; 1: on (any backend: the same tokens, tests).
    int overlap_schedule = -1;
    // Speculative decoding (V4.1's DSpark head, V4's MTP layer): up to this many drafts per step for each decoding
    // request, verified by the next forward step (0: off). Outputs are the same with and without: greedy ones, and
    // seeded samples (each token is the target's own draw at its position; model_runner.cpp).
    int speculative_draft_tokens = 0;
    // Where drafts come from: null, the model's DSpark head or MTP layer; else up to k tokens to follow `seq` (a
    // request's prompt and output so far), from another drafter (tests give an oracle).
    std::function<std::vector<int32_t>(const std::vector<int32_t>& seq, int k)> drafter;
    // Confidence-scheduled verification (engine/spec_schedule.h): verify steps are timed at start-up and each step
    // keeps the drafts that raise its expected tokens per second. Off: every request keeps all its drafts.
    bool speculative_schedule = false;
};

// The waiting queue is full (HTTP 429).
class QueueFullError : public Error {
public:
    using Error::Error;
};

class Engine {
public:
    // `tok` (may be null) turns ids into text and matches stop strings; it must outlive the engine.
    Engine(Model& model, const Tokenizer* tok, EngineOptions opts);
    // Data-parallel attention over the ranks of one expert-parallel group (Model::set_expert_parallel):
    // a scheduler per rank, each with its own requests and KV pages (opts.kv_pages each); requests go to
    // the rank with the fewest; every rank steps in lock-step with the others.
    Engine(std::vector<Model*> ranks, const Tokenizer* tok, EngineOptions opts);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // The verify step table the schedule was profiled to (empty without confidence-scheduled verification).
    std::string speculative_schedule() const;
    // Validates and queues a request; throws Error for invalid input and QueueFullError when full.
    std::shared_ptr<RequestStream> submit(std::vector<int32_t> prompt, GenerationParams params);

    EngineStats stats() const;  // summed over the ranks
    // Frees every cached page no request uses; returns how many.
    int64_t flush_cache();

    Model& model() { return model_; }
    const Tokenizer* tokenizer() const { return tok_; }
    const EngineOptions& options() const { return opts_; }
    int64_t context_length() const { return opts_.context_length; }
    int64_t kv_tokens() const;  // capacity of a rank's page pool in tokens
    int ranks() const { return static_cast<int>(ranks_.size()); }

private:
    struct Impl;
    Model& model_;
    const Tokenizer* tok_;
    EngineOptions opts_;
    std::atomic<uint64_t> next_id_{1};
    std::vector<std::unique_ptr<Impl>> ranks_;
};

}  // namespace peregrine
