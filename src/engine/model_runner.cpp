#include "engine/model_runner.h"
#include "util/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

namespace peregrine {

namespace {
double ms_since(EngineClock::time_point t) {
    return std::chrono::duration<double, std::milli>(EngineClock::now() - t).count();
}
}  // namespace

// A request's sampling state as if tokens past its last one were taken (the drafts of a speculative step): its
// logit processor advanced over them, its penalty history including them. Drafting and verifying read the
// distribution at each drafted position through it; the request is left as it was (the output processor takes
// the tokens that are emitted).
class TokensAhead {
public:
    explicit TokensAhead(Request& r) : r_(r) {}
    ~TokensAhead() {
        if (n_ > 0 && r_.params.processor) r_.params.processor->rollback(n_);
    }
    TokensAhead(const TokensAhead&) = delete;
    TokensAhead& operator=(const TokensAhead&) = delete;
    void take(int32_t id, int vocab) {
        if (r_.params.sampling.has_penalties()) {
            if (!pen_) pen_ = r_.penalties;  // copied once, when a token is taken
            pen_->add_generated(id, vocab);
        }
        if (r_.params.processor) r_.params.processor->accept(id);
        ++n_;
    }
    int count() const { return n_; }
    const PenaltyState& penalties() const { return pen_ ? *pen_ : r_.penalties; }

private:
    Request& r_;
    std::optional<PenaltyState> pen_;
    int n_ = 0;
};

ModelRunner::ModelRunner(Model& model, CacheManager& kv, const Tokenizer* tok, int overlap_schedule,
                         int draft_tokens, Drafter drafter)
    : model_(model), kv_(kv), tok_(tok), overlap_schedule_(overlap_schedule), draft_tokens_(draft_tokens),
      drafter_(std::move(drafter)), vocab_(model.config().vocab_size), eos_(model.config().eos_token_id) {}

bool ModelRunner::overlapping(const std::list<RequestPtr>& running) const {
    // A verify step's next step depends on what it accepted.
    if (overlap_schedule_ == 0 || draft_tokens_ > 0 || model_.expert_parallel()) return false;
    if (overlap_schedule_ < 0 && !model_.backend().sampler().async()) return false;
    for (auto& r : running)
        if (!r->overlappable()) return false;
    return true;
}

std::pair<double, double> ModelRunner::take_times() {
    std::pair<double, double> t{forward_ms_, wait_ms_};
    forward_ms_ = wait_ms_ = 0;
    return t;
}

void ModelRunner::note_step_seconds(double seconds) {
    if (schedule_ && step_decoding_ > 0) schedule_->observe(step_decoding_, step_drafts_, drafted_, seconds);
    step_decoding_ = 0;
}

void ModelRunner::idle_step() {
    if (model_.expert_parallel()) model_.idle_step();
}

void ModelRunner::discard() {
    launched_.reset();
    model_.backend().sampler().discard();
}

void ModelRunner::share_pages(const std::vector<RequestPtr>& reqs) {
    for (auto& r : reqs)
        if (r->phase == Request::Phase::running && r->deferred_pos < 0) kv_.share(r->kv, r->kv.state.n_cached);
}

StepOutput ModelRunner::drain() {
    if (!launched_) return {};
    Launched l = std::move(*launched_);
    launched_.reset();
    return take_samples(l, {});
}

// Step l's samples (the oldest the sampler has started): the deferred ids the step launched since (`fed_since`) left
// in token histories are patched, both steps' completed pages join the prefix cache, and the tokens go out.
StepOutput ModelRunner::take_samples(Launched& l, const std::vector<RequestPtr>& fed_since) {
    const auto tw = EngineClock::now();
    std::vector<SampleResult> res = model_.backend().sampler().finish();
    wait_ms_ += ms_since(tw);
    PEREGRINE_CHECK(res.size() == l.sampled.size(), "{} samples for {} requests", res.size(), l.sampled.size());
    for (size_t i = 0; i < res.size(); ++i) {
        Request& r = *l.sampled[i];
        --r.pending;
        if (r.deferred_pos >= 0) {  // fed to the step launched since: its input was this sample
            r.kv.state.tokens.at(static_cast<size_t>(r.deferred_pos)) = res[i].id;
            r.deferred_pos = -1;
        }
    }
    share_pages(l.fed);
    share_pages(fed_since);
    StepOutput out;
    for (size_t i = 0; i < res.size(); ++i) out.tokens.emplace_back(l.sampled[i], token_output(std::move(res[i])));
    return out;
}

void ModelRunner::draft(const std::list<RequestPtr>& running) {
    std::vector<std::pair<Request*, int>> wanted;  // requests to draft for, and how many drafts
    int decoding = 0;
    for (auto& r : running) {
        r->drafts.clear();
        if (draft_tokens_ == 0 || r->to_feed() != 1 || r->pending || r->kv.state.n_cached == 0) continue;
        ++decoding;
        // The drafts go up to the token limit: the target's token after the last draft comes with them.
        const int64_t room = r->params.max_new_tokens - r->completion - 1;
        const int k = static_cast<int>(std::min<int64_t>(draft_tokens_, room));
        if (k > 0 && r->draftable(k)) wanted.emplace_back(r.get(), k);
    }
    // The running acceptance at each draft position (one accepted of two before any is known), non-increasing.
    std::vector<double> rate(static_cast<size_t>(draft_tokens_));
    for (size_t i = 0; i < rate.size(); ++i) {
        rate[i] = i < drafted_at_.size() ? (accepted_at_[i] + 1) / (drafted_at_[i] + 2) : 0.5;
        if (i > 0) rate[i] = std::min(rate[i], rate[i - 1]);
    }
    drafted_ = false;
    if (wanted.empty() || (schedule_ && !schedule_->worth_drafting(rate, decoding))) return;
    drafted_ = true;
    std::vector<std::vector<double>> accept(wanted.size());  // predicted acceptance of each request's drafts
    if (drafter_) {
        for (size_t n = 0; n < wanted.size(); ++n) {
            auto [r, k] = wanted[n];
            r->drafts = drafter_(r->seq, k);
            if (static_cast<int>(r->drafts.size()) > k) r->drafts.resize(static_cast<size_t>(k));
            accept[n].assign(rate.begin(), rate.begin() + static_cast<int64_t>(r->drafts.size()));
        }
    } else {
        draft_on_model(wanted, rate, accept);
    }
    for (size_t n = 0; n < wanted.size(); ++n) {
        Request& r = *wanted[n].first;
        for (int32_t t : r.drafts) PEREGRINE_CHECK(t >= 0 && t < vocab_, "draft token {} out of range", t);
        auto& p = accept[n];
        p.resize(r.drafts.size());
        for (size_t i = 1; i < p.size(); ++i) p[i] = std::min(p[i], p[i - 1]);
    }
    if (!schedule_) return;
    const std::vector<int> keep = schedule_->plan(accept, decoding);
    for (size_t n = 0; n < wanted.size(); ++n) wanted[n].first->drafts.resize(static_cast<size_t>(keep[n]));
}

// Each draft is drawn from the head's logits with the request's own transforms (grammar mask, penalties, bias,
// temperature and truncation) and the very draw its target will use at that position: wherever the two
// distributions put that draw on the same token, the draft is the target's token. Greedy requests draft greedily.
// One pass of the drafter drafts for every request; each position's tokens are drawn where the backend samples (the
// rows of requests with a grammar mask on the host).
void ModelRunner::draft_on_model(const std::vector<std::pair<Request*, int>>& wanted, const std::vector<double>& rate,
                                 std::vector<std::vector<double>>& accept) {
    const size_t N = wanted.size();
    std::vector<std::unique_ptr<TokensAhead>> ahead;
    std::vector<const SeqState*> seqs;
    std::vector<int32_t> anchors;
    for (auto [r, k] : wanted) {
        ahead.push_back(std::make_unique<TokensAhead>(*r));
        seqs.push_back(&r->kv.state);
        anchors.push_back(r->seq.back());
    }
    std::vector<bool> ended(N, false);  // no more drafts: an end of sequence was drafted, or the grammar is done
    DeviceSampler& sampler = model_.backend().sampler();
    auto choose = [&](int i, const Tensor& logits) {
        std::vector<int32_t> ids(N, -1);
        std::vector<SampleRow> rows;
        std::vector<size_t> sampled;  // the request of each sampler row
        std::vector<int> host;        // requests whose logit processor runs on the host
        for (size_t n = 0; n < N; ++n) {
            Request& r = *wanted[n].first;
            if (i >= wanted[n].second || ended[n] || (r.params.processor && r.params.processor->done())) {
                ended[n] = true;
            } else if (r.params.processor) {
                host.push_back(static_cast<int>(n));
            } else {
                rows.push_back(sample_row(r, static_cast<int>(n), ahead[n]->penalties(), i,
                                          r.sampler.next_index() + static_cast<uint64_t>(i)));
                rows.back().logprobs = false;
                rows.back().top_logprobs = 0;
                sampled.push_back(n);
            }
        }
        if (!rows.empty()) {
            const std::vector<SampleResult> res = sampler.sample(logits, rows);
            for (size_t j = 0; j < res.size(); ++j) ids[sampled[j]] = res[j].id;
        }
        if (!host.empty()) {
            Tensor h = sampler.rows_to_host(logits, host);
            SampleScratch scratch;
            for (size_t j = 0; j < host.size(); ++j) {
                const size_t n = static_cast<size_t>(host[j]);
                Request& r = *wanted[n].first;
                float* row = h.f32() + static_cast<int64_t>(j) * vocab_;
                r.params.processor->process(row, vocab_);
                apply_adjustments(row, vocab_, adjustments(r, ahead[n]->penalties(), i),
                                  penalties_of(r.params.sampling));
                const int32_t id = sample_token(row, vocab_, r.sampler.config(), r.sampler.seed(),
                                                r.sampler.next_index() + static_cast<uint64_t>(i), scratch);
                ids[n] = row[id] > -INFINITY ? id : -1;  // -1: every token masked
            }
        }
        for (size_t n = 0; n < N; ++n) {
            if (ids[n] < 0) {
                ended[n] = true;
                continue;
            }
            const auto& p = wanted[n].first->params;
            ended[n] = (!p.ignore_eos && ids[n] == eos_) ||
                       std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), ids[n]) != p.stop_token_ids.end();
            ahead[n]->take(ids[n], vocab_);
        }
        return ids;
    };
    const std::vector<DraftResult> d = model_.draft(seqs, anchors, choose, draft_tokens_);
    ahead.clear();  // the requests as they were (their logit processors rolled back)
    for (size_t n = 0; n < N; ++n) {
        wanted[n].first->drafts.assign(d[n].ids.begin() + 1, d[n].ids.end());
        const size_t drafts = d[n].ids.size() - 1;
        if (d[n].confidence.empty()) {  // MTP: the running acceptance
            accept[n].assign(rate.begin(), rate.begin() + static_cast<int64_t>(drafts));
            continue;
        }
        double all = 1;  // the confidence head's logit: the draft's chance of being accepted after the ones before it
        for (size_t i = 0; i < drafts; ++i) accept[n].push_back(all *= 1 / (1 + std::exp(-d[n].confidence[i])));
    }
}

// The target's token at each drafted position is its own draw there (the draw it would make without drafts), so
// the output is the target's distribution exactly, and a seeded request gives the same tokens with or without
// speculation. A draft is accepted when it is that token.
std::vector<TokenOutput> ModelRunner::verify(Request& r, const ScheduledBatch::Entry& e, const TokenAt& at) {
    std::vector<TokenOutput> out;
    int accepted = 0;
    {
        TokensAhead ahead(r);
        for (int i = 0; i <= e.drafts; ++i) {
            out.push_back(at(i, ahead));
            if (i == e.drafts || out.back().id != r.drafts[static_cast<size_t>(i)]) break;
            ahead.take(out.back().id, vocab_);
        }
        accepted = ahead.count();
    }
    // Positions from the first rejected draft on hold what it left: cut them (fed again as the right tokens come).
    if (accepted < e.drafts) kv_.cut(r.kv, e.start + e.n_tokens - e.drafts + accepted);
    r.drafts.clear();
    return out;
}

StepOutput ModelRunner::run(const ScheduledBatch& sb, bool overlap) {
    // The forward batch: every entry's known tokens, and a token on its way as a deferred id.
    ForwardBatch batch;
    batch.mode = sb.mode;
    std::vector<int> logit_rows;
    std::vector<RequestPtr> fed, sampled;
    std::vector<const ScheduledBatch::Entry*> sampled_entry;
    std::vector<int64_t> first_row;  // sampled[i]'s first logits row (a verify step has one per draft besides)
    step_decoding_ = 0, step_drafts_ = 0;
    bool decoding_only = true;
    for (const auto& e : sb.entries) {
        decoding_only = decoding_only && e.sampled && e.n_tokens == 1 + e.drafts;
        ++step_decoding_, step_drafts_ += e.drafts;
    }
    // A step also waits for the one before (for its ids, or the GPU's queue): after a prefill it is no measure.
    if (!decoding_only || !last_decoding_only_) step_decoding_ = 0;
    last_decoding_only_ = decoding_only;
    for (const auto& e : sb.entries) {
        Request& r = *e.request;
        const int64_t known = static_cast<int64_t>(r.seq.size());
        const int row0 = batch.rows();
        batch.seqs.push_back({&r.kv.state, e.start, e.n_tokens, row0});
        batch.seqs.back().replay_from = r.kv.replay_from;
        batch.seqs.back().speculative = e.drafts > 0;
        for (int64_t pos = e.start; pos < e.start + e.n_tokens; ++pos) {
            if (e.drafts > 0 && pos >= known) {  // a draft
                batch.token_ids.push_back(r.drafts.at(static_cast<size_t>(pos - known)));
            } else if (pos < known) {
                batch.token_ids.push_back(r.seq[static_cast<size_t>(pos)]);
            } else {
                batch.token_ids.push_back(DeviceSampler::deferred_id(r.sample_row));
                r.deferred_pos = pos;
            }
        }
        fed.push_back(e.request);
        if (e.sampled) {
            first_row.push_back(static_cast<int64_t>(logit_rows.size()));
            for (int d = e.drafts; d >= 0; --d) logit_rows.push_back(row0 + e.n_tokens - 1 - d);
            sampled.push_back(e.request);
            sampled_entry.push_back(&e);
        }
    }

    // Where the backend samples on the device, the logits stay there and only the chosen ids come back; rows with a
    // logit processor (grammar masks, host code) copy just their own logits to the host.
    DeviceSampler& sampler = model_.backend().sampler();
    const bool on_device = sampler.on_device();
    const auto tf = EngineClock::now();
    Tensor logits = model_.forward(batch, logit_rows, !on_device && !overlap);
    StepOutput out;
    out.stepped = true;
    if (overlap) {
        // This step's samples start; the previous step's arrive (the device runs this step meanwhile).
        std::vector<SampleRow> rows;
        for (size_t i = 0; i < sampled.size(); ++i)
            rows.push_back(sample_row(*sampled[i], static_cast<int>(i), sampled[i]->penalties, 0,
                                      sampled[i]->sampler.take_index()));
        sampler.start(logits, rows);
        forward_ms_ += ms_since(tf);
        for (size_t i = 0; i < sampled.size(); ++i) {
            ++sampled[i]->pending;
            sampled[i]->sample_row = static_cast<int>(i);
        }
        std::optional<Launched> prev = std::move(launched_);
        launched_ = Launched{sampled, fed};
        if (prev) {
            StepOutput p = take_samples(*prev, fed);
            out.tokens = std::move(p.tokens);
            out.overlapped = true;
        } else {
            share_pages(fed);
        }
        return out;
    }
    forward_ms_ += ms_since(tf);
    const auto tw = EngineClock::now();
    std::vector<TokenOutput> chosen(sampled.size());
    std::vector<std::vector<TokenOutput>> verified(sampled.size());  // verify steps' tokens
    // Requests without a logit processor are sampled on the device where the backend samples there: each row of a
    // verify step as if the drafts before it were taken. The others' rows come to the host (grammar masks).
    std::vector<size_t> device_reqs, host_reqs;
    for (size_t i = 0; i < sampled.size(); ++i)
        (on_device && !sampled[i]->params.processor ? device_reqs : host_reqs).push_back(i);
    std::vector<SampleRow> device_rows;
    std::vector<size_t> device_first(sampled.size());  // sampled[i]'s first result
    for (size_t i : device_reqs) {
        Request& r = *sampled[i];
        const int drafts = sampled_entry[i]->drafts;
        device_first[i] = device_rows.size();
        TokensAhead ahead(r);
        for (int d = 0; d <= drafts; ++d) {
            device_rows.push_back(sample_row(r, static_cast<int>(first_row[i]) + d, ahead.penalties(), d,
                                             r.sampler.next_index() + static_cast<uint64_t>(d)));
            if (d < drafts) ahead.take(r.drafts[static_cast<size_t>(d)], vocab_);
        }
    }
    std::vector<SampleResult> device_res;
    if (!device_rows.empty()) device_res = sampler.sample(logits, device_rows);
    for (size_t i : device_reqs) {
        Request& r = *sampled[i];
        auto at = [&](int d, const TokensAhead&) {
            r.sampler.take_index();
            return token_output(std::move(device_res[device_first[i] + static_cast<size_t>(d)]));
        };
        if (sampled_entry[i]->drafts > 0) verified[i] = verify(r, *sampled_entry[i], at);
        else chosen[i] = at(0, TokensAhead(r));
    }
    Tensor host_logits = logits;  // from row host_first[j]: sampled[host_reqs[j]]'s rows
    std::vector<int64_t> host_first;
    std::vector<int> copied;
    for (size_t i : host_reqs) {
        host_first.push_back(on_device ? static_cast<int64_t>(copied.size()) : first_row[i]);
        for (int d = 0; d <= sampled_entry[i]->drafts; ++d) copied.push_back(static_cast<int>(first_row[i]) + d);
    }
    if (on_device && !host_reqs.empty()) host_logits = sampler.rows_to_host(logits, copied);
    // Choosing the tokens on the host is independent per request (own logits row, sampler, grammar matcher): it
    // runs in parallel; delivering them and the finishing rules run in order (the output processor).
    parallel_for(static_cast<int64_t>(host_reqs.size()), [&](int64_t j0, int64_t j1) {
        std::vector<float> row;
        for (int64_t j = j0; j < j1; ++j) {
            const size_t i = host_reqs[static_cast<size_t>(j)];
            Request& r = *sampled[i];
            const float* l = host_logits.f32() + host_first[static_cast<size_t>(j)] * static_cast<int64_t>(vocab_);
            auto at = [&](int d, const TokensAhead& ahead) {
                return choose(r, l + static_cast<int64_t>(d) * vocab_, row, ahead);
            };
            if (sampled_entry[i]->drafts > 0) verified[i] = verify(r, *sampled_entry[i], at);
            else chosen[i] = at(0, TokensAhead(r));
        }
    });
    wait_ms_ += ms_since(tw);  // the synchronous sample (or the host's choice) waits for the logits
    out.seconds = ms_since(tf) / 1e3;
    share_pages(fed);  // after verify steps cut what their rejected drafts wrote
    for (size_t i = 0; i < sampled.size(); ++i) {
        if (sampled_entry[i]->drafts == 0) {
            out.tokens.emplace_back(sampled[i], std::move(chosen[i]));
            continue;
        }
        const int drafts = sampled_entry[i]->drafts, accepted = static_cast<int>(verified[i].size()) - 1;
        out.verified.push_back({drafts, accepted});
        if (drafted_at_.size() < static_cast<size_t>(drafts)) drafted_at_.resize(drafts), accepted_at_.resize(drafts);
        for (int j = 0; j < drafts; ++j) drafted_at_[j] += 1, accepted_at_[j] += j < accepted;
        for (TokenOutput& t : verified[i]) out.tokens.emplace_back(sampled[i], std::move(t));
    }
    return out;
}

// The ids r may not produce yet (EOS and stop ids before min_new_tokens) and its logit adjustments.
std::vector<LogitAdjust> ModelRunner::adjustments(const Request& r, const PenaltyState& pen, int64_t ahead) const {
    const auto& p = r.params;
    std::vector<int32_t> masked;
    if (r.completion + r.pending + ahead < p.min_new_tokens) {  // tokens on their way count
        if (!p.ignore_eos && eos_ >= 0 && eos_ < vocab_) masked.push_back(eos_);
        masked.insert(masked.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
    }
    if (!p.sampling.has_penalties() && p.sampling.logit_bias.empty() && masked.empty()) return {};
    return logit_adjustments(p.sampling, pen, masked, vocab_);
}

SampleRow ModelRunner::sample_row(const Request& r, int row, const PenaltyState& pen, int64_t ahead,
                                  uint64_t index) const {
    const auto& p = r.params;
    SampleRow s;
    s.row = row;
    s.adjust = adjustments(r, pen, ahead);
    s.penalties = penalties_of(p.sampling);
    s.config = r.sampler.config();
    s.seed = r.sampler.seed();
    s.index = index;
    s.logprobs = p.logprobs;
    s.top_logprobs = p.logprobs ? p.top_logprobs : 0;
    return s;
}

TokenOutput ModelRunner::token_output(SampleResult&& s) const {
    TokenOutput out;
    out.id = s.id;
    out.logprob = s.logprob;
    out.top = std::move(s.top);
    if (tok_ && tok_->is_valid(out.id)) out.text = tok_->token_bytes(out.id);
    return out;
}

TokenOutput ModelRunner::choose(Request& r, const float* raw, std::vector<float>& row, const TokensAhead& view) const {
    const auto& p = r.params;
    row.assign(raw, raw + vocab_);
    float* l = row.data();
    if (p.processor) p.processor->process(l, vocab_);
    apply_adjustments(l, vocab_, adjustments(r, view.penalties(), view.count()), penalties_of(p.sampling));
    const int32_t id = r.sampler.sample(l, vocab_);
    TokenOutput out;
    out.id = id;
    if (p.logprobs) out.logprob = chosen_logprob(l, vocab_, id, &out.top, p.top_logprobs).logprob;
    if (tok_ && tok_->is_valid(id)) out.text = tok_->token_bytes(id);
    return out;
}

}  // namespace peregrine
