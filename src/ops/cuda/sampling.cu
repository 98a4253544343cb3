// Device sampling: one 512-thread block per row walks the row (vocabulary-sized, in global memory) a few
// times: the best token (and log-sum-exp for logprobs), then for a sampled row the top-k cut-off by a radix
// selection on the 64-bit rank keys, the top-p cut-off by a radix selection on the cumulative weight, and
// the draw by per-64-token weight sums and an in-block scan. Every decision uses the integer weights and
// keys of ops/sampling_math.h, so the token is the host sampler's (ops/sampling.cpp) bit for bit.
#include "ops/cuda/launch_check.h"
#include "ops/cuda/sampling_kernels.h"

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
struct RowSource {
    const float* row;
    int n;
    __device__ __forceinline__ void get(int j, float& l, int& id) const {
        l = row[j];
        id = j;
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
template <class Src, class Member>
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
template <class Src, class Weight>
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
template <class Src>
__device__ Cuts find_cuts(const Src& src, int V, const SampleRowDev& r, float mx, u64 best_key, u64 n_alive, Shared& s) {
    const double inv_t = r.inv_t;
    Cuts c{0, 0};
    // 1. top-k among the alive tokens (the others weigh 0 and rank below them all).
    if (r.top_k > 0 && r.top_k < V && n_alive > static_cast<u64>(r.top_k)) {
        auto alive = [&](float l, int) { return scaled_logit(l, mx, inv_t) > kWeightFloor; };
        c.c1 = select_count(src, alive, static_cast<u64>(r.top_k), s);
    }
    const u64 c1 = c.c1;
    u64 total = 0;
    for (int j = threadIdx.x; j < src.n; j += kThreads) {
        float l;
        int i;
        src.get(j, l, i);
        if (logit_key(l, i) >= c1) total += token_weight(l, mx, inv_t);
    }
    total = block_reduce<false>(total, s);
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
        c.c3 = P > 0.0 ? select_mass(src, kept2, P, s) : best_key;
    }
    return c;
}

__global__ void __launch_bounds__(kThreads, 2) sample_kernel(float* logits, int V, const SampleRowDev* rows,
                                                          const LogitAdjust* adj, SampleOutDev* out, SampleOutDev* top) {
    __shared__ Shared s;
    const SampleRowDev r = rows[blockIdx.x];
    float* row = logits + r.row * static_cast<int64_t>(V);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    if (tid == 0) s.bi[1] = 0;
    // Logit bias, penalties, masks (one entry per id).
    for (int j = tid; j < r.adj_count; j += kThreads) {
        const LogitAdjust a = adj[r.adj_begin + j];
        if (a.id >= 0 && a.id < V) row[a.id] = adjust_logit(row[a.id], a, r.pen);
    }
    __syncthreads();

    u64 best_key = 0;
    for (int i = tid; i < V; i += kThreads) {
        const u64 k = logit_key(row[i], i);
        best_key = k > best_key ? k : best_key;
    }
    best_key = block_reduce<true>(best_key, s);
    const int best = key_id(best_key);
    const float mx = row[best];
    int chosen = best;

    if (r.inv_t > 0.0 && isfinite(mx)) {
        const double inv_t = r.inv_t;
        auto alive = [&](float l, int) { return scaled_logit(l, mx, inv_t) > kWeightFloor; };
        // The alive tokens (a prefix of the ranking; all others weigh 0), gathered into shared memory when
        // they fit, so that the selections below do not walk the row again.
        if (tid == 0) s.n_cand = 0;
        __syncthreads();
        for (int base = warp * 32; base < V; base += kThreads) {
            const int i = base + lane;
            const float l = i < V ? row[i] : 0.0f;
            const bool a = i < V && alive(l, i);
            const unsigned m = __ballot_sync(kFull, a);
            if (m == 0) continue;
            int pos = 0;
            if (lane == 0) pos = atomicAdd(&s.n_cand, __popc(m));
            pos = __shfl_sync(kFull, pos, 0) + __popc(m & ((1u << lane) - 1u));
            if (a && pos < kMaxCands) s.cand.l[pos] = l, s.cand.id[pos] = i;
        }
        __syncthreads();
        const u64 n_alive = static_cast<u64>(s.n_cand);
        __syncthreads();
        const Cuts cuts = n_alive <= static_cast<u64>(kMaxCands)
                              ? find_cuts(CandSource{s.cand.l, s.cand.id, static_cast<int>(n_alive)}, V, r, mx, best_key, n_alive, s)
                              : find_cuts(RowSource{row, V}, V, r, mx, best_key, n_alive, s);
        const u64 c1 = cuts.c1, c3 = cuts.c3, min_w = r.min_p_weight;
        auto kept2 = [&](float l, int i) -> u64 {
            const u64 w = token_weight(l, mx, inv_t);
            if (w == 0) return 0;
            const u64 k = logit_key(l, i);
            if (k < c1 || (w < min_w && k != best_key)) return 0;
            return w;
        };
        auto kept = [&](int i) -> u64 {
            if (i >= V) return 0;
            const float l = row[i];
            return logit_key(l, i) >= c3 ? kept2(l, i) : 0;
        };

        // The draw: weight sums per 64 tokens, a block scan over them, then the token inside the chunk.
        const int n_chunks = (V + kChunk - 1) / kChunk;
        for (int c = warp; c < n_chunks; c += kWarps) {
            const int i0 = c * kChunk + lane;
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
        const u64 mass = s.bu[0];
        const u64 excl = s.wpre[warp] + incl - mine;
        const u64 target = mul_hi64(sample_random_bits(r.seed, r.index), mass);
        if (mine > 0 && excl <= target && target < excl + mine) {
            u64 cum = excl;
            for (int j = 0; j < kChunksPerThread; ++j) {
                const int c = tid * kChunksPerThread + j;
                if (target < cum + s.chunk[c]) {
                    s.bi[1] = c;
                    s.bu[2] = target - cum;
                    break;
                }
                cum += s.chunk[c];
            }
        }
        __syncthreads();
        if (warp == 0 && mass > 0) {
            const int c = s.bi[1];
            u64 rem = s.bu[2];
            int found = -1;
            for (int half = 0; half < 2 && found < 0; ++half) {
                const int i = c * kChunk + half * 32 + lane;
                const u64 w = kept(i);
                u64 p = w;
                for (int o = 1; o < 32; o <<= 1) {
                    const u64 t = __shfl_up_sync(kFull, p, o);
                    if (lane >= o) p += t;
                }
                const unsigned hit = __ballot_sync(kFull, p > rem);
                if (hit) found = c * kChunk + half * 32 + __ffs(hit) - 1;
                else rem -= __shfl_sync(kFull, p, 31);
            }
            if (lane == 0) s.bi[2] = found >= 0 ? found : best;
        }
        __syncthreads();
        chosen = mass > 0 ? s.bi[2] : best;
    }

    if (r.top_n < 0) {
        if (tid == 0) out[blockIdx.x] = {chosen, 0.0f};
        return;
    }
    // Logprobs: log-softmax of the adjusted row (double sums), the chosen token's and the top_n best.
    double se = 0.0;
    for (int i = tid; i < V; i += kThreads) se += exp(static_cast<double>(row[i]) - static_cast<double>(mx));
    se = block_sumd(se, s);
    const double lse = static_cast<double>(mx) + log(se);
    if (tid == 0) out[blockIdx.x] = {chosen, static_cast<float>(static_cast<double>(row[chosen]) - lse)};
    const int n = r.top_n < V ? r.top_n : V;
    if (n <= 0) return;
    const u64 cut = select_count(RowSource{row, V}, [](float, int) { return true; }, static_cast<u64>(n), s);
    if (tid == 0) s.top_count = 0;
    __syncthreads();
    for (int i = tid; i < V; i += kThreads) {
        const u64 k = logit_key(row[i], i);
        if (k >= cut) {
            const int pos = atomicAdd(&s.top_count, 1);
            if (pos < kSampleMaxTop) s.top_keys[pos] = k;
        }
    }
    __syncthreads();
    if (tid == 0) {
        const int m = s.top_count < n ? s.top_count : n;
        for (int a = 1; a < m; ++a) {  // insertion sort, best first
            const u64 k = s.top_keys[a];
            int b = a - 1;
            while (b >= 0 && s.top_keys[b] < k) {
                s.top_keys[b + 1] = s.top_keys[b];
                --b;
            }
            s.top_keys[b + 1] = k;
        }
        for (int j = 0; j < m; ++j) {
            const int id = key_id(s.top_keys[j]);
            top[static_cast<int64_t>(blockIdx.x) * kSampleMaxTop + j] = {id, static_cast<float>(static_cast<double>(row[id]) - lse)};
        }
    }
}

}  // namespace

void sample_rows(float* logits, int vocab, const SampleRowDev* rows, int n_rows, const LogitAdjust* adj,
                 SampleOutDev* out, SampleOutDev* top) {
    if (n_rows <= 0) return;
    sample_kernel<<<n_rows, kThreads>>>(logits, vocab, rows, adj, out, top);
    PG_LAUNCHED();
}

}  // namespace peregrine::cuda
