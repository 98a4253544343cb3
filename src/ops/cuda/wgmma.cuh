#pragma once
// Hopper warpgroup MMA (wgmma) plumbing shared by the kernels that use it (moe_gemm_fp4_wgmma.cu,
// index_wgmma.cu): shared-memory descriptors for K-major bf16 tiles in the 128-byte swizzle, the fence, commit
// and wait, the proxy fence between shared-memory writes and the tensor cores' reads, and a register fence for
// accumulators the tensor cores write asynchronously.
#include <cstdint>

namespace peregrine::cuda::wgmma {

// Shared-memory matrix descriptor of a K-major bf16 tile in the 128-byte swizzle: rows of 128 bytes, atoms
// of 8 rows (1024 bytes, the stride between 8-row groups); the leading offset is unused in this layout.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
    return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
           (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the accumulators where the tensor cores wrote them until the wait (no early reads).
__device__ __forceinline__ void hold(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Byte offset of 16-byte chunk c (of the 8 in a 128-byte row) of row r in a K-major 128-byte-swizzle tile: the
// chunk lands at c ^ (r % 8), which is what the descriptor's swizzle reads back when the tile starts on 1024 bytes.
__device__ __forceinline__ uint32_t sw128_offset(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// Makes this thread's writes to shared memory (cp.async included) visible to the tensor cores' reads; a
// barrier after it then covers every thread's.
__device__ __forceinline__ void proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace peregrine::cuda::wgmma
