#pragma once
// One request inside the engine, as its three parts share it: the scheduler moves it between queues and gives it
// memory, the model runner feeds its tokens and samples the next, the output processor hands that token to its
// stream. Queued -> running (prefill chunks, then one token per step) -> finished; a running request may be
// preempted (its pages go to the prefix cache) and queued again at the front, keeping its sampler and output so
// that it resumes exactly where it was.
#include "engine/request.h"
#include "engine/sampling_params.h"
#include "engine/text_stream.h"
#include "kv/cache_manager.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace peregrine {

using EngineClock = std::chrono::steady_clock;

struct Request {
    enum class Phase { queued, running, preempted, finished };

    uint64_t id = 0;
    std::shared_ptr<RequestStream> stream;
    GenerationParams params;
    std::vector<int32_t> seq;  // prompt, then every sampled token on the host (the last one not yet fed)
    int64_t prompt_len = 0;
    int64_t completion = 0;  // sampled tokens, EOS / stop ids included
    Phase phase = Phase::queued;

    CachedSequence kv;  // its state and what it shares with the prefix cache
    int64_t cached_tokens = 0;
    int64_t cached_host = 0, cached_storage = 0;  // of cached_tokens, from host memory and from storage
    bool admitted_once = false;
    int64_t preemptions = 0;

    Sampler sampler;
    PenaltyState penalties;
    TextStream text;

    // The overlapped schedule: tokens sampled by launched steps whose ids are not on the host yet (0-2); the
    // row of the latest launch's samples that is this request's (its next input, as a deferred id); the
    // position of its state's token history holding a deferred id (-1: none), set right when the id arrives.
    int pending = 0;
    int sample_row = -1;
    int64_t deferred_pos = -1;

    // Speculative decoding: the drafted tokens after the last one of seq, verified by the next step.
    std::vector<int32_t> drafts;

    EngineClock::time_point arrival, last_token;
    bool got_first = false;

    Request(const Tokenizer* tok, GenerationParams p)
        : params(std::move(p)), sampler(params.sampling), text(tok, params.stop, params.skip_special_tokens) {}
    // Tokens still to feed to the model (sampled ones on their way included).
    int64_t to_feed() const { return static_cast<int64_t>(seq.size()) + pending - kv.state.n_cached; }
    // Tokens of its state whose ids are known (not the deferred one, nor any after it).
    int64_t known_tokens() const {
        return deferred_pos >= 0 ? std::min(kv.state.n_cached, deferred_pos) : kv.state.n_cached;
    }
    // Whether the overlapped schedule may sample it: its logits need no host code and its penalties no
    // knowledge of the tokens still on their way.
    bool overlappable() const { return !params.processor && !params.sampling.has_penalties(); }
    // Whether k drafts may be verified for it: its logit processor (if any) can undo the drafts it is shown.
    bool draftable(int k) const { return !params.processor || params.processor->max_rollback() >= k; }
};

using RequestPtr = std::shared_ptr<Request>;

}  // namespace peregrine
