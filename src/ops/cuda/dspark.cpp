// DSpark head on the GPU (cf. the reference's DSpark methods in cpu/attention.cpp and cpu_backend.cpp): the
// stages' window K=V fed from the backbone, the draft block's attention over the window ring and the whole
// block, the Markov bias row and the confidence head.
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_check.h"
#include "util/error.h"

#include <cuda_runtime.h>

#include <cmath>

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
            dst[r] = layout_.entry<uint8_t>(s.state->pool, s.state->pages, L.window, pos[r]);
        }
    auto pos_d = upload(pos);
    Tensor kv = window_kv(x, w, rope_freqs(info), pos_d.ptr, T, L.window.format);
    auto dst_d = upload(dst);
    store_entries(kv.f32(), T, L.window.format, dst_d.ptr);
}

Tensor CudaBackend::dspark_attention(const Tensor& x, const AttentionWeight& w, const AttentionLayerInfo& info,
                                     const SeqState& state, int64_t pos) {
    OpTimer op_(*this, "dspark_attention");
    const int B = static_cast<int>(x.dim(0)), H = cfg_.n_heads, D = cfg_.head_dim, W = cfg_.window_size;
    const float* freqs = rope_freqs(info);
    std::vector<int64_t> positions(static_cast<size_t>(B));
    for (int i = 0; i < B; ++i) positions[static_cast<size_t>(i)] = pos + 1 + i;
    auto pos_d = upload(positions);
    Tensor qr = rms_norm(run_linear(x, w.wq_a), w.q_norm);
    Tensor q = project_queries(qr, w, freqs, pos_d.ptr, B);
    const LayerStateLayout& L = layout_.layers.at(static_cast<size_t>(info.layer));
    Tensor kv = window_kv(x, w, freqs, pos_d.ptr, B, L.window.format);
    // Keys (the same for every block row): the window ring listed by slot (slot j holds the latest position
    // <= pos with position % W == j), then every block token (packed into window entries of a scratch, so that
    // every key is read the same way).
    const EntryFormat& f = L.window.format;
    auto block = device_alloc(static_cast<size_t>(B) * static_cast<size_t>(f.bytes));
    std::vector<uint8_t*> block_entries;
    std::vector<const uint8_t*> keys;
    for (int64_t j = 0; j < std::min<int64_t>(W, pos + 1); ++j) {
        const int64_t p = pos - ((pos - j) % W + W) % W;
        keys.push_back(layout_.entry<uint8_t>(state.pool, state.pages, L.window, p));
    }
    for (int i = 0; i < B; ++i) {
        block_entries.push_back(static_cast<uint8_t*>(block.get()) +
                                static_cast<size_t>(i) * static_cast<size_t>(f.bytes));
        keys.push_back(block_entries.back());
    }
    auto block_d = upload(block_entries);
    store_entries(kv.f32(), B, f, block_d.ptr);
    const int n = static_cast<int>(keys.size());
    std::vector<const uint8_t*> all;
    for (int i = 0; i < B; ++i) all.insert(all.end(), keys.begin(), keys.end());
    auto keys_d = upload(all);
    auto nkeys_d = upload(std::vector<int32_t>(static_cast<size_t>(B), n));
    KeyRefs kr;
    kr.keys = keys_d.ptr;
    kr.nkeys = nkeys_d.ptr;
    kr.maxk = n;
    kr.win = kr.comp = f;
    Tensor o = empty(DType::F32, {B, H, D});
    sparse_attention(q.f32(), B, H, D, static_cast<float>(std::pow(D, -0.5)), dev_f32(w.attn_sink), kr, o.f32());
    return project_output(o, w, freqs, pos_d.ptr, B);
}

Tensor CudaBackend::markov_bias(const DSparkWeight& w, int32_t id) {
    OpTimer op_(*this, "markov_bias");
    const int64_t V = w.markov_head.dim(0), R = w.markov_head.dim(1);
    PEREGRINE_CHECK(id >= 0 && id < w.markov_embed.dim(0), "markov_bias: token id {} out of range", id);
    // markov_head(markov_embed[id]) in fp32: an F32-compute linear over the bf16 head rows.
    Tensor e = Tensor::zeros(DType::F32, {1, R});
    for (int64_t k = 0; k < R; ++k) e.f32()[k] = bf16_to_f32(w.markov_embed.data<uint16_t>()[id * R + k]);
    LinearWeight head;
    head.kind = LinearWeight::Kind::F32;
    head.out = static_cast<int>(V);
    head.in = static_cast<int>(R);
    head.w = w.markov_head;
    return to_host(run_linear(to_device(e), head)).reshaped({V});
}

Tensor CudaBackend::dspark_confidence(const DSparkWeight& w, const Tensor& x, const std::vector<int32_t>& ids) {
    OpTimer op_(*this, "dspark_confidence");
    const int64_t B = x.dim(0), R = w.markov_embed.dim(1);
    Tensor m = Tensor::zeros(DType::F32, {B, R});
    for (int64_t i = 0; i < B; ++i)
        for (int64_t k = 0; k < R; ++k)
            m.f32()[i * R + k] = bf16_to_f32(w.markov_embed.data<uint16_t>()[ids.at(static_cast<size_t>(i)) * R + k]);
    Tensor in = concat_cols({x, to_device(m)});
    return to_host(run_linear(in, w.confidence)).reshaped({B});
}

}  // namespace peregrine::cuda
