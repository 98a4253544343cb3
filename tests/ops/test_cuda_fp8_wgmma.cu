// Hopper's FP8 warpgroup MMA (wgmma m64n64k32 e4m3 x e4m3 -> fp32), the operation an FP8 expert or dense GEMM
// would build on, against exact sums on the host. V4.1's weights and activations carry a scale per 32 values, so
// such a kernel must add each k32 step's product into fp32 accumulators with its scales ("promotion"); this test
// measures what the tensor cores' own accumulation loses, per k32 step and over a k128 chain, and checks the
// operand layout (128-byte swizzled K-major tiles, 32 bytes a k32 step). It prints the error in units of the sum of
// |products| and how often the bf16-rounded result differs from the exact one. Skipped without a GPU.
#include "ops/cuda/wgmma.cuh"
#include "kv/entry_format.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

using namespace peregrine;
using namespace peregrine::cuda::wgmma;

constexpr int kM = 64, kN = 64, kK = 128;  // one 128-byte row of e4m3 per row: four k32 steps

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int ACC>
__device__ __forceinline__ void wgmma_fp8(float (&d)[32], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        PG_WGMMA_D32 ", %32, %33, %34, 1, 1;\n}\n"
        : PG_WGMMA_ACC32(d)
        : "l"(a), "l"(b), "n"(ACC));
}

// One warpgroup: out_step[s] = A[:, 32s..] B[:, 32s..]^T for each k32 step s (fresh accumulators: what a promoting
// kernel adds up), out_chain = the four steps chained in the tensor cores' accumulators.
__global__ void __launch_bounds__(128) fp8_probe_kernel(const uint8_t* a, const uint8_t* b, float* out_step,
                                                        float* out_chain) {
    __shared__ __align__(1024) uint8_t As[kM * kK], Bs[kN * kK];
    const int tid = threadIdx.x;
    for (int i = tid; i < kM * 8; i += 128) {  // 16-byte chunk c of row r, 128-byte swizzle
        const int r = i >> 3, c = i & 7;
        *reinterpret_cast<uint4*>(As + sw128_offset(r, c)) = *reinterpret_cast<const uint4*>(a + r * kK + 16 * c);
        *reinterpret_cast<uint4*>(Bs + sw128_offset(r, c)) = *reinterpret_cast<const uint4*>(b + r * kK + 16 * c);
    }
    proxy_fence();
    __syncthreads();
    const int lane = tid & 31, wq = tid >> 5, g = lane >> 2, t = lane & 3;
    auto store = [&](float* o, const float (&d)[32]) {
        for (int i = 0; i < 32; ++i) {
            const int row = wq * 16 + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * t + (i & 1);
            o[row * kN + col] = d[i];
        }
    };
    for (int s = 0; s < kK / 32; ++s) {
        float d[32];
        for (int i = 0; i < 32; ++i) d[i] = 0.0f;
        wgmma_fence();
        wgmma_fp8<0>(d, desc_sw128(smem_u32(As) + 32 * s), desc_sw128(smem_u32(Bs) + 32 * s));
        wgmma_commit();
        wgmma_wait<0>();
        for (int i = 0; i < 32; ++i) hold(d[i]);
        store(out_step + s * kM * kN, d);
    }
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0.0f;
    wgmma_fence();
    wgmma_fp8<0>(d, desc_sw128(smem_u32(As)), desc_sw128(smem_u32(Bs)));
    for (int s = 1; s < kK / 32; ++s)
        wgmma_fp8<1>(d, desc_sw128(smem_u32(As) + 32 * s), desc_sw128(smem_u32(Bs) + 32 * s));
    wgmma_commit();
    wgmma_wait<0>();
    for (int i = 0; i < 32; ++i) hold(d[i]);
    store(out_chain, d);
}

float round_bf16_host(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&x, &u, 4);
    return x;
}

TEST(CudaFp8Wgmma, AccumulationAgainstExactSums) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    if (prop.major != 9) GTEST_SKIP() << "wgmma needs sm_90";
    std::mt19937 rng(11);
    // Codes of every magnitude (no NaN), so sums cancel and span exponents as quantised activations do.
    auto code = [&] {
        uint8_t c;
        do c = static_cast<uint8_t>(rng() & 0xff);
        while ((c & 0x7f) == 0x7f);
        return c;
    };
    std::vector<uint8_t> a(kM * kK), b(kN * kK);
    for (auto& c : a) c = code();
    for (auto& c : b) c = code();
    uint8_t *da, *db;
    float *dstep, *dchain;
    ASSERT_EQ(cudaMalloc(&da, a.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&db, b.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dstep, sizeof(float) * 4 * kM * kN), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dchain, sizeof(float) * kM * kN), cudaSuccess);
    cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice);
    fp8_probe_kernel<<<1, 128>>>(da, db, dstep, dchain);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> step(4 * kM * kN), chain(kM * kN);
    cudaMemcpy(step.data(), dstep, sizeof(float) * step.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(chain.data(), dchain, sizeof(float) * chain.size(), cudaMemcpyDeviceToHost);
    double worst_step = 0, worst_chain = 0, worst_promoted = 0;
    int64_t bf16_differ_chain = 0, bf16_differ_promoted = 0;
    for (int m = 0; m < kM; ++m)
        for (int nn = 0; nn < kN; ++nn) {
            double exact = 0, mag = 0, promoted = 0;
            for (int s = 0; s < 4; ++s) {
                double e = 0, g = 0;
                for (int k = 32 * s; k < 32 * s + 32; ++k) {
                    const double p = static_cast<double>(sf_e4m3(a[m * kK + k])) * sf_e4m3(b[nn * kK + k]);
                    e += p;
                    g += std::fabs(p);
                }
                const float got = step[(s * kM + m) * kN + nn];
                worst_step = std::max(worst_step, g > 0 ? std::fabs(got - e) / g : std::fabs(got - e));
                promoted = static_cast<double>(static_cast<float>(promoted) + got);  // fp32 promotion, in step order
                exact += e;
                mag += g;
            }
            worst_chain = std::max(worst_chain, mag > 0 ? std::fabs(chain[m * kN + nn] - exact) / mag : 0.0);
            worst_promoted = std::max(worst_promoted, mag > 0 ? std::fabs(promoted - exact) / mag : 0.0);
            const float want = round_bf16_host(static_cast<float>(exact));
            bf16_differ_chain += round_bf16_host(chain[m * kN + nn]) != want;
            bf16_differ_promoted += round_bf16_host(static_cast<float>(promoted)) != want;
        }
    cudaFree(da);
    cudaFree(db);
    cudaFree(dstep);
    cudaFree(dchain);
    std::printf("PARITY fp8 wgmma m64n64k32 e4m3: worst |error| / sum|products|: per k32 step %.3g, k32 steps promoted "
                "in fp32 %.3g, k128 chained %.3g; bf16 results differing from the exact sum's: promoted %lld, chained "
                "%lld of %d\n",
                worst_step, worst_promoted, worst_chain, static_cast<long long>(bf16_differ_promoted),
                static_cast<long long>(bf16_differ_chain), kM * kN);
    // A wrong operand layout or descriptor gives errors of the order of the sums themselves; the tensor cores'
    // reduced-precision accumulation stays far below bf16's step (2^-8).
    EXPECT_LT(worst_step, 0x1p-10);
    EXPECT_LT(worst_chain, 0x1p-10);
}

}  // namespace
