#include "ops/attention_plan.h"
#include "ops/draft_window.h"
#include "ops/window_order.h"

#include <algorithm>
#include <cmath>

namespace peregrine {

std::vector<RowInfo> row_infos(ForwardBatch& batch) {
    std::vector<RowInfo> rows(static_cast<size_t>(batch.rows()));
    for (auto& s : batch.seqs)
        for (int i = 0; i < s.n_tokens; ++i) rows[static_cast<size_t>(s.row0 + i)] = {&s, s.start_pos + i};
    return rows;
}

std::vector<int64_t> draft_window_keys(int64_t pos, int64_t row_pos, int window, int64_t floor, bool chain) {
    std::vector<int64_t> out;
    for_each_draft_window_key(pos, row_pos, window, floor, chain, [&](int64_t p) { out.push_back(p); });
    return out;
}

DraftRows draft_rows(const std::vector<int64_t>& pos, int B, bool chain) {
    DraftRows d;
    d.first = chain ? B - 1 : 0;
    for (size_t j = 0; j < pos.size(); ++j)
        for (int i = 0; i < B; ++i) {
            d.positions.push_back(pos[j] + 1 + i);
            if (i < d.first) continue;
            d.q_rows.push_back(static_cast<int>(j) * B + i);
            d.q_positions.push_back(d.positions.back());
        }
    return d;
}

std::vector<int64_t> window_list(const BatchSeq& s, int64_t pos, int W, bool ring_before_full) {
    int n = 0;  // the list's length, set by every call
    auto at = [&](int j) {
        return window_position(s.start_pos, s.n_tokens, keys_as_decode(s), s.window_floor, pos, W, ring_before_full, j,
                               &n);
    };
    std::vector<int64_t> list{at(0)};
    for (int j = 1; j < n; ++j) list.push_back(at(j));
    return list;
}

std::vector<float> rope_frequencies(int dim, double theta, int original_seq_len, double factor, double beta_fast,
                                    double beta_slow, YarnRamp ramp) {
    std::vector<float> freqs(static_cast<size_t>(dim / 2));
    const float base = static_cast<float>(theta);
    for (int i = 0; i < dim / 2; ++i)
        freqs[i] = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
    if (original_seq_len > 0) {
        auto corrected = [&](double rotations) {
            return dim * std::log(original_seq_len / (rotations * 2 * M_PI)) / (2 * std::log(theta));
        };
        double low = std::max(std::floor(corrected(beta_fast)), 0.0);
        double high = std::min(std::ceil(corrected(beta_slow)), static_cast<double>(dim - 1));
        float denom;
        if (ramp == YarnRamp::kMinWidth) {
            denom = static_cast<float>(std::max(high - low, 1e-3));
        } else {
            if (low == high) high += 0.001;
            denom = static_cast<float>(high - low);
        }
        const float f = static_cast<float>(factor);
        for (int i = 0; i < dim / 2; ++i) {
            float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) / denom, 0.0f, 1.0f);
            float smooth = 1.0f - ramp;
            freqs[i] = freqs[i] / f * (1.0f - smooth) + freqs[i] * smooth;
        }
    }
    return freqs;
}

}  // namespace peregrine
