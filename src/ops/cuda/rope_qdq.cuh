#pragma once
// RoPE and the quantise-dequantise of attention rows on the device, a pair of rotary dims or a quad (four floats) a
// thread: the arithmetic of elementwise.cu's rope and qdq kernels, shared with the kernels that fuse them into
// others (norm_hc.cu's rms_norm_rope_qdq).
#include "ops/cuda/device_math.cuh"

#include <cstdint>

namespace peregrine::cuda {

// Pair k of the rotary dims of a row at position p, rotated (bf16 results).
__device__ __forceinline__ void rope_pair(float& a, float& b, int64_t p, const float* freqs, int k, bool inverse) {
    const float ang = static_cast<float>(p) * freqs[k];
    const float c = cos_cr(ang);
    float s = sin_cr(ang);
    if (inverse) s = -s;
    const float x = a, y = b;
    a = round_bf16(x * c - y * s);
    b = round_bf16(x * s + y * c);
}

// kind 0: e4m3 with a ue8m0 scale; 1: e2m1 with a ue8m0 scale; 2: e2m1 with an e4m3 scale.
__device__ __forceinline__ float qdq_scale(float amax, int kind) {
    if (kind == 0) return act_quant_scale(amax);
    if (kind == 1) return pow2_round_scale(fmaxf(amax, 6.0f * ldexpf(1.0f, -126)), 1.0f / 6.0f);
    return round_e4m3(fmaxf(amax, 6.0f * ldexpf(1.0f, -9)) / 6.0f);
}
__device__ __forceinline__ float qdq_value(float v, float s, int kind) {
    if (kind == 0) return round_bf16(act_quant_value(v, s) * s);
    return round_bf16(e2m1_to_f32(f32_to_e2m1(fminf(fmaxf(v / s, -6.0f), 6.0f))) * s);
}

// A quad of one block (spread over `lanes` lanes, every lane of the warp taking part): its max |x|, and the quad
// quantised-dequantised under the block's scale.
__device__ __forceinline__ float quad_amax(float4 v, int lanes) {
    return group_amax(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))), lanes);
}
__device__ __forceinline__ float4 qdq_quad(float4 v, float amax, int kind) {
    const float s = qdq_scale(amax, kind);
    return make_float4(qdq_value(v.x, s, kind), qdq_value(v.y, s, kind), qdq_value(v.z, s, kind),
                       qdq_value(v.w, s, kind));
}

// rope_qdq's work on quad g of rows of `heads` heads (hs floats, hs / 4 quads a head; rows rs floats apart): RoPE
// on the quad's rotary dims, then the quantise-dequantise of dims [0, n) of its head in blocks. Every lane of the
// warp calls it (a block's max is a shuffle over its block / 4 lanes, all of them live or all dead: hs, offset and
// dim multiples of 4, hs and n of the block); only live lanes write.
__device__ __forceinline__ void rope_qdq_quad(float* x, int64_t g, bool live, int heads, int64_t rs, int64_t hs,
                                              int offset, const int64_t* pos, const float* freqs, int dim,
                                              bool inverse, int n, int block, int kind) {
    const int64_t qh = hs / 4, rh = (live ? g : 0) / qh, r = rh / heads;
    const int c = static_cast<int>((live ? g : 0) % qh) * 4;  // the quad's first dim in its head
    float* p = x + r * rs + (rh % heads) * hs + c;
    float4 v = *reinterpret_cast<const float4*>(p);
    if (c >= offset && c < offset + dim) {  // two pairs of rotary dims
        const int k = (c - offset) / 2;
        rope_pair(v.x, v.y, pos[r], freqs, k, inverse);
        rope_pair(v.z, v.w, pos[r], freqs, k + 1, inverse);
    }
    const float amax = quad_amax(v, block / 4);
    if (!live) return;
    if (c < n) v = qdq_quad(v, amax, kind);
    *reinterpret_cast<float4*>(p) = v;
}

// Whether rope_qdq_quad takes rows of this shape (else rope then qdq_rows run apart): quads that do not straddle the
// rotary dims or a quantisation block, and whole blocks of lanes.
inline bool rope_qdq_takes_quads(const float* x, int64_t rs, int64_t hs, int offset, int dim, int n, int block) {
    return quad_blocks(block) && aligned16(x) && rs % 4 == 0 && hs % 4 == 0 && offset % 4 == 0 && dim % 4 == 0 &&
           offset + dim <= hs && hs % block == 0 && n % block == 0 && n <= hs;
}

}  // namespace peregrine::cuda
