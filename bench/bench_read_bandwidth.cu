// How fast one GPU streams a weight-sized buffer with reads only, by load scheme: the ceiling the decode GEMVs
// are measured against (the device-to-device copy that `peregrine bench engine` divides by counts bytes read and
// written, which is not the same limit). Schemes: a flat grid-stride stream with U 16-byte loads in flight per
// thread; the decode GEMV's access pattern without its arithmetic (each warp streams 16 rows of a [N, K] matrix
// through a ring of ST cp.async stages of CH bytes per row, eight warps a CTA, one CTA per SM); and 1-D bulk
// copies (cp.async.bulk on an mbarrier) of CH bytes per row, 128 rows a stage.
//
//   build/bench/bench_read_bandwidth [MiB]      (default 1152: 192 routed V4.1 w1 experts, beyond L2)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                                       \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
            std::exit(1);                                                                              \
        }                                                                                              \
    } while (0)

namespace {

__device__ unsigned g_sink;  // written only if the xor of everything read hits a magic value: loads stay live

template <int U>
__global__ void flat_kernel(const uint4* __restrict__ p, size_t n16) {
    unsigned acc = 0;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n16; i += stride * U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const size_t j = i + u * stride;
            v[u] = j < n16 ? __ldcs(p + j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x9e3779b9u) g_sink = acc;
}

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp16(void* s, const void* g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(s)), "l"(g) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_group() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// The GEMV's copy side: warp w of a CTA streams rows [g * 128 + 16 w, +16) of group g, CH bytes a stage.
template <int CH, int ST>
__global__ void __launch_bounds__(256, 1) ring_kernel(const uint8_t* __restrict__ w, int N, int Kb) {
    extern __shared__ uint8_t sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint8_t* mine = sm + warp * ST * 16 * CH;
    const int groups = N / 128, S = Kb / CH;
    constexpr int P = CH / 16;
    unsigned acc = 0;
    for (int gi = blockIdx.x; gi < groups; gi += gridDim.x) {
        const uint8_t* base = w + (static_cast<size_t>(gi) * 128 + warp * 16) * Kb;
        auto issue = [&](int s) {
            if (s < S) {
                uint8_t* slot = mine + (s % ST) * 16 * CH;
#pragma unroll
                for (int i = 0; i < 16 * P / 32; ++i) {
                    const int q = lane + 32 * i, r = q / P, seg = q % P;
                    cp16(slot + r * CH + seg * 16, base + static_cast<size_t>(r) * Kb + s * CH + seg * 16);
                }
            }
            commit();
        };
#pragma unroll
        for (int s = 0; s < ST - 1; ++s) issue(s);
        for (int s = 0; s < S; ++s) {
            issue(s + ST - 1);
            wait_group<ST - 1>();
            __syncwarp();
            const uint32_t* slot = reinterpret_cast<const uint32_t*>(mine + (s % ST) * 16 * CH);
#pragma unroll
            for (int i = 0; i < 16 * CH / 4 / 32; i += 4) acc ^= slot[i * 32 + lane];
            __syncwarp();
        }
        wait_group<0>();
    }
    if (acc == 0x9e3779b9u) g_sink = acc;
}

__device__ __forceinline__ void mbar_init(uint64_t* b) {
    asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(smem_u32(b)));
}
__device__ __forceinline__ void mbar_expect(uint64_t* b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* s, const void* g, unsigned bytes, uint64_t* b) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(s)),
        "l"(g), "r"(bytes), "r"(smem_u32(b))
        : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
    asm volatile(
        "{\n.reg .pred p;\nwait_%=: mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n@!p bra wait_%=;\n}" ::"r"(
            smem_u32(b)),
        "r"(parity)
        : "memory");
}

// Bulk copies: a stage is 128 rows x CH bytes, one copy per row (threads 0..127), ST stages on mbarriers.
template <int CH, int ST>
__global__ void __launch_bounds__(256, 1) bulk_kernel(const uint8_t* __restrict__ w, int N, int Kb) {
    extern __shared__ __align__(128) uint8_t sm[];
    __shared__ __align__(8) uint64_t full[ST];
    const int tid = threadIdx.x;
    if (tid == 0)
        for (int i = 0; i < ST; ++i) mbar_init(&full[i]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    const int groups = N / 128, S = Kb / CH;
    unsigned acc = 0;
    int done = 0;  // stages this CTA has consumed: slot and phase of the next
    auto issue = [&](const uint8_t* base, int s) {
        const int slot = (done + s) % ST;
        if (tid == 0) mbar_expect(&full[slot], 128 * CH);
        __syncthreads();  // the expectation is armed before any copy can complete
        if (tid < 128)
            bulk_copy(sm + slot * 128 * CH + tid * CH, base + static_cast<size_t>(tid) * Kb + s * CH, CH, &full[slot]);
    };
    for (int gi = blockIdx.x; gi < groups; gi += gridDim.x) {
        const uint8_t* base = w + static_cast<size_t>(gi) * 128 * Kb;
        for (int j = 0; j < ST - 1 && j < S; ++j) issue(base, j);
        for (int s = 0; s < S; ++s) {
            if (s + ST - 1 < S) issue(base, s + ST - 1);
            const int slot = (done + s) % ST;
            mbar_wait(&full[slot], ((done + s) / ST) & 1);
            const uint32_t* p = reinterpret_cast<const uint32_t*>(sm + slot * 128 * CH);
            for (int i = tid; i < 128 * CH / 4; i += 256 * 4) acc ^= p[i];
            __syncthreads();  // every thread is done with the slot before it is refilled
        }
        done += S;
    }
    if (acc == 0x9e3779b9u) g_sink = acc;
}

}  // namespace

int main(int argc, char** argv) {
    const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1152;
    const int Kb = 2560;  // bytes per row: an FP4 row of 5120 values
    const int N = static_cast<int>(std::max<size_t>(mib << 20, size_t{128} * Kb) / Kb / 128 * 128);
    const size_t bytes = static_cast<size_t>(N) * Kb;
    int dev = 0;
    cudaDeviceProp prop{};
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaGetDeviceProperties(&prop, dev));
    uint8_t* w = nullptr;
    CHECK(cudaMalloc(&w, bytes));
    CHECK(cudaMemset(w, 1, bytes));
    const int sms = prop.multiProcessorCount;
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::printf("%s, %d SMs: reading %.0f MiB (%d rows x %d bytes)\n", prop.name, sms, bytes / 1048576.0, N, Kb);
    auto time = [&](const char* name, auto launch) {
        launch();
        CHECK(cudaDeviceSynchronize());
        std::vector<float> t;
        for (int r = 0; r < 9; ++r) {
            CHECK(cudaEventRecord(a));
            launch();
            CHECK(cudaEventRecord(b));
            CHECK(cudaEventSynchronize(b));
            float ms = 0.0f;
            CHECK(cudaEventElapsedTime(&ms, a, b));
            t.push_back(ms);
        }
        CHECK(cudaGetLastError());
        std::sort(t.begin(), t.end());
        std::printf("%-28s %9.1f us %7.0f GB/s (median of 9)\n", name, t[4] * 1e3, bytes / (t[4] * 1e-3) / 1e9);
    };
    const size_t n16 = bytes / 16;
    time("flat, 1 load in flight", [&] { flat_kernel<1><<<sms * 4, 256>>>(reinterpret_cast<const uint4*>(w), n16); });
    time("flat, 4 loads in flight", [&] { flat_kernel<4><<<sms * 4, 256>>>(reinterpret_cast<const uint4*>(w), n16); });
    time("flat, 8 loads in flight", [&] { flat_kernel<8><<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(w), n16); });
    auto ring = [&](auto kernel, int ch, int st, const char* name) {
        const int smem = 8 * st * 16 * ch;
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        time(name, [&] { kernel<<<sms, 256, smem>>>(w, N, Kb); });
    };
    ring(ring_kernel<128, 4>, 128, 4, "GEMV ring 128 B x 4");
    ring(ring_kernel<256, 4>, 256, 4, "GEMV ring 256 B x 4");
    ring(ring_kernel<128, 12>, 128, 12, "GEMV ring 128 B x 12");
    auto bulk = [&](auto kernel, int ch, int st, const char* name) {
        const int smem = st * 128 * ch;
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        time(name, [&] { kernel<<<sms, 256, smem>>>(w, N, Kb); });
    };
    bulk(bulk_kernel<256, 6>, 256, 6, "bulk copies 256 B x 6");
    bulk(bulk_kernel<512, 3>, 512, 3, "bulk copies 512 B x 3");
    CHECK(cudaFree(w));
    return 0;
}
