#pragma once
// The model runner turns a scheduled batch into a forward step and sampled tokens. It feeds each request's tokens
// (an id still on its way as a deferred id), runs the model in the batch's mode, and samples every row that gives a
// request its next token: on the device where the backend samples there, on the host where a request's logits
// need host code (grammar masks). With the overlapped schedule the next step is enqueued before the current one's
// ids come back, and a step returns the tokens of the one before it.
#include "engine/request_state.h"
#include "engine/scheduler.h"
#include "engine/spec_schedule.h"
#include "model/model.h"

#include <functional>
#include <list>
#include <optional>
#include <vector>

namespace peregrine {

// Tokens for the output processor, in sampling order (a request that ended meanwhile is skipped there).
struct StepOutput {
    std::vector<std::pair<RequestPtr, TokenOutput>> tokens;
    bool stepped = false;     // a forward step ran
    bool overlapped = false;  // and was enqueued before the previous step's ids were on the host
    double seconds = 0;       // the step's forward and the choice of its tokens (without the overlapped schedule)
    struct Verified {
        int drafts = 0, accepted = 0;
    };
    std::vector<Verified> verified;  // per verify step of a request: drafts and how many the target accepted
};

class TokensAhead;  // a request's sampling state past tokens it has not taken yet (model_runner.cpp)

class ModelRunner {
public:
    // overlap_schedule: -1 where the backend samples asynchronously, 0 off, 1 on (EngineOptions); draft_tokens:
    // speculative decoding's drafts per step (0: none).
    using Drafter = std::function<std::vector<int32_t>(const std::vector<int32_t>& seq, int k)>;
    ModelRunner(Model& model, CacheManager& kv, const Tokenizer* tok, int overlap_schedule, int draft_tokens = 0,
                Drafter drafter = nullptr);

    // Confidence-scheduled verification: drafts are cut per step by `s` (otherwise each request keeps them all).
    void set_spec_schedule(SpecSchedule s) { schedule_.emplace(std::move(s)); }
    const std::optional<SpecSchedule>& spec_schedule() const { return schedule_; }
    // Drafts the next tokens of every running request that decodes and may be verified (Request::drafts), with
    // the drafter, or else the model's DSpark head or MTP layer; then keeps those the schedule gives a slot.
    void draft(const std::list<RequestPtr>& running);

    // Whether the next step may be enqueued before the launched one's ids are on the host: the option allows it,
    // and no running request needs host code or the exact history for its logits.
    bool overlapping(const std::list<RequestPtr>& running) const;
    // Runs the step; without overlap its own tokens come back, with it those of the step launched before.
    StepOutput run(const ScheduledBatch& batch, bool overlap);
    // The launched step's tokens (none when nothing is on its way).
    StepOutput drain();
    // A step with no rows of this rank: under expert parallelism it still serves the group's MoE layers.
    void idle_step();
    // Drops every started sample (after a failed step, or at shutdown): the sampler's queue stays in step with
    // its callers.
    void discard();

    // Host milliseconds enqueueing forward steps and waiting for their ids, since the last call (trace).
    std::pair<double, double> take_times();
    // The engine step that ran the last step took `seconds` (one step's start to the next's): a step of decoding
    // and verifying sequences only corrects the schedule's predictions (SpecSchedule::observe).
    void note_step_seconds(double seconds);

private:
    // A step whose samples are on their way (the overlapped schedule): its sampled requests in sample-row order
    // and the requests it fed, whose completed pages join the prefix cache once their ids are known.
    struct Launched {
        std::vector<RequestPtr> sampled, fed;
    };
    StepOutput take_samples(Launched& l, const std::vector<RequestPtr>& fed_since);
    // Completed pages of requests whose fed ids are known join the prefix cache at once, so concurrent requests
    // with the same prefix (a shared system prompt) reuse them while these are still running.
    void share_pages(const std::vector<RequestPtr>& reqs);
    // The sampler's row for r (logits row `row`) with `ahead` tokens taken past its last one (penalty history
    // `pen`), at its draw `index`.
    SampleRow sample_row(const Request& r, int row, const PenaltyState& pen, int64_t ahead, uint64_t index) const;
    // r's logit adjustments with `ahead` tokens taken past its last one (the drafts of a verify step) and the
    // penalty history that includes them.
    std::vector<LogitAdjust> adjustments(const Request& r, const PenaltyState& pen, int64_t ahead = 0) const;
    // r's token after the `ahead` tokens of `view` from its logits row on the host (grammar mask, then the device
    // sampler's adjustments and draw); takes the request's next draw.
    TokenOutput choose(Request& r, const float* raw, std::vector<float>& row, const TokensAhead& view) const;
    // The drafts of each request (up to its count) from the model's DSpark head or MTP layer, each drawn as its
    // target will draw that position, and the predicted probability that the drafts up to each are all accepted
    // (DSpark's confidence head; for MTP the running acceptance `rate`).
    void draft_on_model(const std::vector<std::pair<Request*, int>>& wanted, const std::vector<double>& rate,
                        std::vector<std::vector<double>>& accept);
    TokenOutput token_output(SampleResult&& s) const;
    // A verify step's tokens for r: the target's token at its token and at each draft while the drafts match (`at`
    // gives position i's, with the drafts before it taken), then the sequence cut back to what they accepted.
    using TokenAt = std::function<TokenOutput(int i, const TokensAhead& ahead)>;
    std::vector<TokenOutput> verify(Request& r, const ScheduledBatch::Entry& e, const TokenAt& at);

    Model& model_;
    CacheManager& kv_;
    const Tokenizer* tok_;
    int overlap_schedule_;
    int draft_tokens_;
    Drafter drafter_;
    int vocab_;
    int32_t eos_;
    std::optional<Launched> launched_;
    std::optional<SpecSchedule> schedule_;
    // Drafts verified and accepted at each draft position: the prediction for drafters without a confidence.
    std::vector<double> drafted_at_, accepted_at_;
    // The last step's shape for note_step_seconds: its decoding sequences (0: it or the step before had other rows),
    // their drafts, and whether drafting ran for it.
    int step_decoding_ = 0, step_drafts_ = 0;
    bool drafted_ = false, last_decoding_only_ = false;
    double forward_ms_ = 0, wait_ms_ = 0;
};

}  // namespace peregrine
