#pragma once
// Host-side planning shared by every backend's attention: which sequence and position each row is, the
// reference's order of window keys, and the RoPE frequency table (the order and the table decide rounding).
#include "ops/backend.h"
#include "ops/model_format.h"

#include <vector>

namespace peregrine {

struct RowInfo {
    BatchSeq* seq;
    int64_t pos;
};

std::vector<RowInfo> row_infos(ForwardBatch& batch);

inline bool is_prefill(const BatchSeq& s) { return s.start_pos == 0; }

// Whether a sequence's rows list their keys (window_list, the compressed entries) as feeding one token a step would
// (position 0 a one-token prefill, then decode steps): decode steps, a speculative step's rows (each stands for its
// decode step: verification gives decoding's logits bit for bit) and batch-invariant sequences
// (BatchSeq::decode_keys).
inline bool keys_as_decode(const BatchSeq& s) {
    return (s.start_pos > 0 && (s.n_tokens == 1 || s.speculative)) || s.decode_keys;
}
// A one-shot prefill's rows list their window and compressed entries to the step's width, as the official prefill
// (the device's form: start_pos == 0 and the keys_as_decode field 0, paged_tables.cu).
inline bool lists_step_width(const BatchSeq& s) { return is_prefill(s) && !keys_as_decode(s); }

// Window keys of the query at `pos`, as positions (-1: none), in the official reference's order: a one-shot
// prefill lists the query's window oldest first; a decode step lists the ring from its oldest slot (once the
// window has filled, or with ring_before_full also before, unfilled slots first), and so does every row that
// lists its keys as decoding does (keys_as_decode); chunked prefill lists oldest first, padded to the window. The
// order sets the attention's blocks of 64 keys, so it moves bf16 roundings. Positions below s.window_floor are
// listed as -1.
std::vector<int64_t> window_list(const BatchSeq& s, int64_t pos, int window, bool ring_before_full);

// for_each_draft_window_key's positions (ops/draft_window.h) as a list.
std::vector<int64_t> draft_window_keys(int64_t pos, int64_t row_pos, int window, int64_t floor, bool chain);

// A drafter's rows (Backend::draft_attention, N = pos.size() blocks of B rows): every row's position pos[j] + 1 + i,
// and the rows that query (the whole block, or a chain's last row: from `first` on in each block) with theirs.
struct DraftRows {
    int first = 0;
    std::vector<int64_t> positions, q_positions;
    std::vector<int> q_rows;
};
DraftRows draft_rows(const std::vector<int64_t>& pos, int B, bool chain);

// RoPE frequencies f_i = theta^(-2i/dim) in fp32, with the official YaRN blend when original_seq_len > 0.
std::vector<float> rope_frequencies(int dim, double theta, int original_seq_len, double factor, double beta_fast,
                                    double beta_slow, YarnRamp ramp);

}  // namespace peregrine
