#pragma once
// Our routed FP4 experts at a peer's grouped-GEMM shape, for the harnesses that time a peer's experts beside ours
// (one translation unit each, like peer_common.h). Linked from the build (build.sh).
#include "peer_common.h"

#include "ops/cuda/kernels.h"
#include "ops/cuda/moe_gemm_fp4.h"

#include <cmath>

namespace peers {

// Bytes lo + (hash % span): FP4 codes (span 256) or ue8m0 scales.
__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed, uint32_t lo, uint32_t span) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x)
        p[i] = static_cast<uint8_t>(lo + mix(static_cast<uint32_t>(i) * 2654435761u ^ seed) % span);
}

struct Ours {
    double ms = 0, err = 0;  // err: max|d| / max|ref|
};

// E experts of V4.1's format (e2m1 codes, a ue8m0 scale per 32 of K), N x K each, rows_per_expert pairs each, routed
// evenly; the kernel the engine picks for that routing (the GEMV quantising its own activations up to 8 rows an
// expert, else act_quant then the grouped wgmma kernel), timed alone with the routing tables built once, against the
// exact routed kernel (linear_tiled). `what` labels the printed line.
inline Ours ours_routed(const char* what, int E, int N, int K, int rows_per_expert, int reps, void* flush,
                        size_t flush_bytes) {
    using namespace peregrine::cuda;
    const int64_t pairs = int64_t(E) * rows_per_expert;
    const size_t wbytes = size_t(N) * K / 2, sbytes = size_t(N) * (K / 32);
    uint8_t* w = device<uint8_t>(wbytes * E);
    uint8_t* sc = device<uint8_t>(sbytes * E);
    fill_bytes<<<4096, 256>>>(w, wbytes * E, 5, 0, 256);
    fill_bytes<<<1024, 256>>>(sc, sbytes * E, 6, 120, 8);  // 2^-7 .. 2^0
    std::vector<const void*> ptrs(2 * size_t(E));
    for (int e = 0; e < E; ++e) ptrs[e] = w + wbytes * e, ptrs[E + e] = sc + sbytes * e;
    const void** table = upload(ptrs);
    const ExpertTable ex{table, reinterpret_cast<const uint8_t* const*>(table + E)};
    LinearDev d;
    d.kind = 3, d.out = N, d.in = K, d.act_block = 32, d.w = w, d.scale = sc;

    std::vector<int32_t> sel(static_cast<size_t>(pairs));
    for (int64_t p = 0; p < pairs; ++p) sel[p] = static_cast<int32_t>(p % E);  // every expert once before any twice
    LinearRouting rt;
    rt.tile_rows = routing_tile_rows(pairs, E);
    rt.max_tiles = static_cast<unsigned>((pairs + rt.tile_rows - 1) / rt.tile_rows + E);
    int32_t *sel_d = upload(sel), *row_map = device<int32_t>(pairs), *tiles = device<int32_t>(4 * rt.max_tiles),
            *n_tiles = device<int32_t>(1);
    expert_tiles(sel_d, pairs, E, rt.tile_rows, row_map, tiles, n_tiles);
    rt.row_map = row_map, rt.tiles = tiles, rt.n_tiles = n_tiles;

    float *x = device<float>(size_t(pairs) * K), *xq = device<float>(size_t(pairs) * K),
          *xs = device<float>(size_t(pairs) * (K / 32)), *y = device<float>(size_t(pairs) * N),
          *ref = device<float>(size_t(pairs) * N);
    fill_uniform<<<4096, 256>>>(x, size_t(pairs) * K, 7, 2.0f);
    act_quant(x, pairs, K, 32, xq, xs);
    linear_tiled(xq, xs, pairs, d, ref, &ex, &rt);
    const bool gemv = rt.tile_rows == 8;
    auto run = [&] {
        if (gemv) linear_gemv(x, nullptr, pairs, d, y, &ex, &rt);
        else fp4_grouped_linear(xq, xs, pairs, 1, E, d, ex, rt, y);
    };
    run();
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<float> got = download(y, size_t(pairs) * N), want = download(ref, size_t(pairs) * N);
    double worst = 0, largest = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
        largest = std::max(largest, std::fabs(double(want[i])));
    }
    Ours o;
    o.err = worst / largest;
    o.ms = median_ms(run, reps, flush, flush_bytes);
    std::printf("  ours %-19s %3d rows/expert, %s: %8.3f ms, max|d| / max|ref| %.2e%s\n", what, rows_per_expert,
                gemv ? "routed GEMV" : "grouped wgmma", o.ms, o.err, o.err > 1e-2 ? "  WRONG" : "");
    for (void* p : {static_cast<void*>(w), static_cast<void*>(sc), static_cast<void*>(table),
                    static_cast<void*>(sel_d), static_cast<void*>(row_map), static_cast<void*>(tiles),
                    static_cast<void*>(n_tiles), static_cast<void*>(x), static_cast<void*>(xq), static_cast<void*>(xs),
                    static_cast<void*>(y), static_cast<void*>(ref)})
        CHECK_CUDA(cudaFree(p));
    return o;
}

}  // namespace peers
