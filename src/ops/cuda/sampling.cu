// Device sampling: a row is sampled by one 512-thread block, or, when few rows leave SMs idle, by a cluster of C
// blocks that each take a contiguous slice of the row and combine their counts, sums and histograms through
// distributed shared memory. The row (vocabulary-sized, in global memory) is walked a few times: the best token
// (and log-sum-exp for logprobs), then for a sampled row the top-k cut-off by a radix selection on the 64-bit
// rank keys, the top-p cut-off by a radix selection on the cumulative weight, and the draw by per-64-token
// weight sums and a scan. Every decision uses the integer weights and keys of ops/sampling_math.h (exact sums in
// any order), so the token is the host sampler's (ops/sampling.cpp) bit for bit whatever C is.
#include "util/switches.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/sampling_kernels.h"

#include <cooperative_groups.h>

namespace peregrine::cuda {

namespace {

using namespace peregrine::sampling;
using u64 = unsigned long long;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 64;  // tokens per weight sum in the draw (two per lane of a warp)
constexpr int kMaxChunks = kSampleMaxVocab / kChunk;
constexpr int kChunksPerThread = kMaxChunks / kThreads;
constexpr int kMaxCands = 4096;  // rows with at most this many alive tokens select in shared memory
constexpr unsigned kFull = 0xFFFFFFFFu;

struct Shared {
    u64 hist[256];      // radix histogram: counts, or weights in the mass selection
    u64 cnt[256];       // members per bin (mass selection)
    u64 red[kWarps];    // per-warp partials
    u64 wpre[kWarps];   // per-warp exclusive prefixes
    double redd[kWarps];
    union {
        u64 chunk[kMaxChunks];  // the draw
        struct {                // the selections (finished before the draw starts)
            float l[kMaxCands];
            int id[kMaxCands];
        } cand;
    };
    int n_cand;
    u64 bu[4];          // broadcasts
    int bi[4];
    int top_count;
    u64 top_keys[kSampleMaxTop];
    // Cluster exchange (C > 1): each block's histograms summed over the cluster, and one published value.
    u64 hsum[256], csum[256];
    u64 pub;
    double pubd;
};

namespace cg = cooperative_groups;

// The blocks of one row: C == 1 is one block per row (no cluster), otherwise a cluster of C blocks. Every
// exchange is: publish in shared memory, cluster barrier, read every block's copy (in rank order, so double sums
// are deterministic), barrier again so that the copies may be reused. Control flow that contains exchanges
// depends only on exchanged values, so all blocks of a cluster take the same path.
template <int C>
struct Team {
    __device__ static unsigned rank() {
        if constexpr (C == 1) return 0;
        else return cg::this_cluster().block_rank();
    }
    __device__ static void sync() {
        if constexpr (C == 1) __syncthreads();
        else cg::this_cluster().sync();
    }
    template <class T>
    __device__ static T* at(T* p, unsigned r) {
        if constexpr (C == 1) return p;
        else return cg::this_cluster().map_shared_rank(p, r);
    }
    // Every block's copy of v (a value every thread of each block holds) folded in rank order by op: sums are
    // deterministic, doubles included.
    template <class T, class Op>
    __device__ static T fold(T v, T* slot, Op op) {
        if constexpr (C == 1) return v;
        if (threadIdx.x == 0) *slot = v;
        sync();
        T r = *at(slot, 0u);
#pragma unroll 1
        for (unsigned q = 1; q < C; ++q) r = op(r, *at(slot, q));
        sync();
        return r;
    }
    // The sum (or max) over the blocks.
    template <bool Max>
    __device__ static u64 reduce(u64 v, Shared& s) {
        return fold(v, &s.pub, [](u64 a, u64 b) { return Max ? (b > a ? b : a) : a + b; });
    }
    __device__ static double sumd(double v, Shared& s) {
        return fold(v, &s.pubd, [](double a, double b) { return a + b; });
    }
    // This block's value and the sum over the blocks before it (exclusive prefix) and over all.
    __device__ static void scan(u64 v, Shared& s, u64* before, u64* total) {
        if constexpr (C == 1) {
            *before = 0;
            *total = v;
            return;
        }
        if (threadIdx.x == 0) s.pub = v;
        sync();
        u64 b = 0, t = 0;
        const unsigned me = rank();
#pragma unroll 1
        for (unsigned q = 0; q < C; ++q) {
            const u64 x = *at(&s.pub, q);
            if (q < me) b += x;
            t += x;
        }
        sync();
        *before = b;
        *total = t;
    }
    // s.hist (and s.cnt when `counts`) summed over the blocks, in place; the block's histogram loop must be
    // finished (block barrier) before.
    __device__ static void merge_hist(Shared& s, bool counts) {
        if constexpr (C == 1) return;
        sync();
        for (int b = threadIdx.x; b < 256; b += kThreads) {
            u64 h = 0, c = 0;
#pragma unroll 1
        for (unsigned q = 0; q < C; ++q) {
                h += at(s.hist, q)[b];
                if (counts) c += at(s.cnt, q)[b];
            }
            s.hsum[b] = h;
            s.csum[b] = c;
        }
        sync();
        for (int b = threadIdx.x; b < 256; b += kThreads) {
            s.hist[b] = s.hsum[b];
            if (counts) s.cnt[b] = s.csum[b];
        }
        __syncthreads();
    }
};

__device__ __forceinline__ u64 warp_sum(u64 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
    return v;
}
__device__ __forceinline__ u64 warp_max(u64 v) {
    for (int o = 16; o > 0; o >>= 1) {
        const u64 t = __shfl_xor_sync(kFull, v, o);
        v = t > v ? t : v;
    }
    return v;
}
__device__ __forceinline__ double warp_sumd(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
    return v;
}

// Sum (or max) over the block; every thread gets it.
template <bool Max>
__device__ u64 block_reduce(u64 v, Shared& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = Max ? warp_max(v) : warp_sum(v);
    if (lane == 0) s.red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < kWarps ? s.red[lane] : 0;
        v = Max ? warp_max(v) : warp_sum(v);
        if (lane == 0) s.bu[0] = v;
    }
    __syncthreads();
    v = s.bu[0];
    __syncthreads();
    return v;
}

__device__ double block_sumd(double v, Shared& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sumd(v);
    if (lane == 0) s.redd[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < kWarps ? s.redd[lane] : 0.0;
        v = warp_sumd(v);
        if (lane == 0) s.redd[0] = v;
    }
    __syncthreads();
    v = s.redd[0];
    __syncthreads();
    return v;
}

// Warp 0: the first bin, best first (255 down to 0), at which reached(cumulative through it) holds.
// Broadcasts bi[0] = bin (-1: none), bu[1] = cumulative before it, bu[2] = its histogram value,
// bu[3] = its member count (when counts are given).
template <class Reached>
__device__ void pick_bin(Shared& s, const u64* counts, Reached reached) {
    const int lane = threadIdx.x;
    u64 sum = 0;
    for (int j = 0; j < 8; ++j) sum += s.hist[255 - 8 * lane - j];
    u64 incl = sum;
    for (int o = 1; o < 32; o <<= 1) {
        const u64 t = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += t;
    }
    const unsigned ballot = __ballot_sync(kFull, reached(incl));
    if (ballot == 0) {
        if (lane == 0) s.bi[0] = -1;
        return;
    }
    if (lane == __ffs(ballot) - 1) {
        u64 cum = incl - sum;
        for (int j = 0; j < 8; ++j) {
            const int b = 255 - 8 * lane - j;
            if (reached(cum + s.hist[b])) {
                s.bi[0] = b;
                s.bu[1] = cum;
                s.bu[2] = s.hist[b];
                s.bu[3] = counts ? counts[b] : s.hist[b];
                break;
            }
            cum += s.hist[b];
        }
    }
}

// What the selections walk: the whole row in global memory, or its alive tokens gathered in shared memory.
struct RowSource {  // the block's slice [lo, lo + n) of the row
    const float* row;
    int lo, n;
    __device__ __forceinline__ void get(int j, float& l, int& id) const {
        l = row[lo + j];
        id = lo + j;
    }
};
struct CandSource {
    const float* l;
    const int* ids;
    int n;
    __device__ __forceinline__ void get(int j, float& lv, int& id) const {
        lv = l[j];
        id = ids[j];
    }
};

__device__ __forceinline__ u64 high_mask(int shift) { return shift >= 56 ? 0ull : ~((1ull << (shift + 8)) - 1); }

// A key c such that exactly `want` members have key >= c (0 when there are fewer): the want-th best
// member's key, or a lower one with the same member set.
template <int C, class Src, class Member>
__device__ u64 select_count(const Src& src, Member member, u64 want, Shared& s) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 prefix = 0, need = want;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += kThreads) s.hist[b] = 0;
        __syncthreads();
        const u64 hm = high_mask(shift);
        for (int base = warp * 32; base < src.n; base += kThreads) {  // warp-uniform trip count
            const int j = base + lane;
            bool take = false;
            unsigned d = 0;
            if (j < src.n) {
                float l;
                int i;
                src.get(j, l, i);
                const u64 k = logit_key(l, i);
                take = (k & hm) == prefix && member(l, i);
                d = static_cast<unsigned>(k >> shift) & 255u;
            }
            const unsigned m = __ballot_sync(kFull, take);
            if (take) {  // one atomic per distinct bin of the warp
                const unsigned peers = __match_any_sync(m, d);
                if (lane == __ffs(peers) - 1) atomicAdd(&s.hist[d], static_cast<u64>(__popc(peers)));
            }
        }
        __syncthreads();
        Team<C>::merge_hist(s, false);
        if (threadIdx.x < 32) pick_bin(s, nullptr, [&](u64 cum) { return cum >= need; });
        __syncthreads();
        const int b = s.bi[0];
        const u64 before = s.bu[1], in_bin = s.bu[2];
        __syncthreads();
        if (b < 0) return 0;
        prefix |= static_cast<u64>(b) << shift;
        need -= before;
        if (need == in_bin) return prefix;  // the whole bin is kept
    }
    return prefix;
}

// The key at which the members' cumulative weight, best first, first reaches P (or a lower key with the same
// weighted member set); 0 when their total stays below P. weight(l, i) is a member's weight, 0 otherwise.
template <int C, class Src, class Weight>
__device__ u64 select_mass(const Src& src, Weight weight, double P, Shared& s) {
    u64 prefix = 0, above = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += kThreads) s.hist[b] = 0, s.cnt[b] = 0;
        __syncthreads();
        const u64 hm = high_mask(shift);
        unsigned cur = 0xFFFFFFFFu;
        u64 acc = 0, acc_n = 0;
        for (int j = threadIdx.x; j < src.n; j += kThreads) {
            float l;
            int i;
            src.get(j, l, i);
            const u64 k = logit_key(l, i);
            if ((k & hm) != prefix) continue;
            const u64 w = weight(l, i);
            if (w == 0) continue;
            const unsigned d = static_cast<unsigned>(k >> shift) & 255u;
            if (d != cur) {  // runs of one bin cost one atomic
                if (acc_n) atomicAdd(&s.hist[cur], acc), atomicAdd(&s.cnt[cur], acc_n);
                cur = d;
                acc = 0;
                acc_n = 0;
            }
            acc += w;
            ++acc_n;
        }
        if (acc_n) atomicAdd(&s.hist[cur], acc), atomicAdd(&s.cnt[cur], acc_n);
        __syncthreads();
        Team<C>::merge_hist(s, true);
        if (threadIdx.x < 32)
            pick_bin(s, s.cnt, [&](u64 cum) { return static_cast<double>(above + cum) >= P; });
        __syncthreads();
        const int b = s.bi[0];
        const u64 before = s.bu[1], members = s.bu[3];
        __syncthreads();
        if (b < 0) return 0;
        prefix |= static_cast<u64>(b) << shift;
        above += before;
        if (members == 1) return prefix;
    }
    return prefix;
}

struct Cuts {
    u64 c1, c3;  // kept: alive, key >= c1 (top-k), min-p, key >= c3 (top-p)
};

// The top-k and top-p cut-off keys of a sampled row over `src` (which holds every alive token).
template <int C, class Src>
__device__ Cuts find_cuts(const Src& src, int V, const SampleRowDev& r, float mx, u64 best_key, u64 n_alive,
                          Shared& s) {
    const double inv_t = r.inv_t;
    Cuts c{0, 0};
    // 1. top-k among the alive tokens (the others weigh 0 and rank below them all).
    if (r.top_k > 0 && r.top_k < V && n_alive > static_cast<u64>(r.top_k)) {
        auto alive = [&](float l, int) { return scaled_logit(l, mx, inv_t) > kWeightFloor; };
        c.c1 = select_count<C>(src, alive, static_cast<u64>(r.top_k), s);
    }
    const u64 c1 = c.c1;
    u64 total = 0;
    for (int j = threadIdx.x; j < src.n; j += kThreads) {
        float l;
        int i;
        src.get(j, l, i);
        if (logit_key(l, i) >= c1) total += token_weight(l, mx, inv_t);
    }
    total = Team<C>::template reduce<false>(block_reduce<false>(total, s), s);
    // 2. min-p: a kept token's weight (0 outside top-k and min-p).  3. top-p over those.
    if (r.top_p < 1.0) {
        const u64 min_w = r.min_p_weight;
        auto kept2 = [&](float l, int i) -> u64 {
            const u64 w = token_weight(l, mx, inv_t);
            if (w == 0) return 0;
            const u64 k = logit_key(l, i);
            if (k < c1 || (w < min_w && k != best_key)) return 0;
            return w;
        };
        const double P = r.top_p * static_cast<double>(total);
        c.c3 = P > 0.0 ? select_mass<C>(src, kept2, P, s) : best_key;
    }
    return c;
}

template <int C>
__global__ void __launch_bounds__(kThreads, 2)
    sample_kernel(float* logits, int V, const SampleRowDev* rows, const LogitAdjust* adj, SampleOutDev* out,
                  SampleOutDev* top) {
    using T = Team<C>;
    __shared__ Shared s;
    const int ri = static_cast<int>(blockIdx.x / C);
    const unsigned me = T::rank();
    const SampleRowDev r = rows[ri];
    float* row = logits + r.row * static_cast<int64_t>(V);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // The block's slice of the row: whole 64-token chunks (the draw's unit).
    const int slice = (V + kChunk * C - 1) / (kChunk * C) * kChunk;
    const int lo = min(V, static_cast<int>(me) * slice), hi = min(V, lo + slice), n = hi - lo;

    if (tid == 0) s.bi[1] = 0;
    // Logit bias, penalties, masks (one entry per id), each applied by the block whose slice holds the id.
    for (int j = tid; j < r.adj_count; j += kThreads) {
        const LogitAdjust a = adj[r.adj_begin + j];
        if (a.id >= lo && a.id < hi) row[a.id] = adjust_logit(row[a.id], a, r.pen);
    }
    __syncthreads();

    u64 best_key = 0;
    for (int i = lo + tid; i < hi; i += kThreads) {
        const u64 k = logit_key(row[i], i);
        best_key = k > best_key ? k : best_key;
    }
    best_key = T::template reduce<true>(block_reduce<true>(best_key, s), s);  // its barriers publish the adjustments
    const int best = key_id(best_key);
    const float mx = row[best];
    int chosen = best;

    if (r.inv_t > 0.0 && isfinite(mx)) {
        const double inv_t = r.inv_t;
        auto alive = [&](float l, int) { return scaled_logit(l, mx, inv_t) > kWeightFloor; };
        // The alive tokens (a prefix of the ranking; all others weigh 0), gathered into shared memory when
        // every block's share fits, so that the selections below do not walk the row again.
        if (tid == 0) s.n_cand = 0;
        __syncthreads();
        for (int base = warp * 32; base < n; base += kThreads) {
            const int i = lo + base + lane;
            const float l = i < hi ? row[i] : 0.0f;
            const bool a = i < hi && alive(l, i);
            const unsigned m = __ballot_sync(kFull, a);
            if (m == 0) continue;
            int pos = 0;
            if (lane == 0) pos = atomicAdd(&s.n_cand, __popc(m));
            pos = __shfl_sync(kFull, pos, 0) + __popc(m & ((1u << lane) - 1u));
            if (a && pos < kMaxCands) s.cand.l[pos] = l, s.cand.id[pos] = i;
        }
        __syncthreads();
        const u64 local = static_cast<u64>(s.n_cand);
        __syncthreads();
        const u64 n_alive = T::template reduce<false>(local, s);
        const bool fits = T::template reduce<true>(local, s) <= static_cast<u64>(kMaxCands);
        const Cuts cuts = fits ? find_cuts<C>(CandSource{s.cand.l, s.cand.id, static_cast<int>(local)}, V, r, mx,
                                              best_key, n_alive, s)
                               : find_cuts<C>(RowSource{row, lo, n}, V, r, mx, best_key, n_alive, s);
        const u64 c1 = cuts.c1, c3 = cuts.c3, min_w = r.min_p_weight;
        auto kept2 = [&](float l, int i) -> u64 {
            const u64 w = token_weight(l, mx, inv_t);
            if (w == 0) return 0;
            const u64 k = logit_key(l, i);
            if (k < c1 || (w < min_w && k != best_key)) return 0;
            return w;
        };
        auto kept = [&](int i) -> u64 {
            if (i >= hi) return 0;
            const float l = row[i];
            return logit_key(l, i) >= c3 ? kept2(l, i) : 0;
        };

        // The draw: weight sums per 64 tokens of the slice, a block scan over them and a scan over the blocks,
        // then the block whose share holds the target finds the token inside its chunk.
        const int n_chunks = (n + kChunk - 1) / kChunk;
        for (int c = warp; c < n_chunks; c += kWarps) {
            const int i0 = lo + c * kChunk + lane;
            const u64 v = warp_sum(kept(i0) + kept(i0 + 32));
            if (lane == 0) s.chunk[c] = v;
        }
        __syncthreads();
        u64 mine = 0;
        for (int j = 0; j < kChunksPerThread; ++j) {
            const int c = tid * kChunksPerThread + j;
            if (c < n_chunks) mine += s.chunk[c];
        }
        u64 incl = mine;
        for (int o = 1; o < 32; o <<= 1) {
            const u64 t = __shfl_up_sync(kFull, incl, o);
            if (lane >= o) incl += t;
        }
        if (lane == 31) s.red[warp] = incl;
        __syncthreads();
        if (warp == 0) {
            const u64 v = lane < kWarps ? s.red[lane] : 0;
            u64 wi = v;
            for (int o = 1; o < 32; o <<= 1) {
                const u64 t = __shfl_up_sync(kFull, wi, o);
                if (lane >= o) wi += t;
            }
            if (lane < kWarps) s.wpre[lane] = wi - v;
            if (lane == 31) s.bu[0] = wi;
        }
        __syncthreads();
        u64 before = 0, mass = 0;
        T::scan(s.bu[0], s, &before, &mass);
        const u64 excl = before + s.wpre[warp] + incl - mine;
        const u64 target = mul_hi64(sample_random_bits(r.seed, r.index), mass);
        if (tid == 0) s.bi[2] = -1;
        __syncthreads();
        if (mine > 0 && excl <= target && target < excl + mine) {
            u64 cum = excl;
            for (int j = 0; j < kChunksPerThread; ++j) {
                const int c = tid * kChunksPerThread + j;
                if (target < cum + s.chunk[c]) {
                    s.bi[1] = c;
                    s.bu[2] = target - cum;
                    s.bi[2] = 0;  // this block holds the token
                    break;
                }
                cum += s.chunk[c];
            }
        }
        __syncthreads();
        if (warp == 0 && s.bi[2] == 0) {
            const int c = s.bi[1];
            u64 rem = s.bu[2];
            int found = -1;
            for (int half = 0; half < 2 && found < 0; ++half) {
                const int i = lo + c * kChunk + half * 32 + lane;
                const u64 w = kept(i);
                u64 p = w;
                for (int o = 1; o < 32; o <<= 1) {
                    const u64 t = __shfl_up_sync(kFull, p, o);
                    if (lane >= o) p += t;
                }
                const unsigned hit = __ballot_sync(kFull, p > rem);
                if (hit) found = lo + c * kChunk + half * 32 + __ffs(hit) - 1;
                else rem -= __shfl_sync(kFull, p, 31);
            }
            if (lane == 0) s.bi[3] = found >= 0 ? found : best;
        }
        __syncthreads();
        // Every block learns the token (ids are >= 0; blocks without it offer 0).
        const u64 found = T::template reduce<true>(s.bi[2] == 0 ? static_cast<u64>(s.bi[3]) + 1 : 0, s);
        chosen = mass > 0 && found > 0 ? static_cast<int>(found - 1) : best;
    }

    if (r.top_n < 0) {
        if (tid == 0 && me == 0) out[ri] = {chosen, 0.0f};
        return;
    }
    // Logprobs: log-softmax of the adjusted row (double sums), the chosen token's and the top_n best.
    double se = 0.0;
    for (int i = lo + tid; i < hi; i += kThreads) se += exp(static_cast<double>(row[i]) - static_cast<double>(mx));
    se = T::sumd(block_sumd(se, s), s);
    const double lse = static_cast<double>(mx) + log(se);
    if (tid == 0 && me == 0) out[ri] = {chosen, static_cast<float>(static_cast<double>(row[chosen]) - lse)};
    const int tn = r.top_n < V ? r.top_n : V;
    if (tn <= 0) return;
    const u64 cut = select_count<C>(RowSource{row, lo, n}, [](float, int) { return true; }, static_cast<u64>(tn), s);
    if (tid == 0) s.top_count = 0;
    __syncthreads();
    for (int i = lo + tid; i < hi; i += kThreads) {
        const u64 k = logit_key(row[i], i);
        if (k >= cut) {
            const int pos = atomicAdd(&s.top_count, 1);
            if (pos < kSampleMaxTop) s.top_keys[pos] = k;
        }
    }
    __syncthreads();
    T::sync();  // every block's keys are in place
    if (tid == 0 && me == 0) {
        u64* keys = s.top_keys;  // the other blocks' keys appended (tn at most in all: the keys are unique)
        int m = min(s.top_count, kSampleMaxTop);
        for (unsigned q = 1; q < C; ++q) {
            const int cnt = min(*T::at(&s.top_count, q), kSampleMaxTop);
            const u64* kq = T::at(s.top_keys, q);
            for (int j = 0; j < cnt && m < kSampleMaxTop; ++j) keys[m++] = kq[j];
        }
        m = m < tn ? m : tn;
        for (int a = 1; a < m; ++a) {  // insertion sort, best first
            const u64 k = keys[a];
            int b = a - 1;
            while (b >= 0 && keys[b] < k) {
                keys[b + 1] = keys[b];
                --b;
            }
            keys[b + 1] = k;
        }
        for (int j = 0; j < m; ++j) {
            const int id = key_id(keys[j]);
            top[static_cast<int64_t>(ri) * kSampleMaxTop + j] = {
                id, static_cast<float>(static_cast<double>(row[id]) - lse)};
        }
    }
    T::sync();  // block 0 has read the others' keys
}

template <int C>
void launch(float* logits, int vocab, const SampleRowDev* rows, int n_rows, const LogitAdjust* adj, SampleOutDev* out,
            SampleOutDev* top) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(n_rows) * C);
    cfg.blockDim = dim3(kThreads);
    cfg.stream = 0;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = C;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = C > 1 ? 1 : 0;
    PG_CUDA(cudaLaunchKernelEx(&cfg, sample_kernel<C>, logits, vocab, rows, adj, out, top));
}

}  // namespace

void sample_rows(float* logits, int vocab, const SampleRowDev* rows, int n_rows, const LogitAdjust* adj,
                 SampleOutDev* out, SampleOutDev* top) {
    if (n_rows <= 0) return;
    // Clusters while the rows alone would leave SMs idle (PEREGRINE_SAMPLER_CLUSTER=0: a block per row, A/B).
    static const bool clusters = switch_is("PEREGRINE_SAMPLER_CLUSTER", "1");
    if (clusters && n_rows <= 32) launch<8>(logits, vocab, rows, n_rows, adj, out, top);
    else if (clusters && n_rows <= 64) launch<4>(logits, vocab, rows, n_rows, adj, out, top);
    else if (clusters && n_rows <= 128) launch<2>(logits, vocab, rows, n_rows, adj, out, top);
    else launch<1>(logits, vocab, rows, n_rows, adj, out, top);
}

}  // namespace peregrine::cuda
