#include "ops/forward_batch.h"

namespace peregrine {

BatchMode batch_mode_of(const ForwardBatch& batch) {
    bool decode = !batch.seqs.empty(), prefill = !batch.seqs.empty();
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
        const BatchSeq& s = batch.seqs[i];
        decode = decode && s.n_tokens == 1 && s.row0 == static_cast<int>(i);
        prefill = prefill && s.n_tokens > 1;
    }
    return decode ? BatchMode::decode : prefill ? BatchMode::prefill : BatchMode::mixed;
}

}  // namespace peregrine
