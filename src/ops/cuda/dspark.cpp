// DSpark's attention on the GPU (cf. the reference's in cpu/attention.cpp): the stages' window K=V fed from the
// backbone, and a draft block's attention over the window ring and the block (V4's MTP chain's as well).
#include "ops/attention_plan.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/paged_state.h"
#include "util/error.h"

#include <cuda_runtime.h>

#include <algorithm>

namespace peregrine::cuda {

Tensor CudaBackend::concat_cols(const std::vector<Tensor>& parts) {
    OpTimer op_(*this, "concat_cols");
    const int64_t T = parts.at(0).dim(0);
    int64_t width = 0;
    for (auto& p : parts) width += p.numel() / T;
    Tensor y = empty(DType::F32, {T, width});
    int64_t off = 0;
    for (auto& p : parts) {
        const int64_t w = p.numel() / T;
        if (T > 0 && w > 0)
            PG_CUDA(cudaMemcpy2DAsync(y.f32() + off, sizeof(float) * static_cast<size_t>(width), p.f32(),
                                      sizeof(float) * static_cast<size_t>(w), sizeof(float) * static_cast<size_t>(w),
                                      static_cast<size_t>(T), cudaMemcpyDeviceToDevice, 0));
        off += w;
    }
    return y;
}

void CudaBackend::store_window_kv(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                                  ForwardBatch& batch) {
    OpTimer op_(*this, "store_window_kv");
    const int T = batch.rows();
    const LayerStateLayout& L = layout_.layers.at(static_cast<size_t>(info.layer));
    std::vector<int64_t> pos(static_cast<size_t>(T));
    std::vector<uint8_t*> dst(static_cast<size_t>(T));
    for (auto& s : batch.seqs)
        for (int i = 0; i < s.n_tokens; ++i) {
            const size_t r = static_cast<size_t>(s.row0 + i);
            pos[r] = s.start_pos + i;
            dst[r] = layout_.entry<uint8_t>(*s.state, L.window, pos[r]);
        }
    auto pos_d = upload(pos);
    Tensor kv = window_kv(x, w, weights_.rope(info), pos_d.ptr, L.window.format);
    auto dst_d = upload(dst);
    store_entries(kv.f32(), T, L.window.format, dst_d.ptr);
}

Tensor CudaBackend::draft_attention(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                                    const std::vector<const SeqState*>& states, const std::vector<int64_t>& pos,
                                    bool chain) {
    OpTimer op_(*this, "draft_attention");
    const int N = static_cast<int>(states.size()), T = static_cast<int>(x.dim(0)), B = T / N;
    const int W = cfg_.window_size;
    PEREGRINE_CHECK(N > 0 && B * N == T && pos.size() == states.size(), "draft attention: blocks of equal length");
    const float* freqs = weights_.rope(info);
    const DraftRows rows = draft_rows(pos, B, chain);
    const int R = B - rows.first;
    auto pos_d = upload(rows.positions);
    auto q_pos_d = chain ? upload(rows.q_positions) : pos_d;
    const Tensor xq = chain ? gather_rows(x, rows.q_rows) : x;
    Tensor qr = rms_norm(linear_.run(xq, w.wq_a), w.q_norm);
    Tensor q = project_queries(qr, w, freqs, q_pos_d.ptr, N * R);
    const LayerStateLayout& L = layout_.layers.at(static_cast<size_t>(info.layer));
    Tensor kv = window_kv(x, w, freqs, pos_d.ptr, L.window.format);
    // The block tokens' K=V packed into window entries of a scratch, so that every key is read the same way.
    const EntryFormat& f = L.window.format;
    auto block = device_alloc(static_cast<size_t>(T) * static_cast<size_t>(f.bytes));
    std::vector<uint8_t*> block_entries;
    for (int r = 0; r < T; ++r)
        block_entries.push_back(static_cast<uint8_t*>(block.get()) + static_cast<size_t>(r) * f.bytes);
    auto block_d = upload(block_entries);
    store_entries(kv.f32(), T, f, block_d.ptr);
    // Each row's keys, listed on the device from the sequences' page tables: the stored window (draft_window_keys'
    // positions), then the block's rows. The step's row j is sequence j at its last stored position.
    ForwardBatch at;
    int64_t top = 0;
    for (int j = 0; j < N; ++j) {
        const SeqState* st = states[static_cast<size_t>(j)];
        // (upload_paged_step only reads the state)
        at.seqs.push_back({const_cast<SeqState*>(st), pos[static_cast<size_t>(j)], 1, j, st->window_floor});
        top = std::max(top, pos[static_cast<size_t>(j)] + 1);
    }
    at.token_ids.assign(static_cast<size_t>(N), 0);
    const PagedStep step = upload_paged_step(layout_, at);
    const int maxk = static_cast<int>(std::min<int64_t>(W, top)) + B;  // draft_window_keys lists at most that
    auto keys_d = device_alloc(sizeof(const uint8_t*) * static_cast<size_t>(N * R) * maxk);
    auto nkeys_d = device_alloc(sizeof(int32_t) * static_cast<size_t>(N * R));
    paged_draft_keys(step.seqs, paged_section(L.window), N, B, R, W, chain, static_cast<const uint8_t*>(block.get()),
                     f.bytes, maxk, static_cast<const uint8_t**>(keys_d.get()), static_cast<int32_t*>(nkeys_d.get()));
    KeyRefs kr;
    kr.keys = static_cast<const uint8_t* const*>(keys_d.get());
    kr.nkeys = static_cast<const int32_t*>(nkeys_d.get());
    kr.maxk = maxk;
    kr.win = kr.comp = f;
    // The backbone's attention kernels (the tensor cores under fast numerics).
    Tensor o = sparse_attend(q, w, kr, false, freqs, q_pos_d.ptr);
    return project_output(o, w, N * R);
}

void CudaBackend::add_into(Tensor& y, const Tensor& x) {
    PEREGRINE_CHECK(y.numel() == x.numel(), "add_into: {} and {} values", y.numel(), x.numel());
    if (y.device() != Device::CUDA) {  // logits the host samples
        const Tensor h = x.device() == Device::CUDA ? to_host(x) : x;
        for (int64_t i = 0; i < y.numel(); ++i) y.f32()[i] += h.f32()[i];
        return;
    }
    const Tensor d = x.device() == Device::CUDA ? x : to_device(x);
    add(y.f32(), d.f32(), y.numel());
}

}  // namespace peregrine::cuda
