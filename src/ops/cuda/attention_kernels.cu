// Attention-path kernels: the compressor's state machine, indexer scoring, the V4.1 two-level candidate
// blocks, stable top-k, key-list assembly and the sparse online-softmax attention with sink
// (cf. cpu/attention.cpp; the key order, 64-key blocks and bf16 probabilities are the reference's).
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/pdl.cuh"

#include <cub/block/block_scan.cuh>

namespace peregrine::cuda {

namespace {

// A completed group's pooled value in one latent channel: the softmax of its n slots' scores weighting their kv
// values, summed in slot order and rounded to bf16 (the reference's arithmetic in its order). at(score, j): slot
// j's score (true) or kv value (false) in this channel.
template <class At>
__device__ __forceinline__ float pool_channel(int n, At at) {
    float mx = -INFINITY;
    for (int j = 0; j < n; ++j) mx = fmaxf(mx, at(true, j));
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) sum += exp_cr(at(true, j) - mx);
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc += at(false, j) * (exp_cr(at(true, j) - mx) / sum);
    return round_bf16(acc);
}

__global__ void compressor_kernel(CompressorArgs a) {
    pdl_enter();
    const int ratio = a.ratio, d = a.d, width = (a.overlap ? 2 : 1) * d, slots = (a.overlap ? 2 : 1) * ratio;
    float* kv_state = a.state;
    float* sc_state = a.state + static_cast<int64_t>(slots) * width;
    int e = a.emit_base;
    for (int i = 0; i < a.n_tokens; ++i) {
        const int64_t pos = a.start_pos + i, row = a.row0 + i;
        const int slot = static_cast<int>(pos % ratio) + (a.overlap ? ratio : 0);
        const float* kr = a.kv + row * width;
        const float* sr = a.score + row * width;
        for (int c = threadIdx.x; c < width; c += blockDim.x) {
            kv_state[slot * width + c] = kr[c];
            sc_state[slot * width + c] = a.ape ? sr[c] + a.ape[(pos % ratio) * width + c] : sr[c];
        }
        __syncthreads();
        if ((pos + 1) % ratio == 0) {
            const int n = a.overlap ? 2 * ratio : ratio;
            for (int c = threadIdx.x; c < d; c += blockDim.x) {
                auto at = [&](bool score, int j) {
                    const float* st = score ? sc_state : kv_state;
                    return a.overlap ? (j < ratio ? st[j * width + c] : st[j * width + d + c]) : st[j * width + c];
                };
                a.pooled[static_cast<int64_t>(e) * d + c] = pool_channel(n, at);
            }
            ++e;
            __syncthreads();
            if (a.overlap) {
                for (int c = threadIdx.x; c < ratio * width; c += blockDim.x) {
                    kv_state[c] = kv_state[ratio * width + c];
                    sc_state[c] = sc_state[ratio * width + c];
                }
                __syncthreads();
            }
        }
        for (int k = 0; k < 2; ++k) {  // the page snapshot, the speculative step's carry slot
            float* const* dest = k == 0 ? a.snapshot : a.step;
            if (dest && dest[i]) {
                for (int c = threadIdx.x; c < 2 * slots * width; c += blockDim.x) dest[i][c] = a.state[c];
                __syncthreads();
            }
        }
    }
}

// Fast compressor (Numerics::Fast): every sequence of the step in one launch, one thread per latent channel
// c (state columns c and, with overlap, d + c), so the channels and sequences run in parallel; per channel
// the arithmetic is compressor_kernel's, in the same order, and each thread writes its own columns of the
// page snapshots. seq[6 s ..] = (start_pos, n_tokens, row0, emit_base, state offset in floats, first
// snapshot slot).
__global__ void compressor_batch_kernel(CompressorArgs a, int n_seqs, const int64_t* seq) {
    pdl_enter();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int s = blockIdx.y;
    if (c >= a.d || s >= n_seqs) return;
    const int ratio = a.ratio, d = a.d, coff = a.overlap ? 2 : 1, width = coff * d, slots = coff * ratio;
    const int64_t* m = seq + 6 * static_cast<int64_t>(s);
    const int64_t start_pos = m[0], row0 = m[2];
    const int n_tokens = static_cast<int>(m[1]);
    int e = static_cast<int>(m[3]);
    float* kv_state = a.state + m[4];
    float* sc_state = kv_state + static_cast<int64_t>(slots) * width;
    float* const* snap = a.snapshot ? a.snapshot + m[5] : nullptr;
    float* const* stp = a.step ? a.step + m[5] : nullptr;
    auto step = [&](int i, const float* kvv, const float* scv) {
        const int64_t pos = start_pos + i;
        const int slot = static_cast<int>(pos % ratio) + (a.overlap ? ratio : 0);
        for (int h = 0; h < coff; ++h) {
            const int col = h * d + c;
            kv_state[slot * width + col] = kvv[h];
            sc_state[slot * width + col] = a.ape ? scv[h] + a.ape[(pos % ratio) * width + col] : scv[h];
        }
        if ((pos + 1) % ratio == 0) {
            const int n = a.overlap ? 2 * ratio : ratio;
            auto at = [&](bool score, int j) {
                const float* st = score ? sc_state : kv_state;
                return a.overlap ? (j < ratio ? st[j * width + c] : st[j * width + d + c]) : st[j * width + c];
            };
            a.pooled[(a.emit_at_row ? row0 + i : e++) * d + c] = pool_channel(n, at);
            if (a.overlap)
                for (int j = 0; j < ratio; ++j)
                    for (int h = 0; h < coff; ++h) {
                        const int col = h * d + c;
                        kv_state[j * width + col] = kv_state[(ratio + j) * width + col];
                        sc_state[j * width + col] = sc_state[(ratio + j) * width + col];
                    }
        } else if (a.emit_at_row) {
            a.pooled[(row0 + i) * d + c] = 0.0f;
        }
        for (int k = 0; k < 2; ++k) {  // the page snapshot, the speculative step's carry slot
            float* dest = k == 0 ? (snap ? snap[i] : nullptr) : (stp ? stp[i] : nullptr);
            if (dest)
                for (int r = 0; r < 2 * slots; ++r)
                    for (int h = 0; h < coff; ++h) dest[r * width + h * d + c] = kv_state[r * width + h * d + c];
        }
    };
    // Tokens in groups of 4 whose projections are loaded up front (prefill is sequential per channel, so
    // this keeps four loads in flight instead of one).
    constexpr int kAhead = 4;
    for (int i0 = 0; i0 < n_tokens; i0 += kAhead) {
        float kvv[kAhead][2], scv[kAhead][2];
#pragma unroll
        for (int u = 0; u < kAhead; ++u)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int64_t row = row0 + i0 + u;
                const bool ok = i0 + u < n_tokens && h < coff;
                kvv[u][h] = ok ? a.kv[row * width + h * d + c] : 0.0f;
                scv[u][h] = ok ? a.score[row * width + h * d + c] : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < kAhead; ++u)
            if (i0 + u < n_tokens) step(i0 + u, kvv[u], scv[u]);
    }
}

// Parallel compressor (Numerics::Fast, prefill-sized steps). What a carry slot holds after token p of a sequence
// is known without running the state machine: a current-group slot (the only slots without overlap) holds the
// latest token q <= p of its residue, a previous-group slot (overlap) what its current-group twin held at the
// latest emission <= p. A token of this step comes from the projections (score plus ape, as the sequential kernel
// stores it), an earlier one from the carry before the step. So emissions and snapshots run in parallel, reading
// only the old carry, and give the sequential kernel's values bit for bit (each emission is pool_channel). s: kv
// slots then score slots.
__device__ float carry_at(const CompressorArgs& a, int64_t P, int64_t row0, const float* st, int64_t p, int s,
                          int col) {
    const int ratio = a.ratio, off = a.overlap ? ratio : 0, slots = (a.overlap ? 2 : 1) * ratio;
    const int width = (a.overlap ? 2 : 1) * a.d;
    const bool score = s >= slots;
    const int slot = score ? s - slots : s;
    int64_t q = -1;   // the token the slot holds, when this step's
    int from = slot;  // otherwise the old carry's slot that holds it
    if (slot >= off) {
        const int r = slot - off;
        q = p - (((p - r) % ratio) + ratio) % ratio;
    } else {
        const int64_t g =
            (p + 1 >= 0 ? (p + 1) / ratio : -((-(p + 1) + ratio - 1) / ratio)) - 1;  // last group done by p
        if (g * ratio + ratio - 1 >= P) {
            q = g * ratio + slot;
            from = ratio + slot;
        }
    }
    if (q >= P) {
        const int64_t row = row0 + (q - P);
        if (!score) return a.kv[row * width + col];
        const float v = a.score[row * width + col];
        return a.ape ? v + a.ape[(q % ratio) * width + col] : v;
    }
    return st[static_cast<int64_t>((score ? slots : 0) + from) * width + col];
}

// Thread (emission k, channel c): jobs[2k ..] = (sequence, position of the emitting token); pooled row k.
__global__ void compressor_emit_kernel(CompressorArgs a, const int64_t* seq, const int64_t* jobs, int64_t n_jobs) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int d = a.d, ratio = a.ratio, slots = (a.overlap ? 2 : 1) * ratio;
    if (i >= n_jobs * d) return;
    const int64_t k = i / d;
    const int c = static_cast<int>(i % d);
    const int64_t* m = seq + 6 * jobs[2 * k];
    const int64_t P = m[0], row0 = m[2], pe = jobs[2 * k + 1];
    const float* st = a.state + m[4];
    const int n = a.overlap ? 2 * ratio : ratio;
    auto at = [&](bool score, int j) {
        const int s = (score ? slots : 0) + j;
        if (!a.overlap) return carry_at(a, P, row0, st, pe, s, c);
        return j < ratio ? carry_at(a, P, row0, st, pe - 1, s, c) : carry_at(a, P, row0, st, pe, s, d + c);
    };
    a.pooled[k * d + c] = pool_channel(n, at);
}

// Thread (job k, carry float r): the carry after token jobs[2k + 1] of sequence jobs[2k], into dest[k] (a page
// snapshot) or, for a null dest, the sequence's new carry staged in `fresh` (written back once all have read the
// old carries).
__global__ void compressor_carry_kernel(CompressorArgs a, const int64_t* seq, const int64_t* jobs, float* const* dest,
                                        int64_t n_jobs, int64_t per, float* fresh) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n_jobs * per) return;
    const int64_t k = i / per, r = i % per, s = jobs[2 * k];
    const int width = (a.overlap ? 2 : 1) * a.d;
    const int64_t* m = seq + 6 * s;
    const float v = carry_at(a, m[0], m[2], a.state + m[4], jobs[2 * k + 1], static_cast<int>(r / width),
                             static_cast<int>(r % width));
    (dest[k] ? dest[k] : fresh + s * per)[r] = v;
}

__global__ void compressor_commit_kernel(float* state, const int64_t* seq, int n_seqs, int64_t per,
                                         const float* fresh) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n_seqs * per) return;
    const int64_t s = i / per, r = i % per;
    if (seq[6 * s + 1] > 0) state[seq[6 * s + 4] + r] = fresh[i];
}

__global__ void index_scores_kernel(const float* iq, const float* wts, int64_t T, int nh, int hd, const int64_t* width,
                                    const int64_t* visible, const int64_t* keybase, const uint8_t* const* keys,
                                    EntryFormat kf, int64_t stride, float* scores) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= T * stride) return;
    const int64_t t = i / stride, j = i % stride;
    if (j >= width[t] || j >= visible[t]) {
        scores[i] = -INFINITY;
        return;
    }
    const uint8_t* k = keys[keybase[t] + j];
    float acc = 0.0f;
    for (int h = 0; h < nh; ++h) {
        const float* q = iq + (t * nh + h) * hd;
        double s = 0.0;
        for (int c = 0; c < hd; ++c) s += static_cast<double>(q[c]) * static_cast<double>(entry_value(kf, k, c));
        const float dd = round_bf16(static_cast<float>(s));
        acc += round_bf16(fmaxf(dd, 0.0f) * wts[t * nh + h]);
    }
    scores[i] = round_bf16(acc);
}

// Order-preserving unsigned key of a float (larger value, larger key; -0 and +0 equal).
__device__ __forceinline__ uint32_t order_key(float x) {
    if (x == 0.0f) x = 0.0f;
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

constexpr int kSelectThreads = 256;

// Block-wide selection of the k largest of v[0..n) with ties to the lower index: a radix search (8 bits a
// pass) for the k-th largest key, then one ordered pass that keeps everything above it and the first of
// the equal ones. Writes the chosen indices in ascending index order to sel; returns min(k, n).
__device__ int block_select(const float* v, int64_t n, int k, int32_t* sel) {
    using Scan = cub::BlockScan<int, kSelectThreads>;
    __shared__ typename Scan::TempStorage scan_tmp;
    __shared__ int hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ int s_remaining, s_run_eq, s_run_sel;
    const int kk = static_cast<int>(min(static_cast<int64_t>(k), n));
    if (kk <= 0) return 0;
    uint32_t prefix = 0, mask = 0;
    int remaining = kk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            const uint32_t key = order_key(v[j]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int cum = 0, b = 255;
            for (; b > 0; --b) {
                if (cum + hist[b] >= remaining) break;
                cum += hist[b];
            }
            s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
            s_remaining = remaining - cum;
        }
        __syncthreads();
        prefix = s_prefix;
        remaining = s_remaining;
        mask |= 255u << shift;
        __syncthreads();
    }
    const uint32_t thr = prefix;
    const int need = remaining;  // how many of the keys equal to thr are taken
    if (threadIdx.x == 0) {
        s_run_eq = 0;
        s_run_sel = 0;
    }
    __syncthreads();
    for (int64_t base = 0; base < n; base += blockDim.x) {
        const int64_t j = base + threadIdx.x;
        const uint32_t key = j < n ? order_key(v[j]) : 0u;
        const int gt = j < n && key > thr, eq = j < n && key == thr;
        int eq_rank, eq_total;
        Scan(scan_tmp).ExclusiveSum(eq, eq_rank, eq_total);
        __syncthreads();
        const int take = gt || (eq && s_run_eq + eq_rank < need);
        int pos, total;
        Scan(scan_tmp).ExclusiveSum(take, pos, total);
        if (take) sel[s_run_sel + pos] = static_cast<int32_t>(j);
        __syncthreads();
        if (threadIdx.x == 0) {
            s_run_eq += eq_total;
            s_run_sel += total;
        }
        __syncthreads();
    }
    return kk;
}

__global__ void candidate_kernel(const float* scores, int64_t stride, const int64_t* width, const int64_t* visible,
                                 int bs, int topb, float* bscore, int32_t* bsel, int64_t bstride, uint8_t* mask,
                                 int64_t mstride) {
    pdl_enter();
    const int64_t t = blockIdx.x;
    const int64_t w = width[t], vis = visible[t];
    if (w == 0) return;
    const int64_t nb = (w + bs - 1) / bs, last = vis >= 1 ? (vis - 1) / bs : -1;
    float* bsr = bscore + t * bstride;
    int32_t* sel = bsel + t * bstride;
    uint8_t* mr = mask + t * mstride;
    const float* sr = scores + t * stride;
    for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
        float m = -INFINITY;
        for (int64_t j = b * bs; j < min(w, (b + 1) * bs); ++j) m = fmaxf(m, sr[j]);
        bsr[b] = b == last ? INFINITY : m;
    }
    for (int64_t j = threadIdx.x; j < (nb + 31) / 32; j += blockDim.x) reinterpret_cast<unsigned int*>(mr)[j] = 0u;
    __syncthreads();
    const int kk = block_select(bsr, nb, topb, sel);
    __syncthreads();
    for (int i = threadIdx.x; i < kk; i += blockDim.x) {
        const int64_t b = sel[i];
        if (bsr[b] > -INFINITY) atomicOr(reinterpret_cast<unsigned int*>(mr) + b / 32, 1u << (b % 32));
    }
}

__global__ void apply_candidates_kernel(float* scores, int64_t T, int64_t stride, const int64_t* width,
                                        const uint8_t* mask, const int64_t* mask_width, int64_t mstride, int bs) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= T * stride) return;
    const int64_t t = i / stride, j = i % stride;
    if (j >= width[t]) return;
    if (j >= mask_width[t] || !((mask[t * mstride + (j / bs) / 8] >> ((j / bs) % 8)) & 1)) scores[i] = -INFINITY;
}

// Per row: the top-k, by index (ascending) or by (value desc, index asc); entries >= visible become -1.
__global__ void topk_kernel(const float* scores, int64_t stride, const int64_t* width, const int64_t* visible, int k,
                            bool ascending, int32_t* tmp, int32_t* out, int32_t* count) {
    pdl_enter();
    const int64_t t = blockIdx.x;
    const float* v = scores + t * stride;
    int32_t* sel = tmp + t * k;
    int32_t* o = out + t * k;
    const int kk = block_select(v, width[t], k, sel);
    __syncthreads();
    if (threadIdx.x == 0) count[t] = kk;
    const int64_t vis = visible[t];
    for (int i = threadIdx.x; i < kk; i += blockDim.x) {
        const int32_t j = sel[i];
        int p = i;
        if (!ascending) {
            const float x = v[j];
            p = 0;
            for (int q = 0; q < kk; ++q) {
                const float y = v[sel[q]];
                p += (y > x) || (y == x && sel[q] < j);
            }
        }
        o[p] = j < vis ? j : -1;
    }
}

__global__ void build_keys_kernel(int64_t T, const uint8_t* const* win, const int32_t* nwin, int W, const int32_t* sel,
                                  const int32_t* nsel, int kmax, const uint8_t* const* comp_addr,
                                  const int64_t* compbase, const uint8_t** keys, int32_t* nkeys, int maxk,
                                  const uint8_t* comp_rows, int64_t row_bytes) {
    pdl_enter();
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= T * maxk) return;
    const int64_t t = i / maxk, s = i % maxk;
    const int nw = nwin[t], ns = sel ? nsel[t] : 0;
    if (s == 0) nkeys[t] = nw + ns;
    if (s < nw) {
        keys[i] = win[t * W + s];
    } else if (s - nw < ns) {
        const int32_t idx = sel[t * kmax + (s - nw)];
        keys[i] = idx < 0      ? nullptr
                  : comp_rows ? comp_rows + (compbase[t] + idx) * row_bytes
                              : comp_addr[compbase[t] + idx];
    }
}

constexpr int kAttnThreads = 128, kKeyBlock = 64, kMaxHeadDim = 512;

// kFast: the block softmax runs on a warp (maximum and exponentials in parallel, the block sum still taken in
// key order by one lane), so the result is the same as with one thread.
template <bool kFast>
__global__ void sparse_attention_kernel(const float* q, int H, int D, float scale, const float* sink, KeyRefs keys,
                                        float* out) {
    pdl_enter();
    __shared__ float qs[kMaxHeadDim];
    __shared__ float s[kKeyBlock], p[kKeyBlock], pe[kKeyBlock];
    __shared__ float m_sh, sum_sh, rescale_sh;
    const int64_t t = blockIdx.x / H;
    const int h = blockIdx.x % H;
    const float* qh = q + (t * H + h) * D;
    for (int c = threadIdx.x; c < D; c += blockDim.x) qs[c] = qh[c];
    if (threadIdx.x == 0) {
        m_sh = -1e30f;
        sum_sh = 0.0f;
    }
    float acc[kMaxHeadDim / kAttnThreads];
    for (float& v : acc) v = 0.0f;
    __syncthreads();
    const int n = keys.nkeys[t], nwin = keys.nwin ? keys.nwin[t] : n;
    const uint8_t* const* kr = keys.keys + t * keys.maxk;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int b0 = 0; b0 < n; b0 += kKeyBlock) {
        const int cnt = min(kKeyBlock, n - b0);
        for (int j = warp; j < cnt; j += nw) {
            const uint8_t* k = kr[b0 + j];
            const EntryFormat& f = b0 + j < nwin ? keys.win : keys.comp;
            double d = 0.0;
            if (k)
                for (int c = lane; c < D; c += 32)
                    d += static_cast<double>(qs[c]) * static_cast<double>(entry_value(f, k, c));
            d = warp_sum(d);
            if (lane == 0) s[j] = k ? static_cast<float>(d) * scale : -INFINITY;
        }
        __syncthreads();
        if (kFast) {
            if (warp == 0) {
                float bmax = -INFINITY;
                for (int j = lane; j < cnt; j += 32) bmax = fmaxf(bmax, s[j]);
                for (int o = 16; o > 0; o >>= 1) bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, o));
                const float m_new = fmaxf(m_sh, bmax);
                for (int j = lane; j < cnt; j += 32) {
                    const float pj = exp_cr(s[j] - m_new);
                    pe[j] = pj;
                    p[j] = round_bf16(pj);
                }
                __syncwarp();
                if (lane == 0) {
                    const float rescale = exp_cr(m_sh - m_new);
                    double bsum = 0.0;  // exact, rounded once (the CPU reference's sparse_attend)
                    for (int j = 0; j < cnt; ++j) bsum += pe[j];
                    sum_sh = sum_sh * rescale + static_cast<float>(bsum);
                    rescale_sh = rescale;
                    m_sh = m_new;
                }
            }
        } else if (threadIdx.x == 0) {
            float bmax = -INFINITY;
            for (int j = 0; j < cnt; ++j) bmax = fmaxf(bmax, s[j]);
            const float m_new = fmaxf(m_sh, bmax);
            const float rescale = exp_cr(m_sh - m_new);
            double bsum = 0.0;  // exact, rounded once (the CPU reference's sparse_attend)
            for (int j = 0; j < cnt; ++j) {
                const float pj = exp_cr(s[j] - m_new);
                bsum += pj;
                p[j] = round_bf16(pj);
            }
            sum_sh = sum_sh * rescale + static_cast<float>(bsum);
            rescale_sh = rescale;
            m_sh = m_new;
        }
        __syncthreads();
        const float rescale = rescale_sh;
        for (int a = 0; a * kAttnThreads + static_cast<int>(threadIdx.x) < D; ++a) {
            const int c = a * kAttnThreads + threadIdx.x;
            double pv = 0.0;
            for (int j = 0; j < cnt; ++j) {
                const uint8_t* k = kr[b0 + j];
                if (k) pv += static_cast<double>(p[j]) * entry_value(b0 + j < nwin ? keys.win : keys.comp, k, c);
            }
            acc[a] = acc[a] * rescale + static_cast<float>(pv);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) sum_sh += exp_cr(sink[h] - m_sh);
    __syncthreads();
    float* o = out + (t * H + h) * D;
    for (int a = 0; a * kAttnThreads + static_cast<int>(threadIdx.x) < D; ++a) {
        const int c = a * kAttnThreads + threadIdx.x;
        o[c] = round_bf16(acc[a] / sum_sh);
    }
}

}  // namespace

void compressor_seq(const CompressorArgs& a) {
    if (a.n_tokens == 0) return;
    launch_pdl(compressor_kernel, dim3(1), dim3(256), 0, a);
}

void compressor_batch(const CompressorArgs& a, int n_seqs, const int64_t* seq) {
    if (n_seqs == 0) return;
    constexpr int kChannels = 32;
    if (n_seqs > 65535) cuda_fail(cudaErrorInvalidValue, "compressor_batch: too many sequences", __FILE__, __LINE__);
    const dim3 grid(static_cast<unsigned>((a.d + kChannels - 1) / kChannels), static_cast<unsigned>(n_seqs));
    launch_pdl(compressor_batch_kernel, grid, dim3(kChannels), 0, a, n_seqs, seq);
}

CompressorJobs compressor_jobs(const int64_t* seq, int n_seqs, int ratio, float* const* snapshot,
                               float* const* step) {
    CompressorJobs j;
    for (int s = 0; s < n_seqs; ++s) {
        const int64_t* m = seq + 6 * static_cast<int64_t>(s);
        for (int64_t i = 0; i < m[1]; ++i) {
            const int64_t pos = m[0] + i;
            if ((pos + 1) % ratio == 0) j.emit.insert(j.emit.end(), {s, pos});
            for (float* p : {snapshot[m[5] + i], step ? step[m[5] + i] : nullptr})
                if (p) {
                    j.carry.insert(j.carry.end(), {s, pos});
                    j.dest.push_back(p);
                }
        }
        if (m[1] > 0) {  // the new carry
            j.carry.insert(j.carry.end(), {s, m[0] + m[1] - 1});
            j.dest.push_back(nullptr);
        }
    }
    return j;
}

void compressor_parallel(const CompressorArgs& a, int n_seqs, const int64_t* seq, const int64_t* emit, int64_t n_emit,
                         const int64_t* carry, float* const* dest, int64_t n_carry) {
    if (n_seqs == 0) return;
    const int64_t per = 2LL * (a.overlap ? 2 : 1) * a.ratio * (a.overlap ? 2 : 1) * a.d;
    if (n_emit > 0) {
        launch_pdl(compressor_emit_kernel, dim3(blocks_for(n_emit * a.d)), dim3(kThreads), 0, a, seq, emit, n_emit);
    }
    if (n_carry == 0) return;
    float* fresh = nullptr;
    PG_CUDA(cudaMallocAsync(&fresh, sizeof(float) * static_cast<size_t>(n_seqs * per), 0));
    launch_pdl(compressor_carry_kernel, dim3(blocks_for(n_carry * per)), dim3(kThreads), 0, a, seq, carry, dest,
               n_carry, per, fresh);
    launch_pdl(compressor_commit_kernel, dim3(blocks_for(n_seqs * per)), dim3(kThreads), 0, a.state, seq, n_seqs, per,
               fresh);
    PG_CUDA(cudaFreeAsync(fresh, 0));
}

void index_scores(const float* iq, const float* wts, int64_t T, int nh, int hd, const int64_t* width,
                  const int64_t* visible, const int64_t* keybase, const uint8_t* const* keys, const EntryFormat& kf,
                  int64_t stride, float* scores) {
    if (T * stride == 0) return;
    if (kf.dim != hd) cuda_fail(cudaErrorInvalidValue, "index_scores: key format width", __FILE__, __LINE__);
    launch_pdl(index_scores_kernel, dim3(blocks_for(T * stride)), dim3(kThreads), 0, iq, wts, T, nh, hd, width, visible,
               keybase, keys, kf, stride, scores);
}

void candidate_blocks(const float* scores, int64_t T, int64_t stride, const int64_t* width, const int64_t* visible,
                      int bs, int topb, float* bscore, int32_t* bsel, int64_t bstride, uint8_t* mask,
                      int64_t mask_stride) {
    if (T == 0) return;
    if (mask_stride % 4 != 0)
        cuda_fail(cudaErrorInvalidValue, "candidate_blocks: mask rows must be words", __FILE__, __LINE__);
    launch_pdl(candidate_kernel, dim3(static_cast<unsigned>(T)), dim3(kSelectThreads), 0, scores, stride, width,
               visible, bs, topb, bscore, bsel, bstride, mask, mask_stride);
}

void apply_candidates(float* scores, int64_t T, int64_t stride, const int64_t* width, const uint8_t* mask,
                      const int64_t* mask_width, int64_t mask_stride, int bs) {
    if (T * stride == 0) return;
    launch_pdl(apply_candidates_kernel, dim3(blocks_for(T * stride)), dim3(kThreads), 0, scores, T, stride, width, mask,
               mask_width, mask_stride, bs);
}

void topk_rows(const float* scores, int64_t T, int64_t stride, const int64_t* width, const int64_t* visible, int k,
               bool ascending, int32_t* tmp, int32_t* out, int32_t* count) {
    if (T == 0 || k == 0) return;
    launch_pdl(topk_kernel, dim3(static_cast<unsigned>(T)), dim3(kSelectThreads), 0, scores, stride, width, visible, k,
               ascending, tmp, out, count);
}

void build_keys(int64_t T, const uint8_t* const* win, const int32_t* nwin, int W, const int32_t* sel,
                const int32_t* nsel, int kmax, const uint8_t* const* comp_addr, const int64_t* compbase,
                const uint8_t** keys, int32_t* nkeys, int maxk, const uint8_t* comp_rows, int64_t row_bytes) {
    if (T * maxk == 0) return;
    launch_pdl(build_keys_kernel, dim3(blocks_for(T * maxk)), dim3(kThreads), 0, T, win, nwin, W, sel, nsel, kmax,
               comp_addr, compbase, keys, nkeys, maxk, comp_rows, row_bytes);
}

void sparse_attention(const float* q, int64_t T, int H, int D, float scale, const float* sink, const KeyRefs& keys,
                      float* out, bool fast) {
    if (T == 0) return;
    if (D > kMaxHeadDim) cuda_fail(cudaErrorInvalidValue, "sparse_attention: head_dim > 512", __FILE__, __LINE__);
    if (keys.win.dim != D || (keys.nwin && keys.comp.dim != D))
        cuda_fail(cudaErrorInvalidValue, "sparse_attention: key format width", __FILE__, __LINE__);
    launch_pdl((fast ? sparse_attention_kernel<true> : sparse_attention_kernel<false>),
               dim3(static_cast<unsigned>(T * H)), dim3(kAttnThreads), 0, q, H, D, scale, sink, keys, out);
}

}  // namespace peregrine::cuda
