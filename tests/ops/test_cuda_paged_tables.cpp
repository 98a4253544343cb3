// Key-address tables worked out on the device from the step's page tables (Numerics::Fast) against the
// host-built tables of the Exact path, on the state layout of a 4-layer synthetic V4.1-Flash model (16-token
// pages, shuffled over the pool): every address identical, for decode at 131072 tokens of context and for a
// prefill step (a 2048-token chunk at the end of 131072 tokens, a one-shot prefill, a decode row, a sequence
// without tokens); also V4 HCA's every-visible-entry lists and the window K=V store. Then the indexer layer's path with either table (scores, bf16 key gather, top-k, key
// lists, sparse attention) gives bit-identical results. Prints the host and device time of the tables.
// Skipped without a GPU; "PARITY" lines are collected by tools/gpu/check.sh.
#include "cuda_test_util.h"
#include "model/model.h"
#include "ops/attention_plan.h"
#include "ops/backend.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/paged_state.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>

using namespace peregrine;
using cuda::CudaBackend;

namespace {

double host_ms(const std::function<void()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

template <typename T>
std::vector<T> host(const T* p, size_t n) {
    std::vector<T> v(n);
    if (n) cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
}

std::vector<float> fp4_rows(int64_t rows, int width, uint64_t seed) {
    std::vector<float> v(static_cast<size_t>(rows * width));
    std::mt19937_64 g(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (auto& x : v) x = round_bf16(n(g));
    for (int64_t r = 0; r < rows; ++r) qdq_fp4_ue8m0(v.data() + r * width, width, 32);
    return v;
}

// Sequences (start_pos, n_tokens) with the pages of each table drawn from its own shuffled ids in `pool`.
struct Step {
    std::vector<SeqState> states;
    ForwardBatch batch;
};

Step make_step(const StateLayout& layout, const std::array<uint8_t*, kPageTables>& pool, int64_t pool_pages,
               const std::vector<std::pair<int64_t, int>>& seqs, uint64_t seed) {
    Step s;
    s.states.resize(seqs.size());
    std::array<std::vector<int32_t>, kPageTables> ids;
    for (int t = 0; t < kPageTables; ++t) {
        ids[t].resize(static_cast<size_t>(pool_pages));
        std::iota(ids[t].begin(), ids[t].end(), 0);
        std::shuffle(ids[t].begin(), ids[t].end(), std::mt19937_64(seed + static_cast<uint64_t>(t)));
    }
    size_t next = 0;
    int row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
        SeqState& st = s.states[i];
        st.pool = pool;
        const int64_t n = layout.pages_for(seqs[i].first + seqs[i].second);
        if (next + static_cast<size_t>(n) > static_cast<size_t>(pool_pages)) throw std::runtime_error("test pool too small");
        for (int64_t j = 0; j < n; ++j)
            st.pages.push_back({ids[kHistoryPages][next + static_cast<size_t>(j)], ids[kWindowPages][next + static_cast<size_t>(j)]});
        next += static_cast<size_t>(n);
        st.n_cached = seqs[i].first;
        s.batch.seqs.push_back({&st, seqs[i].first, seqs[i].second, row});
        row += seqs[i].second;
    }
    s.batch.token_ids.assign(static_cast<size_t>(row), 1);
    return s;
}

int64_t pages_needed(const StateLayout& layout, const std::vector<std::pair<int64_t, int>>& seqs) {
    int64_t n = 0;
    for (auto& q : seqs) n += layout.pages_for(q.first + q.second);
    return n;
}

// The Exact path's host tables (cuda/attention.cpp).
struct HostTable {
    std::vector<const uint8_t*> table;
    std::vector<int64_t> rowbase;
};
HostTable host_entry_table(const StateLayout& layout, ForwardBatch& batch, const StateSection& sec, int ratio) {
    HostTable h;
    h.rowbase.resize(static_cast<size_t>(batch.rows()));
    for (auto& s : batch.seqs) {
        const int64_t base = static_cast<int64_t>(h.table.size()), wseq = (s.start_pos + s.n_tokens) / ratio;
        for (int64_t j = 0; j < wseq; ++j)
            h.table.push_back(layout.entry<uint8_t>(*s.state, sec, j));
        for (int i = 0; i < s.n_tokens; ++i) h.rowbase[static_cast<size_t>(s.row0 + i)] = base;
    }
    return h;
}
void host_window_table(const StateLayout& layout, ForwardBatch& batch, const StateSection& sec, int W,
                       bool ring_before_full, std::vector<const uint8_t*>& win, std::vector<int32_t>& nwin) {
    auto rows = row_infos(batch);
    const size_t T = rows.size();
    win.assign(T * W, nullptr);
    nwin.assign(T, 0);
    for (size_t t = 0; t < T; ++t) {
        auto list = window_list(*rows[t].seq, rows[t].pos, W, ring_before_full);
        nwin[t] = static_cast<int32_t>(list.size());
        SeqState& st = *rows[t].seq->state;
        for (size_t j = 0; j < list.size(); ++j)
            if (list[j] >= 0) win[t * W + j] = layout.entry<uint8_t>(st, sec, list[j]);
    }
}

// Row t's entries j < (start_pos + n_tokens) / ratio resolve to the same address through either table.
int64_t table_mismatches(ForwardBatch& batch, int ratio, const HostTable& h, const cuda::AddressTable& d,
                         const std::vector<int64_t>& drowbase) {
    auto dt = host(d.table, static_cast<size_t>(d.n));
    int64_t bad = 0;
    for (auto& s : batch.seqs)
        for (int i = 0; i < s.n_tokens; ++i) {
            const size_t t = static_cast<size_t>(s.row0 + i);
            for (int64_t j = 0; j < (s.start_pos + s.n_tokens) / ratio; ++j)
                bad += h.table[static_cast<size_t>(h.rowbase[t] + j)] != dt[static_cast<size_t>(drowbase[t] + j)];
        }
    return bad;
}

struct Model4 {
    ModelConfig cfg = synthetic_v41_flash_config(4);
    StateLayout layout = make_state_layout(cfg, 16);
    std::vector<AttentionLayerInfo> infos = attention_layer_infos(cfg);
};

int64_t kmax_of(ForwardBatch& batch, int ratio) {
    int64_t k = 0;
    for (auto& s : batch.seqs) k = std::max(k, (s.start_pos + s.n_tokens) / ratio);
    return k;
}

// The window entries decoded to rows (prefill-sized attention), on a pool of readable entries: every list slot
// points at the row decoded from the entry the host lists there (the row's source address, and for a sample of
// slots the row's bf16 values against a decoding of the host's entry).
void check_window_rows(const Model4& m, Step& st, const cuda::PagedSeqs& paged, const StateSection& sec,
                       const std::string& what) {
    const int64_t T = st.batch.rows();
    const int W = m.cfg.window_size, dim = sec.format.dim;
    std::vector<const uint8_t*> hw;
    std::vector<int32_t> hn;
    host_window_table(m.layout, st.batch, sec, W, true, hw, hn);
    auto wr = cuda::device_window_rows(paged, st.batch, sec, W, true);
    EXPECT_EQ(host(wr.table.nwin, static_cast<size_t>(T)), hn) << what;
    const auto src = host(wr.src.table, static_cast<size_t>(wr.src.n));
    const auto list = host(wr.table.win.table, static_cast<size_t>(T * W));
    const uint8_t* base = static_cast<const uint8_t*>(wr.rows.get());
    const int64_t rb = 2 * static_cast<int64_t>(dim);
    int64_t bad = 0;
    std::vector<const uint8_t*> sample_entries;
    std::vector<int64_t> sample_rows;
    for (size_t i = 0; i < list.size(); ++i) {
        if (!hw[i]) {
            bad += list[i] != nullptr;
            continue;
        }
        const int64_t off = list[i] ? list[i] - base : -1, r = off / rb;
        if (off < 0 || off % rb != 0 || r >= static_cast<int64_t>(src.size()) || src[static_cast<size_t>(r)] != hw[i]) {
            ++bad;
            continue;
        }
        if (i % 7 == 0) {
            sample_entries.push_back(hw[i]);
            sample_rows.push_back(r);
        }
    }
    EXPECT_EQ(bad, 0) << what << ": window row slots that miss their entry";
    const int64_t ns = static_cast<int64_t>(sample_entries.size());
    auto sd = cuda::upload(sample_entries);
    auto want_d = cuda::device_alloc(static_cast<size_t>(std::max<int64_t>(ns, 1) * rb));
    cuda::gather_keys_bf16(sd.ptr, ns, sec.format, static_cast<uint16_t*>(want_d.get()));
    const auto want = host(static_cast<const uint16_t*>(want_d.get()), static_cast<size_t>(ns * dim));
    const auto rows = host(reinterpret_cast<const uint16_t*>(base), src.size() * static_cast<size_t>(dim));
    int64_t differ = 0;
    for (int64_t k = 0; k < ns; ++k)
        differ += std::memcmp(want.data() + k * dim, rows.data() + sample_rows[static_cast<size_t>(k)] * dim,
                              static_cast<size_t>(rb)) != 0;
    EXPECT_EQ(differ, 0) << what << ": decoded window rows";
    std::printf("PARITY attn paged window rows %s: %lld rows decoded, %lld slots, %lld sampled rows identical\n",
                what.c_str(), static_cast<long long>(src.size()), static_cast<long long>(list.size()),
                static_cast<long long>(ns - differ));
}

void check_window_rows(const Model4& m, Step& st, const std::string& what) {
    auto paged = cuda::upload_paged_step(m.layout, st.batch);
    for (const auto& info : m.infos)
        check_window_rows(m, st, paged.seqs, m.layout.layers[static_cast<size_t>(info.layer)].window,
                          what + " layer " + std::to_string(info.layer));
}

// Every section of every layer through both tables.
void check_tables(const Model4& m, Step& st, const std::string& what) {
    auto paged = cuda::upload_paged_step(m.layout, st.batch);
    const int64_t T = st.batch.rows();
    const int W = m.cfg.window_size;
    for (const auto& info : m.infos) {
        const LayerStateLayout& L = m.layout.layers[static_cast<size_t>(info.layer)];
        std::vector<const uint8_t*> hw;
        std::vector<int32_t> hn;
        host_window_table(m.layout, st.batch, L.window, W, true, hw, hn);
        auto dw = cuda::device_window_table(paged.seqs, L.window, T, W, true);
        EXPECT_EQ(host(dw.nwin, static_cast<size_t>(T)), hn) << what << " layer " << info.layer;
        EXPECT_TRUE(host(dw.win.table, static_cast<size_t>(T * W)) == hw) << what << " window, layer " << info.layer;
        // V4 HCA's every-visible-entry lists, as attention.cpp lists them on the host (unless too big to list here).
        if (info.ratio > 0 && T * kmax_of(st.batch, info.ratio) <= (int64_t{1} << 25)) {
            auto rows = row_infos(st.batch);
            std::vector<int32_t> counts(static_cast<size_t>(T)), vis(static_cast<size_t>(T));
            int kmax = 0;
            for (int64_t t = 0; t < T; ++t) {
                const BatchSeq& s = *rows[static_cast<size_t>(t)].seq;
                vis[static_cast<size_t>(t)] = static_cast<int32_t>((rows[static_cast<size_t>(t)].pos + 1) / info.ratio);
                counts[static_cast<size_t>(t)] = is_prefill(s)
                                                     ? static_cast<int32_t>((s.start_pos + s.n_tokens) / info.ratio)
                                                     : vis[static_cast<size_t>(t)];
                kmax = std::max(kmax, counts[static_cast<size_t>(t)]);
            }
            std::vector<int32_t> list(static_cast<size_t>(T) * std::max(kmax, 1), -1);
            for (int64_t t = 0; t < T; ++t)
                for (int32_t j = 0; j < counts[static_cast<size_t>(t)]; ++j)
                    list[static_cast<size_t>(t * kmax + j)] = j < vis[static_cast<size_t>(t)] ? j : -1;
            auto dl = cuda::device_alloc(sizeof(int32_t) * list.size()), dc = cuda::device_alloc(sizeof(int32_t) * T);
            cuda::paged_all_entries(paged.seqs, info.ratio, T, kmax, static_cast<int32_t*>(dl.get()),
                                    static_cast<int32_t*>(dc.get()));
            EXPECT_EQ(host(static_cast<int32_t*>(dc.get()), static_cast<size_t>(T)), counts)
                << what << " layer " << info.layer;
            if (kmax > 0) {
                EXPECT_TRUE(host(static_cast<int32_t*>(dl.get()), list.size()) == list)
                    << what << " layer " << info.layer;
            }
        }
        for (const StateSection* sec : {&L.comp, &L.index_k}) {
            if (!sec->present()) continue;
            HostTable h = host_entry_table(m.layout, st.batch, *sec, info.ratio);
            std::vector<int64_t> rb;
            auto d = cuda::device_entry_table(paged.seqs, st.batch, *sec, info.ratio, rb);
            EXPECT_EQ(table_mismatches(st.batch, info.ratio, h, d, rb), 0)
                << what << " layer " << info.layer << (sec == &L.comp ? " compressed" : " index keys");
        }
    }
}

const AttentionLayerInfo& indexer_layer(const Model4& m) {
    for (const auto& i : m.infos)
        if (i.has_indexer && i.owns_index_k) return i;
    throw std::runtime_error("no indexer layer");
}

// Host and device milliseconds of the tables one layer's attention builds (index keys, compressed entries,
// window) on the indexer layer.
void timing(const Model4& m, Step& st, const std::string& what) {
    const auto& info = indexer_layer(m);
    const LayerStateLayout& L = m.layout.layers[static_cast<size_t>(info.layer)];
    const int64_t T = st.batch.rows();
    const int W = m.cfg.window_size;
    const double ms_host = host_ms([&] {
        HostTable k = host_entry_table(m.layout, st.batch, L.index_k, info.ratio);
        HostTable c = host_entry_table(m.layout, st.batch, L.comp, info.ratio);
        std::vector<const uint8_t*> hw;
        std::vector<int32_t> hn;
        host_window_table(m.layout, st.batch, L.window, W, true, hw, hn);
        auto a = cuda::upload(k.table), b = cuda::upload(c.table), d = cuda::upload(hw);
        cudaDeviceSynchronize();
    });
    const double ms_upload = host_ms([&] {
        auto p = cuda::upload_paged_step(m.layout, st.batch);
        cudaDeviceSynchronize();
    });
    auto paged = cuda::upload_paged_step(m.layout, st.batch);
    std::vector<int64_t> rb;
    const float ms_dev = peregrine::test::device_ms([&] {
        auto k = cuda::device_entry_table(paged.seqs, st.batch, L.index_k, info.ratio, rb);
        auto c = cuda::device_entry_table(paged.seqs, st.batch, L.comp, info.ratio, rb);
        auto w = cuda::device_window_table(paged.seqs, L.window, T, W, true);
    });
    std::printf("PARITY attn paged tables %s: host tables %.3f ms per layer, device %.3f ms per layer + page-table "
                "upload %.3f ms per step\n",
                what.c_str(), ms_host, ms_dev, ms_upload);
}

// The indexer layer's attention path on random state with the host tables and the device tables.
void check_pipeline(const Model4& m, Step& st, const std::string& what) {
    const auto& info = indexer_layer(m);
    const LayerStateLayout& L = m.layout.layers[static_cast<size_t>(info.layer)];
    const LayerStateLayout& KL = m.layout.layers[static_cast<size_t>(info.index_k_source)];
    const LayerStateLayout& CL =
        m.layout.layers[static_cast<size_t>(info.comp_source >= 0 ? info.comp_source : info.layer)];
    ForwardBatch& batch = st.batch;
    const int T = batch.rows(), W = m.cfg.window_size, nh = m.cfg.index_n_heads, hd = m.cfg.index_head_dim;
    const int H = m.cfg.n_heads, D = m.cfg.head_dim, k = m.cfg.index_topk, ratio = info.ratio;
    auto rows = row_infos(batch);
    std::vector<int64_t> width(static_cast<size_t>(T)), visible(static_cast<size_t>(T));
    int64_t stride = 1;
    for (int t = 0; t < T; ++t) {
        const BatchSeq& s = *rows[static_cast<size_t>(t)].seq;
        width[static_cast<size_t>(t)] = (s.start_pos + s.n_tokens) / ratio;
        visible[static_cast<size_t>(t)] = (rows[static_cast<size_t>(t)].pos + 1) / ratio;
        stride = std::max(stride, width[static_cast<size_t>(t)]);
    }
    auto wd = cuda::upload(width), vd = cuda::upload(visible);
    auto q = cuda::upload(fp4_rows(static_cast<int64_t>(T) * nh, hd, 41));
    std::vector<float> wh(static_cast<size_t>(T) * nh);
    std::mt19937_64 g(43);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& x : wh) x = round_bf16(nd(g) * 0.01f);
    auto wts = cuda::upload(wh);

    // Tables both ways.
    HostTable hk = host_entry_table(m.layout, batch, KL.index_k, ratio),
              hc = host_entry_table(m.layout, batch, CL.comp, ratio);
    std::vector<const uint8_t*> hw;
    std::vector<int32_t> hn;
    host_window_table(m.layout, batch, L.window, W, true, hw, hn);
    auto hk_d = cuda::upload(hk.table), hc_d = cuda::upload(hc.table), hw_d = cuda::upload(hw);
    auto hkb = cuda::upload(hk.rowbase), hcb = cuda::upload(hc.rowbase);
    auto hn_d = cuda::upload(hn);
    auto paged = cuda::upload_paged_step(m.layout, batch);
    std::vector<int64_t> dkr, dcr;
    auto dk = cuda::device_entry_table(paged.seqs, batch, KL.index_k, ratio, dkr);
    auto dc = cuda::device_entry_table(paged.seqs, batch, CL.comp, ratio, dcr);
    auto dw = cuda::device_window_table(paged.seqs, L.window, T, W, true);
    auto dkb = cuda::upload(dkr), dcb = cuda::upload(dcr);

    // Scores (streamed), and the bf16 key gather of the tensor-core scorer.
    Tensor sh = cuda::empty(DType::F32, {T, stride}), sd = cuda::empty(DType::F32, {T, stride});
    const EntryFormat& kf = KL.index_k.format;
    cuda::index_scores_stream(q.ptr, wts.ptr, nullptr, T, nh, hd, wd.ptr, vd.ptr, hkb.ptr, hk_d.ptr, kf, stride,
                              sh.f32());
    cuda::index_scores_stream(q.ptr, wts.ptr, nullptr, T, nh, hd, wd.ptr, vd.ptr, dkb.ptr, dk.table, kf, stride,
                              sd.f32());
    auto a = host(sh.f32(), static_cast<size_t>(T) * stride), b = host(sd.f32(), static_cast<size_t>(T) * stride);
    int64_t score_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) score_diff += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    EXPECT_EQ(score_diff, 0) << what;
    int64_t gather_diff = 0;
    {
        // Per sequence, its keys in table order: the same bf16 rows through either table.
        auto gh = cuda::device_alloc(sizeof(uint16_t) * std::max<size_t>(hk.table.size(), 1) * hd);
        auto gd = cuda::device_alloc(sizeof(uint16_t) * static_cast<size_t>(std::max<int64_t>(dk.n, 1)) * hd);
        cuda::gather_keys_bf16(hk_d.ptr, static_cast<int64_t>(hk.table.size()), kf, static_cast<uint16_t*>(gh.get()));
        cuda::gather_keys_bf16(dk.table, dk.n, kf, static_cast<uint16_t*>(gd.get()));
        auto x = host(static_cast<uint16_t*>(gh.get()), hk.table.size() * hd);
        auto y = host(static_cast<uint16_t*>(gd.get()), static_cast<size_t>(dk.n) * hd);
        for (auto& s : batch.seqs) {
            if (s.n_tokens == 0) continue;
            const size_t hb = static_cast<size_t>(hk.rowbase[static_cast<size_t>(s.row0)]) * hd;
            const size_t db = static_cast<size_t>(dkr[static_cast<size_t>(s.row0)]) * hd;
            const size_t n = static_cast<size_t>((s.start_pos + s.n_tokens) / ratio) * hd;
            for (size_t i = 0; i < n; ++i) gather_diff += x[hb + i] != y[db + i];
        }
        EXPECT_EQ(gather_diff, 0) << what;
    }

    // Top-k, key lists, sparse attention.
    auto tmp = cuda::device_alloc(sizeof(int32_t) * T * k), sel = cuda::device_alloc(sizeof(int32_t) * T * k);
    auto nsel = cuda::device_alloc(sizeof(int32_t) * T);
    cuda::topk_rows_fast(sd.f32(), T, stride, wd.ptr, vd.ptr, k, true, static_cast<int32_t*>(tmp.get()),
                         static_cast<int32_t*>(sel.get()), static_cast<int32_t*>(nsel.get()));
    const int maxk = W + k;
    auto kh = cuda::device_alloc(sizeof(uint8_t*) * T * maxk), kd = cuda::device_alloc(sizeof(uint8_t*) * T * maxk);
    auto nh_ = cuda::device_alloc(sizeof(int32_t) * T), nd_ = cuda::device_alloc(sizeof(int32_t) * T);
    cuda::build_keys(T, hw_d.ptr, hn_d.ptr, W, static_cast<int32_t*>(sel.get()), static_cast<int32_t*>(nsel.get()), k,
                     hc_d.ptr, hcb.ptr, static_cast<const uint8_t**>(kh.get()), static_cast<int32_t*>(nh_.get()), maxk);
    cuda::build_keys(T, dw.win.table, dw.nwin, W, static_cast<int32_t*>(sel.get()), static_cast<int32_t*>(nsel.get()),
                     k, dc.table, dcb.ptr, static_cast<const uint8_t**>(kd.get()), static_cast<int32_t*>(nd_.get()),
                     maxk);
    auto cnt_h = host(static_cast<int32_t*>(nh_.get()), static_cast<size_t>(T));
    EXPECT_EQ(cnt_h, host(static_cast<int32_t*>(nd_.get()), static_cast<size_t>(T))) << what;
    auto keys_h = host(static_cast<const uint8_t**>(kh.get()), static_cast<size_t>(T) * maxk);
    auto keys_d = host(static_cast<const uint8_t**>(kd.get()), static_cast<size_t>(T) * maxk);
    int64_t key_diff = 0, n_keys = 0;
    for (int t = 0; t < T; ++t)
        for (int j = 0; j < cnt_h[static_cast<size_t>(t)]; ++j, ++n_keys)
            key_diff += keys_h[static_cast<size_t>(t) * maxk + j] != keys_d[static_cast<size_t>(t) * maxk + j];
    EXPECT_EQ(key_diff, 0) << what;

    std::vector<float> qa(static_cast<size_t>(T) * H * D), sink(static_cast<size_t>(H));
    for (auto& x : qa) x = round_bf16(nd(g));
    for (auto& x : sink) x = nd(g);
    auto qd = cuda::upload(qa), skd = cuda::upload(sink);
    Tensor oh = cuda::empty(DType::F32, {T, H, D}), od = cuda::empty(DType::F32, {T, H, D});
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    cuda::KeyRefs rh, rd;
    rh.keys = static_cast<const uint8_t* const*>(kh.get());
    rh.nkeys = static_cast<int32_t*>(nh_.get());
    rh.nwin = hn_d.ptr;
    rd.keys = static_cast<const uint8_t* const*>(kd.get());
    rd.nkeys = static_cast<int32_t*>(nd_.get());
    rd.nwin = dw.nwin;
    rh.maxk = rd.maxk = maxk;
    rh.win = rd.win = L.window.format;
    rh.comp = rd.comp = CL.comp.format;
    cuda::sparse_attention(qd.ptr, T, H, D, scale, skd.ptr, rh, oh.f32(), true);
    cuda::sparse_attention(qd.ptr, T, H, D, scale, skd.ptr, rd, od.f32(), true);
    auto x = host(oh.f32(), static_cast<size_t>(T) * H * D), y = host(od.f32(), static_cast<size_t>(T) * H * D);
    int64_t out_diff = 0, finite = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        out_diff += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
        finite += std::isfinite(x[i]);
    }
    EXPECT_EQ(out_diff, 0) << what;
    EXPECT_EQ(finite, static_cast<int64_t>(x.size())) << what;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    std::printf("PARITY attn paged pipeline %s (%d rows, %lld keys listed): scores %s, bf16 gather %s, key lists %s, "
                "sparse attention %s\n",
                what.c_str(), T, static_cast<long long>(n_keys), score_diff ? "DIFFER" : "identical",
                gather_diff ? "DIFFER" : "identical", key_diff ? "DIFFER" : "identical",
                out_diff ? "DIFFER" : "identical");
}

// Window K=V rows (fp8-QDQ'd as the model stores them) encoded through the page tables land at the host's entry
// address of each row's position, byte for byte the host encoder's entries; and made from their projection and
// stored in one launch, they give the two launches' rows and entries.
void check_store(const Model4& m, Step& st, const std::string& what) {
    const StateSection& sec = m.layout.layers[0].window;
    const EntryFormat& f = sec.format;
    const int64_t T = st.batch.rows();
    const int width = f.dim;
    std::vector<float> src(static_cast<size_t>(T) * width);
    std::mt19937_64 g(53);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& x : src) x = round_bf16(nd(g) * std::ldexp(1.0f, static_cast<int>(g() % 40) - 20));
    for (int64_t t = 0; t < T; ++t) qdq_fp8(src.data() + t * width, width, m.cfg.act_block);
    auto sd = cuda::upload(src);
    auto paged = cuda::upload_paged_step(m.layout, st.batch);
    (void)cuda::state_encode_failures();
    cuda::paged_store_entries(sd.ptr, T, f, paged.seqs, cuda::paged_section(sec));
    EXPECT_EQ(cuda::state_encode_failures(), 0u) << what;
    auto rows = row_infos(st.batch);
    int64_t bad = 0;
    std::vector<uint8_t> got(static_cast<size_t>(f.bytes)), want(static_cast<size_t>(f.bytes));
    for (int64_t t = 0; t < T; ++t) {
        SeqState& s = *rows[static_cast<size_t>(t)].seq->state;
        const uint8_t* at = m.layout.entry<uint8_t>(s, sec, rows[static_cast<size_t>(t)].pos);
        cudaMemcpy(got.data(), at, got.size(), cudaMemcpyDeviceToHost);
        EXPECT_TRUE(encode_entry(f, src.data() + t * width, want.data()));
        bad += got != want;
    }
    EXPECT_EQ(bad, 0) << what;
    // The encoder checks rather than rounds: a row that was not QDQ'd is counted (e4m3 cannot hold 1 + 2^-7).
    {
        std::vector<float> raw(static_cast<size_t>(width), 1.0f);
        raw[3] = 1.0078125f;
        auto rd = cuda::upload(raw);
        auto scratch = cuda::device_alloc(static_cast<size_t>(f.bytes));
        auto dst = cuda::upload(std::vector<uint8_t*>{static_cast<uint8_t*>(scratch.get())});
        cuda::store_entries(rd.ptr, 1, f, dst.ptr);
        EXPECT_EQ(cuda::state_encode_failures(), 1u) << what;
    }
    std::printf("PARITY attn paged window store %s: %lld rows, %s\n", what.c_str(), static_cast<long long>(T),
                bad ? "MISPLACED" : "all at the host's addresses");

    // The window K=V made and stored in one launch (rms_norm_rope_qdq with a PagedRowStore) against the norm, RoPE
    // and QDQ kernel then paged_store_entries: the same rows and the same entry bytes at every row's position.
    std::vector<float> proj(static_cast<size_t>(T) * width), w(static_cast<size_t>(width)), freqs(32);
    for (auto& x : proj) x = round_bf16(nd(g) * std::ldexp(1.0f, static_cast<int>(g() % 8) - 4));
    for (auto& x : w) x = round_bf16(1.0f + 0.25f * nd(g));
    for (size_t k = 0; k < freqs.size(); ++k) freqs[k] = std::pow(10000.0f, -static_cast<float>(k) / 32.0f);
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = rows[static_cast<size_t>(t)].pos;
    auto pd = cuda::upload(proj), wd = cuda::upload(w), fd = cuda::upload(freqs);
    auto posd = cuda::upload(pos);
    auto ya = cuda::device_alloc(proj.size() * 4), yb = cuda::device_alloc(proj.size() * 4);
    const int rd = 64, kind = cuda::qdq_kind(f);
    auto entries = [&] {
        std::vector<uint8_t> all;
        for (int64_t t = 0; t < T; ++t) {
            SeqState& s = *rows[static_cast<size_t>(t)].seq->state;
            const uint8_t* at = m.layout.entry<uint8_t>(s, sec, rows[static_cast<size_t>(t)].pos);
            cudaMemcpy(got.data(), at, got.size(), cudaMemcpyDeviceToHost);
            all.insert(all.end(), got.begin(), got.end());
        }
        return all;
    };
    cuda::rms_norm_rope_qdq(pd.ptr, T, width, wd.ptr, 1e-6f, static_cast<float*>(ya.get()), posd.ptr, fd.ptr,
                            width - rd, rd, f.quant_dims, f.block, kind);
    cuda::paged_store_entries(static_cast<const float*>(ya.get()), T, f, paged.seqs, cuda::paged_section(sec));
    const std::vector<uint8_t> apart = entries();
    const cuda::PagedRowStore store{f, paged.seqs, cuda::paged_section(sec)};
    for (int64_t t = 0; t < T; ++t) {  // scribbled over, so that only the fused launch's stores can restore them
        SeqState& s = *rows[static_cast<size_t>(t)].seq->state;
        cudaMemset(m.layout.entry<uint8_t>(s, sec, rows[static_cast<size_t>(t)].pos), 0x5a, got.size());
    }
    cuda::rms_norm_rope_qdq(pd.ptr, T, width, wd.ptr, 1e-6f, static_cast<float*>(yb.get()), posd.ptr, fd.ptr,
                            width - rd, rd, f.quant_dims, f.block, kind, &store);
    EXPECT_EQ(cuda::state_encode_failures(), 0u) << what;
    const std::vector<uint8_t> fused = entries();
    const auto ra = host(static_cast<const float*>(ya.get()), proj.size()),
               rb = host(static_cast<const float*>(yb.get()), proj.size());
    const bool same_rows = std::memcmp(ra.data(), rb.data(), ra.size() * 4) == 0;
    EXPECT_TRUE(same_rows) << what;
    EXPECT_TRUE(fused == apart) << what;
    std::printf("PARITY attn window K=V made and stored in one launch %s: rows %s, entries %s\n", what.c_str(),
                same_rows ? "identical" : "DIFFER", fused == apart ? "identical" : "DIFFER");
}

// Device memory for `pages` pages of each table, of random valid entries.
struct RandomPool {
    std::array<std::shared_ptr<void>, kPageTables> keep;
    std::array<uint8_t*, kPageTables> base{};
};
RandomPool random_pool(const StateLayout& layout, int64_t pages) {
    RandomPool p;
    for (int t = 0; t < kPageTables; ++t) {
        const int64_t page_bytes = static_cast<int64_t>(layout.page_bytes[static_cast<size_t>(t)]);
        p.keep[t] = cuda::device_alloc(static_cast<size_t>(pages * page_bytes));
        p.base[t] = static_cast<uint8_t*>(p.keep[t].get());
        cuda::fill_random_bf16(reinterpret_cast<float*>(p.base[t]), pages * page_bytes / 4, 77 + t);
        for (const auto& L : layout.layers)
            for (const StateSection* sec : {&L.window, &L.comp, &L.index_k})
                if (sec->present() && sec->table == t)
                    cuda::sanitize_entries(p.base[t], pages, page_bytes, static_cast<int64_t>(sec->offset),
                                           sec->entries_per_page, sec->format);
    }
    return p;
}

const std::vector<std::pair<int64_t, int>> kDecode8 = {{131071, 1}, {131071, 1}, {131070, 1}, {131000, 1},
                                                       {130003, 1}, {131071, 1}, {100000, 1}, {131071, 1}};
const std::vector<std::pair<int64_t, int>> kPrefill = {
    {131072 - 2048, 2048}, {0, 300}, {70001, 1}, {5000, 0}, {0, 129}, {4096, 17}};

TEST(CudaPagedTables, DecodeSameAddressesAndResults) {
    REQUIRE_GPU();
    Model4 m;
    const int64_t pages = pages_needed(m.layout, kDecode8) + 64;
    auto pool = random_pool(m.layout, pages);
    Step st = make_step(m.layout, pool.base, pages, kDecode8, 1);
    check_tables(m, st, "decode 8x131072");
    check_window_rows(m, st, "decode 8x131072");
    check_pipeline(m, st, "decode 8x131072");
    check_store(m, st, "decode 8x131072");
    timing(m, st, "decode 8x131072");
}

TEST(CudaPagedTables, PrefillSameAddressesAndResults) {
    REQUIRE_GPU();
    Model4 m;
    const int64_t pages = pages_needed(m.layout, kPrefill) + 64;
    auto pool = random_pool(m.layout, pages);
    Step st = make_step(m.layout, pool.base, pages, kPrefill, 2);
    check_tables(m, st, "prefill 2048-token chunk at 131072 + others");
    check_window_rows(m, st, "prefill 2048-token chunk at 131072 + others");
    check_pipeline(m, st, "prefill 2048-token chunk at 131072 + others");
    check_store(m, st, "prefill 2048-token chunk at 131072 + others");
    timing(m, st, "prefill 2048-token chunk at 131072 + others");
    for (BatchSeq& s : st.batch.seqs) s.decode_keys = true;  // batch-invariant keys: every row lists as decoding
    check_tables(m, st, "prefill, batch-invariant keys");
    check_pipeline(m, st, "prefill, batch-invariant keys");
}

// Addresses only (nothing is read): 32 sequences at 131072 tokens over a pool that is never dereferenced.
TEST(CudaPagedTables, Decode32Timing) {
    REQUIRE_GPU();
    Model4 m;
    std::vector<std::pair<int64_t, int>> seqs(32, {131071, 1});
    const int64_t pages = pages_needed(m.layout, seqs);
    auto base = cuda::device_alloc(16);
    uint8_t* b = static_cast<uint8_t*>(base.get());
    Step st = make_step(m.layout, {b, b}, pages, seqs, 3);
    check_tables(m, st, "decode 32x131072");
    timing(m, st, "decode 32x131072");
}

}  // namespace

namespace {

// The device encoder (store_entries) against the host's encode_entry, byte for byte, in every entry format:
// rows of values decoded from random valid entries (so each is exactly some code times some scale; the encoder
// then picks its own scale), V4.1's window (e4m3, blocks of 32), compressed latents (e2m1 under e4m3 scales) and
// indexer keys (e2m1 under ue8m0 scales), V4's window (e4m3 blocks of 64 and a bf16 tail).
TEST(CudaPagedTables, EncodersMatchHostBytes) {
    REQUIRE_GPU();
    const std::vector<std::pair<const char*, EntryFormat>> formats = {
        {"fp8 512 / 32", fp8_entry_format(512, 512, 32)},
        {"fp8 448 / 64 + bf16", fp8_entry_format(512, 448, 64)},
        {"fp4 e4m3 512 / 16", fp4_entry_format(512, 16, true)},
        {"fp4 ue8m0 128 / 32", fp4_entry_format(128, 32, false)}};
    std::mt19937_64 g(91);
    for (const auto& [name, f] : formats) {
        const int rows = 96;
        std::vector<uint8_t> raw(static_cast<size_t>(f.bytes));
        std::vector<float> x(static_cast<size_t>(rows) * f.dim);
        for (int r = 0; r < rows; ++r) {
            for (auto& b : raw) b = static_cast<uint8_t>(g());
            const int nb = f.quant_dims / f.block;
            for (int i = 0; i < f.quant_dims && f.kind == kEntryFp8; ++i)
                if ((raw[static_cast<size_t>(i)] & 0x7f) == 0x7f) raw[static_cast<size_t>(i)] ^= 1;  // no NaN codes
            for (int i = f.quant_dims; i < f.dim && f.kind == kEntryFp8; ++i) {  // bf16 near 1
                uint8_t& hi = raw[static_cast<size_t>(f.bf16_offset + 2 * (i - f.quant_dims) + 1)];
                hi = static_cast<uint8_t>((hi & 0x80) | 0x3f);
            }
            for (int b = 0; b < nb; ++b) {
                uint8_t& s = raw[static_cast<size_t>(f.scale_offset + b)];
                s = f.kind == kEntryFp4E4m3 ? static_cast<uint8_t>(0x30 | (s & 15))
                                            : static_cast<uint8_t>(120 + (s & 15));
            }
            if (r % 8 == 7)  // a block of zeros now and then
                for (int c = 0; c < f.block; ++c) raw[static_cast<size_t>(f.kind == kEntryFp8 ? c : c / 2)] = 0;
            for (int c = 0; c < f.dim; ++c) x[static_cast<size_t>(r) * f.dim + c] = entry_value(f, raw.data(), c);
        }
        auto xd = cuda::upload(x);
        auto pool = cuda::device_alloc(static_cast<size_t>(rows) * f.bytes);
        std::vector<uint8_t*> dst(static_cast<size_t>(rows));
        for (int r = 0; r < rows; ++r)
            dst[static_cast<size_t>(r)] = static_cast<uint8_t*>(pool.get()) + static_cast<size_t>(r) * f.bytes;
        auto dd = cuda::upload(dst);
        (void)cuda::state_encode_failures();
        cuda::store_entries(xd.ptr, rows, f, dd.ptr);
        EXPECT_EQ(cuda::state_encode_failures(), 0u) << name;
        auto got = host(static_cast<const uint8_t*>(pool.get()), static_cast<size_t>(rows) * f.bytes);
        int bad = 0;
        std::vector<uint8_t> want(static_cast<size_t>(f.bytes));
        for (int r = 0; r < rows; ++r) {
            EXPECT_TRUE(encode_entry(f, x.data() + static_cast<size_t>(r) * f.dim, want.data()))
                << name << " row " << r;
            bad += std::memcmp(want.data(), got.data() + static_cast<size_t>(r) * f.bytes, want.size()) != 0;
        }
        EXPECT_EQ(bad, 0) << name;
        std::printf("PARITY entry encoder %-22s %d rows: %s\n", name, rows,
                    bad ? "DIFFER from the host's bytes" : "the host's bytes");
    }
}

}  // namespace
