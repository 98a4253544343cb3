#include "engine/spec_schedule.h"
#include "kv/page_pool.h"
#include "ops/diagnostics.h"
#include "util/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

namespace peregrine {

SpecSchedule::SpecSchedule(std::vector<int> batches, std::vector<std::vector<double>> seconds,
                           std::vector<double> draft_seconds)
    : batches_(std::move(batches)),
      seconds_(std::move(seconds)),
      draft_seconds_(std::move(draft_seconds)),
      plain_(batches_.size(), 1.0),
      speculative_(batches_.size(), 1.0) {
    PEREGRINE_CHECK(draft_seconds_.empty() || draft_seconds_.size() == batches_.size(),
                    "drafting times: one per batch size");
    PEREGRINE_CHECK(!batches_.empty() && batches_.size() == seconds_.size() && std::is_sorted(batches_.begin(),
                                                                                              batches_.end()),
                    "verify step table: one row per batch size, ascending");
    for (const auto& row : seconds_)
        PEREGRINE_CHECK(row.size() == seconds_.front().size() && !row.empty(), "verify step table: ragged rows");
}

SpecSchedule SpecSchedule::profile(Model& m, PagePool& pool, int max_batch, int max_drafts, int reps) {
    // Each step feeds every sequence its token and drafts after a short, fixed context, then cuts them back. The
    // sequences take the engine's own pages, free at start-up (no memory beyond the plan's), as many as they hold.
    const int64_t context = 4, per_seq = m.layout().pages_for(context + max_drafts + 1);
    const int fit = static_cast<int>(std::min<int64_t>(pool.free_rows() / per_seq, std::max(1, max_batch)));
    PEREGRINE_CHECK(fit >= 1, "verify step profile: {} free state pages, a sequence needs {}", pool.free_rows(),
                    per_seq);
    std::vector<int> batches;
    for (int b = 1; b < fit; b *= 4) batches.push_back(b);
    batches.push_back(fit);
    const int most = batches.back();
    std::vector<SeqState> seqs(static_cast<size_t>(most));
    ForwardBatch first;
    for (int i = 0; i < most; ++i) {
        SeqState& s = seqs[static_cast<size_t>(i)];
        pool.init(s);
        PEREGRINE_CHECK(pool.reserve(s, context + max_drafts + 1), "verify step profile: no state pages");
        first.seqs.push_back({&s, 0, static_cast<int>(context), static_cast<int>(i * context)});
        for (int64_t t = 0; t < context; ++t) first.token_ids.push_back(static_cast<int32_t>((i + t) % 7 + 3));
    }
    first.mode = BatchMode::prefill;
    m.forward(first, {});
    // Where the backend graphs steps, untimed runs first: a step shape runs eagerly once and is captured the second
    // time; served steps replay the graphs.
    const Diagnostics* diag = m.backend().diagnostics();
    const int warmup = diag && diag->graphs() ? 2 : 0;
    std::vector<std::vector<double>> seconds(batches.size(), std::vector<double>(max_drafts + 1, 0.0));
    for (size_t b = 0; b < batches.size(); ++b)
        for (int k = 0; k <= max_drafts; ++k) {
            double best = INFINITY;
            for (int rep = 0; rep < warmup + reps; ++rep) {
                ForwardBatch d;
                std::vector<int> rows;
                for (int i = 0; i < batches[b]; ++i) {
                    SeqState& s = seqs[static_cast<size_t>(i)];
                    PEREGRINE_CHECK(pool.keep_step_carries(s, 1 + k), "verify step profile: no carries");
                    d.seqs.push_back({&s, context, 1 + k, d.rows()});
                    d.seqs.back().speculative = true;  // so that it can be cut back
                    for (int t = 0; t <= k; ++t) {
                        d.token_ids.push_back(static_cast<int32_t>((i + t) % 7 + 3));
                        rows.push_back(d.rows() - 1);
                    }
                }
                d.mode = k == 0 ? BatchMode::decode : BatchMode::prefill;
                const auto t0 = std::chrono::steady_clock::now();
                m.forward(d, rows);  // logits on the host: the step is over
                if (rep >= warmup)
                    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
                for (int i = 0; i < batches[b]; ++i) pool.cut(seqs[static_cast<size_t>(i)], context);
            }
            seconds[b][static_cast<size_t>(k)] = best;
        }
    // Drafting as the model runner drafts: each position's ids drawn where the backend samples (greedy rows here),
    // no logits copied to the host.
    DeviceSampler& sampler = m.backend().sampler();
    const Model::DraftChooser greedy = [&](int, const Tensor& logits) {
        std::vector<SampleRow> rows(static_cast<size_t>(logits.dim(0)));
        for (size_t j = 0; j < rows.size(); ++j) rows[j].row = static_cast<int>(j);
        std::vector<int32_t> ids;
        for (const SampleResult& r : sampler.sample(logits, rows)) ids.push_back(r.id);
        return ids;
    };
    std::vector<double> draft;
    for (size_t b = 0; m.can_draft() && b < batches.size(); ++b) {
        std::vector<const SeqState*> some;
        for (int i = 0; i < batches[b]; ++i) some.push_back(&seqs[static_cast<size_t>(i)]);
        double best = INFINITY;
        for (int rep = 0; rep < warmup + reps; ++rep) {
            const auto t0 = std::chrono::steady_clock::now();
            (void)m.draft(some, std::vector<int32_t>(some.size(), 3), greedy, max_drafts);
            if (rep >= warmup)
                best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        draft.push_back(best);
    }
    for (SeqState& s : seqs) pool.release(s);
    return SpecSchedule(std::move(batches), std::move(seconds), std::move(draft));
}

SpecSchedule::Between SpecSchedule::between(int batch) const {
    const size_t last = batches_.size() - 1;
    if (batch <= batches_.front()) return {0, 0, 0.0};
    if (batch >= batches_.back()) return {last, last, 0.0};
    size_t hi = 1;
    while (batches_[hi] < batch) ++hi;
    return {hi - 1, hi, static_cast<double>(batch - batches_[hi - 1]) / (batches_[hi] - batches_[hi - 1])};
}

double SpecSchedule::by_batch(int batch, const std::function<double(size_t)>& f) const {
    const Between b = between(batch);
    const double v = f(b.lo) * (1 - b.w) + f(b.hi) * b.w;
    return batch > batches_.back() ? v * batch / batches_.back() : v;
}

double SpecSchedule::served_ratio(int batch, bool speculative) const {
    const std::vector<double>& r = speculative ? speculative_ : plain_;
    // Beyond the largest batch the last row's ratio holds (not in proportion, as seconds grow).
    return by_batch(std::min(batch, batches_.back()), [&](size_t b) { return r[b]; });
}

double SpecSchedule::step_seconds(int batch, int drafts) const {
    return profiled_step(batch, drafts) * served_ratio(batch, drafts > 0);
}

double SpecSchedule::draft_seconds(int batch) const { return profiled_draft(batch) * served_ratio(batch, true); }

void SpecSchedule::observe(int batch, int drafts, bool drafted, double seconds) {
    if (batch <= 0 || seconds <= 0) return;
    const bool spec = drafts > 0 || drafted;
    const double profiled = profiled_step(batch, drafts) + (drafted ? profiled_draft(batch) : 0.0);
    // One step may hold an admission or a stall: each moves the running ratio a twentieth of the way to its own,
    // clamped to 0.25-4.
    const double ratio = std::clamp(seconds / profiled, 0.25, 4.0);
    constexpr double kRate = 0.05;
    std::vector<double>& served = spec ? speculative_ : plain_;
    const Between b = between(batch);  // the rows the prediction at `batch` comes from, each by its weight
    served[b.lo] += kRate * (1 - b.w) * (ratio - served[b.lo]);
    if (b.hi != b.lo) served[b.hi] += kRate * b.w * (ratio - served[b.hi]);
}

std::string SpecSchedule::corrections() const {
    std::string s = "served / profiled seconds by batch (without drafts, with):";
    for (size_t b = 0; b < batches_.size(); ++b) s += fmt::format(" {}: {:.2f} {:.2f}", batches_[b], plain_[b],
                                                                  speculative_[b]);
    return s;
}

double SpecSchedule::profiled_step(int batch, int drafts) const {
    // Linear in drafts per sequence between the table's columns, in the batch size between its rows (beyond the
    // largest: in proportion to it).
    const double per_seq = std::min<double>(static_cast<double>(drafts) / std::max(1, batch), max_drafts());
    return by_batch(batch, [&](size_t b) {
        const auto& row = seconds_[b];
        const int k0 = std::min(static_cast<int>(per_seq), max_drafts() - 1);
        if (max_drafts() == 0) return row[0];
        const double f = per_seq - k0;
        return row[static_cast<size_t>(k0)] * (1 - f) + row[static_cast<size_t>(k0) + 1] * f;
    });
}

double SpecSchedule::profiled_draft(int batch) const {
    if (draft_seconds_.empty()) return 0.0;
    return by_batch(batch, [&](size_t b) { return draft_seconds_[b]; });
}

std::vector<int> SpecSchedule::plan(const std::vector<std::vector<double>>& accept, int batch) const {
    struct Slot {
        double p;
        size_t seq;
    };
    std::vector<Slot> slots;
    for (size_t i = 0; i < accept.size(); ++i)
        for (double p : accept[i]) slots.push_back({p, i});
    // Best first; a sequence's own slots keep their order (non-increasing), so a prefix of slots is a prefix of
    // each sequence's drafts.
    std::stable_sort(slots.begin(), slots.end(), [](const Slot& a, const Slot& b) { return a.p > b.p; });
    double tokens = batch, best = tokens / step_seconds(batch, 0);
    size_t take = 0;
    for (size_t n = 0; n < slots.size(); ++n) {
        tokens += slots[n].p;
        const double rate = tokens / step_seconds(batch, static_cast<int>(n + 1));
        if (rate > best) best = rate, take = n + 1;
    }
    std::vector<int> drafts(accept.size(), 0);
    for (size_t n = 0; n < take; ++n) ++drafts[slots[n].seq];
    return drafts;
}

bool SpecSchedule::worth_drafting(const std::vector<double>& rate, int batch) const {
    if (batch <= 0 || rate.empty()) return false;
    const double plain = batch / step_seconds(batch, 0), drafting = draft_seconds(batch);
    // Every sequence alike: slots go a draft position at a time across the batch.
    double tokens = batch;
    for (size_t j = 0; j < rate.size() && static_cast<int>(j) < max_drafts(); ++j) {
        tokens += batch * rate[j];
        if (tokens / (step_seconds(batch, batch * static_cast<int>(j + 1)) + drafting) > plain) return true;
    }
    return false;
}

std::string SpecSchedule::describe() const {
    std::string s = "verify step ms by batch (rows) and drafts per sequence (0..):";
    for (size_t b = 0; b < batches_.size(); ++b) {
        s += fmt::format("\n  {:>4}:", batches_[b]);
        for (double t : seconds_[b]) s += fmt::format(" {:.2f}", t * 1e3);
    }
    if (!draft_seconds_.empty()) {
        s += "\n  drafting ms by batch:";
        for (size_t b = 0; b < batches_.size(); ++b)
            s += fmt::format(" {}: {:.2f}", batches_[b], draft_seconds_[b] * 1e3);
    }
    return s;
}

}  // namespace peregrine
