#pragma once
// What a client gives the engine (prompt ids and generation parameters) and what it gets back: a
// RequestStream the engine thread fills with tokens and text as they are sampled.
#include "engine/sampling_params.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace peregrine {

// Per-request hook between the logits and the sampler (e.g. a grammar matcher masking tokens). Runs on
// the engine thread.
class LogitProcessor {
public:
    virtual ~LogitProcessor() = default;
    // May set logits of forbidden tokens to -inf.
    virtual void process(float* logits, int vocab) = 0;
    // The token that was sampled.
    virtual void accept(int32_t id) = 0;
    // True when nothing more may follow (the request then finishes with reason "stop").
    virtual bool done() const { return false; }
    // How many accepted tokens rollback() can undo: speculative decoding reads the mask at each drafted position
    // by accepting the drafts before it, then undoing them (0: the request is not drafted for).
    virtual int max_rollback() const { return 0; }
    virtual void rollback(int /*n_tokens*/) {}
};

struct GenerationParams {
    SamplingParams sampling;
    int64_t max_new_tokens = 128;
    int64_t min_new_tokens = 0;
    std::vector<std::string> stop;         // stop strings: text ends before the match
    std::vector<int32_t> stop_token_ids;   // in addition to EOS
    bool ignore_eos = false;
    bool skip_special_tokens = true;       // in the text (ids are always reported)
    bool logprobs = false;
    int top_logprobs = 0;
    std::shared_ptr<LogitProcessor> processor;
};

struct TokenOutput {
    int32_t id = 0;
    float logprob = 0.0f;
    std::vector<TokenLogprob> top;  // when top_logprobs > 0
    std::string text;               // the token's own bytes (for logprobs "token" fields)
};

enum class FinishReason { none, stop, length, abort, error };
const char* finish_reason_name(FinishReason r);

// Everything produced since the previous read, plus the request's totals.
struct RequestDelta {
    std::vector<TokenOutput> tokens;
    std::string text;  // released text (whole UTF-8 characters, stop strings removed)
    bool finished = false;
    FinishReason finish = FinishReason::none;
    std::string matched_stop;  // the stop string or stop token (as text) that ended it
    std::string error;         // finish == error
    int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
    int64_t cached_host = 0, cached_storage = 0;  // of cached_tokens, those from host memory and from storage
    int64_t preemptions = 0;
};

// Shared between the engine thread (writer) and one client thread (reader).
class RequestStream {
public:
    explicit RequestStream(uint64_t id) : id_(id) {}
    uint64_t id() const { return id_; }

    // Waits up to `timeout` for new output; returns false when there is none yet. Once the finished
    // delta was read, further reads return false at once.
    bool next(RequestDelta& out, std::chrono::milliseconds timeout);
    // Reads everything until the request finishes.
    RequestDelta wait();
    // Adds what arrives within `timeout` to `acc`; true once the request has finished.
    bool wait_for(RequestDelta& acc, std::chrono::milliseconds timeout);
    // Asks the engine to stop the request and free its memory (at the next step).
    void cancel();
    bool cancelled() const { return cancelled_.load(); }
    // The engine has delivered the request's end (its reader may not have read it yet).
    bool finished() {
        std::lock_guard lk(mu_);
        return done_;
    }

    // Engine side.
    void push(TokenOutput tok, const std::string& text, int64_t completion_tokens);
    void finish(FinishReason r, std::string text, std::string matched, std::string error, int64_t completion_tokens);
    void set_usage(int64_t prompt, int64_t cached, int64_t preemptions, int64_t cached_host = 0,
                   int64_t cached_storage = 0);
    void set_waker(std::function<void()> w) { waker_ = std::move(w); }
    // Reader side: called whenever new output is ready. It runs under the stream's lock, so it may only signal
    // (set a flag, post a task); once set_listener(nullptr) returns it is never called again.
    void set_listener(std::function<void()> l);

private:
    uint64_t id_;
    std::mutex mu_;
    std::condition_variable cv_;
    RequestDelta pending_;
    bool has_new_ = false, done_ = false, delivered_final_ = false;
    std::atomic<bool> cancelled_{false};
    std::function<void()> waker_;
    std::function<void()> listener_;
};

}  // namespace peregrine
