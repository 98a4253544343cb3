#pragma once
// The output processor hands each sampled token to its request: the penalties' and grammar's history, the stop
// conditions (EOS and stop ids, stop strings, a finished grammar, max_new_tokens, the context length), the released
// text (detokenised, stop strings held back), the stream the client reads, and the engine's counters and latency
// histograms. It ends requests: the scheduler frees their memory, the client hears why.
#include "engine/metrics.h"
#include "engine/model_runner.h"
#include "engine/request_state.h"
#include "engine/scheduler.h"

#include <mutex>
#include <string>

namespace peregrine {

class OutputProcessor final : public SchedulerListener {
public:
    OutputProcessor(Scheduler& scheduler, const Tokenizer* tok, int32_t eos, int vocab, int64_t context_length);

    // Delivers a step's tokens in order (a request that ended meanwhile is skipped) and counts the step.
    void process(StepOutput out);
    // Ends a request: its memory freed, its stream closed with `text` still held back and the reason.
    void finish(const RequestPtr& r, FinishReason why, std::string text, std::string matched = {},
                std::string error = {});

    // The scheduler's news.
    void admitted(Request& r) override;
    void preempted(Request& r) override;
    void ended(const RequestPtr& r, FinishReason why, const std::string& error) override;

    // Counters kept for client threads (submit).
    void count_submitted(bool rejected);
    // The gauges of this moment (queues, pages) into the stats.
    void publish_gauges(const CacheManager& kv);
    EngineStats stats() const;

private:
    void deliver(const RequestPtr& r, TokenOutput out, EngineClock::time_point now);
    void close(const RequestPtr& r, FinishReason why, std::string text, std::string matched, std::string error);

    Scheduler& scheduler_;
    const Tokenizer* tok_;
    int32_t eos_;
    int vocab_;
    int64_t context_length_;

    mutable std::mutex mu_;  // the stats are read by any thread
    EngineStats st_;
    EngineClock::time_point tp_window_ = EngineClock::now();
    uint64_t tp_tokens_ = 0;
};

}  // namespace peregrine
