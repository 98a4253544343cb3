#pragma once
// Hopper warpgroup MMA (wgmma) plumbing shared by the kernels that use it (moe_gemm_fp4_wgmma.cu, linear_wgmma.cu,
// index_wgmma.cu, sparse_attention_wgmma.cu): shared-memory descriptors for K-major bf16 tiles in the 128-byte
// swizzle, the fence, commit and wait, the proxy fence between shared-memory writes and the tensor cores' reads, a
// register fence for accumulators the tensor cores write asynchronously, named barriers between warpgroups; the
// accumulator operand lists of the MMA wrappers, and the bf16 MMAs whose A operand comes from registers (wgmma_rs).
#include <cstdint>

// The fp32 accumulators of an m64nNk16 wgmma as inline-asm operands: N / 2 registers a thread, %0 .. %31 for n64
// and %0 .. %63 for n128, written in braces by PG_WGMMA_D32 / PG_WGMMA_D64 and bound as the first outputs by
// PG_WGMMA_ACC32(d) / PG_WGMMA_ACC64(d); the instruction's other operands are numbered after them.
#define PG_WGMMA_D32                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define PG_WGMMA_D64                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "   \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define PG_WGMMA_ACC32(d)                                                                                      \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),            \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define PG_WGMMA_ACC64(d)                                                                                      \
    PG_WGMMA_ACC32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),           \
        "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), \
        "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), \
        "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
        "+f"(d[62]), "+f"(d[63])

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

// d (m64 x n64, fp32) += A (m64 x k16 bf16, registers) * B (k16 x n64 bf16, shared memory, K-major).
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        PG_WGMMA_D32 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n}\n"
        : PG_WGMMA_ACC32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// d (m64 x n128, fp32) += A (m64 x k16 bf16, registers) * B (k16 x n128 bf16, shared memory, K-major).
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        PG_WGMMA_D64 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 0;\n}\n"
        : PG_WGMMA_ACC64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// Keeps the accumulators where the tensor cores wrote them until the wait (no early reads).
__device__ __forceinline__ void hold(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Byte offset of 16-byte chunk c (of the 8 in a 128-byte row) of row r in a K-major 128-byte-swizzle tile: the
// chunk lands at c ^ (r % 8), which is what the descriptor's swizzle reads back when the tile starts on 1024 bytes.
__device__ __forceinline__ uint32_t sw128_offset(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// Makes this thread's writes to shared memory (cp.async included) visible to the tensor cores' reads; a
// barrier after it then covers every thread's.
__device__ __forceinline__ void proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Named barriers (0 is __syncthreads) among `threads` threads, which let warpgroups of a block wait for each other
// without holding up the rest: sync waits for the count, arrive counts this thread without waiting.
__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace peregrine::cuda::wgmma
