#pragma once
// The key side of the tensor-core sparse attention kernel (sparse_attention_mma.cu):
// the arguments, each query's key list, and the chunk loader that prefetches 16 keys' packed state entries into
// registers and decodes them exactly into bf16 (every stored value is a bf16 value; entry_decode.h).
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/entry_decode.h"
#include "ops/cuda/kernels.h"

#include <cuda_bf16.h>

namespace peregrine::cuda::sparse {

constexpr int kHeads = 64, kDim = 512, kBlk = 64, kCtaThreads = 256;  // kCtaThreads: the chunk loaders
constexpr int kChunkKeys = 16, kChunks = kBlk / kChunkKeys;
constexpr int kPartDims = kChunkKeys * kDim / kCtaThreads;  // dims per thread per chunk key (32)

// The keys of query t: count(t) entries, entry i a packed state entry (null: a masked entry), the first
// windows(t) of them window entries. The only place that knows how key addresses are represented.
struct KeyList {
    KeyRefs r;
    __device__ __forceinline__ int count(int64_t t) const { return r.nkeys[t]; }
    __device__ __forceinline__ int windows(int64_t t) const { return r.nwin ? r.nwin[t] : r.nkeys[t]; }
    __device__ __forceinline__ const uint8_t* at(int64_t t, int i) const { return r.keys[t * r.maxk + i]; }
};

struct MmaArgs {
    const float* q;  // [T, H, kDim]
    int64_t T;
    int H;
    float scale;
    const float* sink;  // [H]
    KeyList keys;
    float* out;      // [T, H, kDim]; with splits: null
    float* part_o;   // [nsplit, T*H, kDim] unnormalised outputs (splits only)
    float* part_ml;  // [nsplit, T*H, 2] running max and sum (splits only)
    int blocks_per_split;
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
    return *reinterpret_cast<const uint32_t*>(&v);
}

// Prefetch of one 16-key chunk: thread i loads dims 32 (i % 16) .. +32 of key (i / 16) of the chunk as raw
// entry bytes (32 e4m3 codes, 32 e2m1 codes or 32 bf16 values) and the scale bytes that cover them.
enum ChunkMode : int { kMasked = 0, kCodes8 = 1, kBf16 = 2, kCodes4 = 3 };
struct Chunk {
    uint4 raw[4];
    uint32_t sc;      // scale bytes, one per `blk` dims
    int mode, blk;
    bool e4m3_scale;  // fp4 with e4m3 scales (else ue8m0)
};

// Entry address of this thread's key in the chunk starting at first_key (null past the list's end) and
// whether it is a window entry.
__device__ __forceinline__ const uint8_t* chunk_key(const KeyList& keys, int64_t t, int n, int nwin, int first_key,
                                                   bool* window) {
    const int j = first_key + (threadIdx.x >> 4);
    *window = j < nwin;
    return j < n ? keys.at(t, j) : nullptr;
}

// Reads of an entry: from global memory through the read-only cache, or from a copy in shared memory.
template <bool GLOBAL, typename T>
__device__ __forceinline__ T read(const T* p) {
    if constexpr (GLOBAL) return __ldg(p);
    else return *p;
}

template <bool GLOBAL>
__device__ __forceinline__ uint32_t scale_bytes(const uint8_t* p, const EntryFormat& f, int c0, int* blk) {
    *blk = f.block < kPartDims ? f.block : kPartDims;
    uint32_t sc = 0;
    for (int u = 0; u < kPartDims / *blk; ++u)
        sc |= static_cast<uint32_t>(read<GLOBAL>(p + f.scale_offset + (c0 + u * *blk) / f.block)) << (8 * u);
    return sc;
}

// This thread's part of entry p (null: a masked key), from global memory or (GLOBAL false) a shared copy.
template <bool GLOBAL = true>
__device__ __forceinline__ void load_chunk(Chunk& c, const uint8_t* p, const EntryFormat& f) {
    const int c0 = kPartDims * (threadIdx.x & 15);
    c.mode = kMasked;
    if (!p) return;
    if (f.kind == kEntryFp8 && c0 >= f.quant_dims) {
        const uint4* b = reinterpret_cast<const uint4*>(p + f.bf16_offset + 2 * (c0 - f.quant_dims));
#pragma unroll
        for (int u = 0; u < 4; ++u) c.raw[u] = read<GLOBAL>(b + u);
        c.mode = kBf16;
    } else if (f.kind == kEntryFp8) {
        const uint4* b = reinterpret_cast<const uint4*>(p + c0);
        c.raw[0] = read<GLOBAL>(b);
        c.raw[1] = read<GLOBAL>(b + 1);
        c.sc = scale_bytes<GLOBAL>(p, f, c0, &c.blk);
        c.mode = kCodes8;
    } else {
        c.raw[0] = read<GLOBAL>(reinterpret_cast<const uint4*>(p + c0 / 2));
        c.sc = scale_bytes<GLOBAL>(p, f, c0, &c.blk);
        c.e4m3_scale = f.kind == kEntryFp4E4m3;
        c.mode = kCodes4;
    }
}

__device__ __forceinline__ uint32_t raw_word(const Chunk& c, int w) {
    const uint4& v = c.raw[w >> 2];
    return (w & 3) == 0 ? v.x : (w & 3) == 1 ? v.y : (w & 3) == 2 ? v.z : v.w;
}

// Decodes this thread's part of the chunk into bf16 pairs o (zeros for a masked key: P is 0 there, V must be
// finite); returns whether the key is real.
__device__ __forceinline__ bool decode_chunk(const Chunk& c, uint32_t (&o)[kPartDims / 2]) {
    if (c.mode == kBf16) {
#pragma unroll
        for (int w = 0; w < kPartDims / 2; ++w) o[w] = raw_word(c, w);
    } else if (c.mode == kCodes8) {
#pragma unroll
        for (int w = 0; w < kPartDims / 4; ++w) {
            uint32_t v[2];
            e4m3x4_to_bf16(raw_word(c, w), v);
            const ScaleFactors f = e4m3_ue8m0_factors((c.sc >> (8 * ((4 * w) / c.blk))) & 0xffu);
            o[2 * w] = apply(f, v[0]);
            o[2 * w + 1] = apply(f, v[1]);
        }
    } else if (c.mode == kCodes4) {
#pragma unroll
        for (int w = 0; w < kPartDims / 8; ++w) {
            uint32_t v[4];
            e2m1x8_to_bf16(raw_word(c, w), v);
            const uint8_t sb = static_cast<uint8_t>(c.sc >> (8 * ((8 * w) / c.blk)));
            const ScaleFactors f = c.e4m3_scale ? e2m1_e4m3_factors(sb) : e2m1_ue8m0_factors(sb);
#pragma unroll
            for (int n = 0; n < 4; ++n) o[4 * w + n] = apply(f, v[n]);
        }
    } else {
#pragma unroll
        for (int w = 0; w < kPartDims / 2; ++w) o[w] = 0u;
    }
    return c.mode != kMasked;
}

}  // namespace peregrine::cuda::sparse
