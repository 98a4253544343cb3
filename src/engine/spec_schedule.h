#pragma once
// Confidence-scheduled verification: how many drafts each sequence of a step gets. A verify step's time is
// profiled at start-up per batch size and drafts per sequence, and corrected by the steps served; each step, draft
// slots go to the sequences in order of their predicted acceptance while the step's expected tokens per second still
// rise. Where drafts are nearly free
// (small batches on a GPU) every likely draft goes; where each token costs its share (large batches, or a CPU), only
// drafts accepted often enough to pay for themselves, down to none.
#include "kv/page_pool.h"
#include "model/model.h"

#include <functional>
#include <string>
#include <vector>

namespace peregrine {

class SpecSchedule {
public:
    // seconds[b][k]: a step of batches[b] sequences with k drafts each (k = 0..max drafts); batches ascending.
    // draft_seconds[b]: drafting for batches[b] sequences (empty: drafts cost nothing).
    SpecSchedule(std::vector<int> batches, std::vector<std::vector<double>> seconds,
                 std::vector<double> draft_seconds = {});
    // Times forward steps of 1, 4, 16, ... up to max_batch sequences (a few tokens of context each, as many as
    // `pool`'s free pages hold; they are given back) with 0..max_drafts drafts per sequence, and the model's drafter
    // (DSpark head, MTP layer) drafting for as many sequences: the best of `reps` each, after two untimed runs where
    // the backend graphs steps (the eager run and the capture).
    static SpecSchedule profile(Model& m, PagePool& pool, int max_batch, int max_drafts, int reps = 2);

    // Predicted seconds of a step of `batch` sequences with `drafts` drafts among them (interpolated, corrected).
    double step_seconds(int batch, int drafts) const;
    // Predicted seconds of drafting for `batch` sequences (interpolated, corrected).
    double draft_seconds(int batch) const;
    // A served step of `batch` decoding sequences with `drafts` drafts among them, drafted for (`drafted`) or not, took
    // `seconds` from one engine step to the next. The profile times the forward alone; what it leaves out (sampling,
    // acceptance, the host's share of a step) differs between steps with and without drafts, so each table row keeps
    // a running ratio of served to profiled seconds for both kinds, which the predictions above apply.
    void observe(int batch, int drafts, bool drafted, double seconds);
    // The served-to-profiled ratios by batch size (trace log).
    std::string corrections() const;
    // Drafts per sequence for a step of `batch` decoding sequences, of which those in `accept` have drafts:
    // accept[i][j] is the predicted probability that sequence i's drafts 0..j are all accepted (non-increasing in
    // j). Maximises (batch + expected accepted drafts) / step_seconds over the slots taken best first.
    std::vector<int> plan(const std::vector<std::vector<double>>& accept, int batch) const;
    // Whether drafting for a step of `batch` decoding sequences pays for itself, decided before drafting: with every
    // sequence's drafts accepted at the running rates (rate[j]: the chance that drafts 0..j are), the best plan's
    // tokens per second, its drafting time included, beat those of a step without drafts.
    bool worth_drafting(const std::vector<double>& rate, int batch) const;

    int max_drafts() const { return static_cast<int>(seconds_.front().size()) - 1; }
    // The table, a line per batch size (start-up log).
    std::string describe() const;

private:
    std::vector<int> batches_;
    std::vector<std::vector<double>> seconds_;
    std::vector<double> draft_seconds_;
    std::vector<double> plain_, speculative_;  // per table row: served / profiled seconds of steps without drafts, with
    // The table rows a batch size falls between and the upper one's weight (the first or last row alone outside).
    struct Between {
        size_t lo, hi;
        double w;
    };
    Between between(int batch) const;
    // f's value at `batch` from its values at the table's batch sizes: linear between them, in proportion beyond.
    double by_batch(int batch, const std::function<double(size_t)>& f) const;
    double served_ratio(int batch, bool speculative) const;
    double profiled_step(int batch, int drafts) const;
    double profiled_draft(int batch) const;
};

}  // namespace peregrine
