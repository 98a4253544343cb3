// The indexer's scores beside DeepInfer's DeepGEMM FP8 MQA-logits kernels (deepinfer-gemm, from PyPI; nothing of it
// is in this repository), at V4.1-Flash's indexer (32 heads x 128) in one process with the same L2 flushing:
// - decode: sm90_fp8_paged_mqa_logits (one query row per sequence over its paged keys, 64 keys a block) against our
//   shipped decode scorer (index_scores_stream on the tensor cores, the keys' state entries read through a table);
// - prefill: sm90_fp8_mqa_logits (rows of one sequence over its keys, causal ranges) against ours as a prefill step
//   runs it (the queries' and keys' bf16 copies, then index_scores_mma's wgmma kernel over 64-row tiles).
// score[t, j] = sum_h w[t, h] * relu(q[t, h] . k[j]) in both. Formats differ: the peer takes FP8 e4m3 queries and
// keys with an fp32 scale per key (132 B a key), the nearest its Hopper kernels take; V4.1's keys are fp4 e2m1 with
// a ue8m0 scale per 32 values (our 80 B state entries), its queries fp4 values (our fp32 tensor). Each sequence reads
// its own keys (nothing shared in L2). The peer's results are checked against an fp32 reference on sampled rows;
// ours are held by test_cuda_attn_fast against our exact kernels.
//
//   deepinfer_indexer [--reps 10] [--decode 1,8,64,128] [--keys 131072] [--prefill 4096x65536] [--json FILE]
#include <deep_gemm/impls/sm90_fp8_mqa_logits.cuh>
#include <deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh>
#include <deep_gemm/scheduler/sm90_paged_mqa_logits.cuh>

#include "kv/entry_format.h"
#include "ops/cuda/kernels.h"
#include "peer_common.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

namespace {

using namespace peers;
namespace pc = peregrine::cuda;

constexpr uint32_t kHeads = 32, kDim = 128;
constexpr uint32_t kTmaThreads = 128, kMathThreads = 512;  // the host code's choices (csrc, sm90_fp8_mqa_logits.hpp)
constexpr uint32_t kStages = 3;
// Prefill: 128 / heads query rows a block, 256 keys a block. Decode: 64 keys a page, four math warpgroups (256 keys).
constexpr uint32_t kBlockQ = 128 / kHeads, kBlockKv = 256, kPageKeys = 64, kSplitKv = 256;
constexpr uint32_t kPageBytes = kPageKeys * (kDim + 4);  // the peer's fused cache: 64 x 128 codes, then 64 fp32 scales

constexpr uint32_t align_up(uint32_t x, uint32_t a) { return (x + a - 1) / a * a; }

void* prefill_kernel() {
    return reinterpret_cast<void*>(&deep_gemm::sm90_fp8_mqa_logits<kHeads, kDim, kBlockQ, kBlockKv, kStages, kStages,
                                                                   kSms, kTmaThreads, kMathThreads, float>);
}
void* decode_kernel() {
    return reinterpret_cast<void*>(&deep_gemm::sm90_fp8_paged_mqa_logits<1, kHeads, kDim, kPageKeys, true, false,
                                                                         kStages, kStages, kSplitKv, kTmaThreads,
                                                                         kMathThreads, float>);
}
template <uint32_t kAlignedBatch>
void* schedule_kernel() {
    return reinterpret_cast<void*>(&deep_gemm::sched::sm90_paged_mqa_logits_metadata<kAlignedBatch, kSplitKv, kSms>);
}

// Shared memory of the two kernels (the host code's arithmetic).
uint32_t prefill_smem() {
    return kStages * (kBlockQ * kHeads * kDim) + kStages * (kBlockKv * kDim) + kStages * (kBlockQ * kHeads * 4) +
           kStages * (kBlockKv * 4) + (kStages * 2 + kStages * 2 + (kMathThreads / 128) * 2) * 8 + 4;
}
uint32_t decode_smem() {
    const uint32_t swizzle = kDim * 8;
    const uint32_t q_pipe = kStages * (kHeads * kDim + align_up(kHeads * 4, swizzle)) + align_up(kStages * 16, swizzle);
    const uint32_t kv_pipe =
        kStages * (kPageKeys * kDim + align_up(kPageKeys * 4, swizzle)) + align_up(kStages * 16, swizzle);
    return q_pipe + (kSplitKv / 64) * kv_pipe + (kSplitKv / 64) * 16 + 4;
}

// ref[i, j] = sum_h w[t, h] relu(sum_d q[t, h, d] k[key(t, j), d]) * s[key(t, j)] for the sampled rows t = rows[i];
// key(t, j): the peer's paged layout when pages is set, else row-major keys.
__global__ void reference(const __nv_fp8_e4m3* q, const float* w, const uint8_t* kv, const float* ks,
                          const int32_t* pages, uint32_t pages_per_row, const int32_t* rows, uint32_t n, float* ref) {
    const uint32_t j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (j >= n) return;
    const uint32_t t = static_cast<uint32_t>(rows[i]);
    const uint8_t* k;
    float s;
    if (pages) {
        const size_t page = static_cast<size_t>(pages[size_t(t) * pages_per_row + j / kPageKeys]);
        k = kv + page * kPageBytes + (j % kPageKeys) * kDim;
        s = reinterpret_cast<const float*>(kv + page * kPageBytes + kPageKeys * kDim)[j % kPageKeys];
    } else {
        k = kv + size_t(j) * kDim;
        s = ks[j];
    }
    float acc = 0.0f;
    for (uint32_t h = 0; h < kHeads; ++h) {
        const __nv_fp8_e4m3* qh = q + (size_t(t) * kHeads + h) * kDim;
        float dot = 0.0f;
        for (uint32_t d = 0; d < kDim; ++d)
            dot += static_cast<float>(qh[d]) * static_cast<float>(reinterpret_cast<const __nv_fp8_e4m3*>(k)[d]);
        acc += fmaxf(dot, 0.0f) * w[t * kHeads + h];
    }
    ref[size_t(i) * n + j] = acc * s;
}

// The peer's fused paged cache: per page 64 x 128 e4m3 codes, then 64 fp32 scales.
__global__ void fill_pages(uint8_t* cache, size_t pages, uint32_t seed) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < pages * kPageBytes;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const uint32_t at = static_cast<uint32_t>(i % kPageBytes);
        const uint32_t h = mix(static_cast<uint32_t>(i) * 2654435761u ^ seed);
        if (at < kPageKeys * kDim) {
            cache[i] = __nv_fp8_e4m3((static_cast<float>(h & 0xffff) / 32768.0f - 1.0f) * 224.0f).__x;
        } else if (at % 4 == 0) {
            *reinterpret_cast<float*>(cache + i) = exp2f(static_cast<float>(h % 8) - 12.0f);
        }
    }
}

// Our keys: state entries of format f (fp4 e2m1 codes, ue8m0 scales near 1, zero padding).
__global__ void fill_entries(uint8_t* e, size_t n, peregrine::EntryFormat f, uint32_t seed) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n * f.bytes;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const uint32_t at = static_cast<uint32_t>(i % f.bytes);
        const uint32_t h = mix(static_cast<uint32_t>(i) * 2654435761u ^ seed);
        e[i] = at < static_cast<uint32_t>(f.scale_offset) ? static_cast<uint8_t>(h)
               : at < static_cast<uint32_t>(f.scale_offset + f.dim / f.block) ? static_cast<uint8_t>(125 + h % 5)
                                                                               : 0;
    }
}

// Our queries: fp4 values (e2m1 times a power of two per 32) in fp32.
__global__ void fill_fp4_values(float* p, size_t n, uint32_t seed) {
    const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const uint32_t h = mix(static_cast<uint32_t>(i) * 2654435761u ^ seed);
        const uint32_t b = mix(static_cast<uint32_t>(i / 32) * 2246822519u ^ seed);
        p[i] = (h & 8 ? -1.0f : 1.0f) * e2m1[h & 7] * exp2f(static_cast<float>(b % 5) - 2.0f);
    }
}

__global__ void entry_table(const uint8_t* base, size_t n, uint32_t bytes, const uint8_t** table) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x)
        table[i] = base + i * bytes;
}


void launch(void* fn, uint32_t threads, uint32_t smem, void** args) {
    cudaLaunchConfig_t c{};
    c.gridDim = dim3(kSms);
    c.blockDim = dim3(threads);
    c.dynamicSmemBytes = smem;
    CHECK_CUDA(cudaLaunchKernelExC(&c, fn, args));
}

// max |peer - ref| / max |ref| over the sampled rows' first n[i] scores (peer rows of `stride`).
double sampled_error(const float* peer, uint32_t stride, const __nv_fp8_e4m3* q, const float* w, const uint8_t* kv,
                     const float* ks, const int32_t* pages, uint32_t pages_per_row, const std::vector<int32_t>& rows,
                     const std::vector<uint32_t>& n, uint32_t width) {
    int32_t* rows_d = upload(rows);
    float* ref = device<float>(rows.size() * width);
    reference<<<dim3((width + 127) / 128, static_cast<uint32_t>(rows.size())), 128>>>(q, w, kv, ks, pages,
                                                                                  pages_per_row, rows_d, width, ref);
    CHECK_CUDA(cudaGetLastError());
    const auto r = download(ref, rows.size() * width);
    double worst = 0, largest = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
        const auto got = download(peer + size_t(rows[i]) * stride, n[i]);
        for (uint32_t j = 0; j < n[i]; ++j) {
            worst = std::max(worst, std::fabs(double(got[j]) - r[i * width + j]));
            largest = std::max(largest, std::fabs(double(r[i * width + j])));
        }
    }
    CHECK_CUDA(cudaFree(rows_d));
    CHECK_CUDA(cudaFree(ref));
    return worst / largest;
}

struct Result {
    std::string what;
    uint32_t rows;
    uint64_t scores, keys_read;  // keys read: once per score (decode), once per sequence (prefill)
    double peer_ms, ours_ms, peer_err;
    double peer_key_bytes, ours_key_bytes;  // per key read
};

// Decode: T sequences, one query row each, over its own `keys[t]` keys.
Result decode(uint32_t T, uint32_t N, int reps, void* flush, size_t flush_bytes) {
    std::vector<uint32_t> visible(T);
    for (uint32_t t = 0; t < T; ++t) visible[t] = N - (t * 1001) % (N / 2) - (t % 3) * 37;
    const uint32_t pages_per_row = N / kPageKeys;
    const size_t pages = size_t(T) * pages_per_row;
    // The peer: its pages, a page table per sequence (pages in a scattered order), context lengths, schedule.
    uint8_t* cache = device<uint8_t>(pages * kPageBytes);
    fill_pages<<<4096, 256>>>(cache, pages, 11);
    std::vector<int32_t> table(pages);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(14));
    int32_t* table_d = upload(table);
    uint32_t* lens_d = upload(visible);
    uint32_t* meta = device<uint32_t>(2 * (kSms + 1));
    __nv_fp8_e4m3* q = device<__nv_fp8_e4m3>(size_t(T) * kHeads * kDim);
    fill_fp8<<<256, 256>>>(q, size_t(T) * kHeads * kDim, 12);
    float* w = device<float>(size_t(T) * kHeads);
    fill_uniform<<<64, 256>>>(w, size_t(T) * kHeads, 13, 1.0f / 64.0f);
    float* logits = device<float>(size_t(T) * N);
    CHECK_CUDA(cudaMemset(logits, 0, sizeof(float) * size_t(T) * N));

    const CUtensorMap tq = tensor_map(q, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, kDim, uint64_t(T) * kHeads, kDim, kHeads,
                                      CU_TENSOR_MAP_SWIZZLE_128B);
    const cuuint64_t kv_dims[3] = {kDim, kPageKeys, pages}, kv_strides[2] = {kDim, kPageBytes};
    const cuuint32_t kv_box[3] = {kDim, kPageKeys, 1};
    const CUtensorMap tkv =
        tensor_map(cache, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, kv_dims, kv_strides, kv_box, CU_TENSOR_MAP_SWIZZLE_128B);
    const cuuint64_t s_dims[2] = {kPageKeys, pages}, s_strides[1] = {kPageBytes};
    const cuuint32_t s_box[2] = {kPageKeys, 1};
    const CUtensorMap tks = tensor_map(cache + kPageKeys * kDim, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, s_dims, s_strides,
                                       s_box, CU_TENSOR_MAP_SWIZZLE_NONE);
    const CUtensorMap tw =
        tensor_map(w, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, kHeads, T, kHeads, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
    const uint32_t smem = decode_smem();
    CHECK_CUDA(cudaFuncSetAttribute(decode_kernel(), cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    // The schedule kernel, instantiated per batch rounded up (its shared memory holds that many counts).
    const uint32_t aligned_batch = T <= 32 ? 32 : 128;
    void* sched = T <= 32 ? schedule_kernel<32>() : T <= 128 ? schedule_kernel<128>() : nullptr;
    if (!sched) {
        std::fprintf(stderr, "no schedule kernel instantiated for %u rows\n", T);
        std::exit(1);
    }
    uint32_t batch = T, next_n = 1, logits_stride = N, table_stride = pages_per_row;
    bool lens_2d = true;
    uint32_t* no_indices = nullptr;
    void* sargs[] = {&batch, &next_n, &lens_2d, &lens_d, &no_indices, &meta};
    void* args[] = {&batch, &logits_stride, &table_stride, &lens_d, &logits, &table_d, &no_indices, &meta,
                    const_cast<CUtensorMap*>(&tq), const_cast<CUtensorMap*>(&tkv), const_cast<CUtensorMap*>(&tks),
                    const_cast<CUtensorMap*>(&tw)};
    // The schedule depends on the context lengths: a step runs both kernels.
    auto peer = [&] {
        cudaLaunchConfig_t c{};
        c.gridDim = dim3(1);
        c.blockDim = dim3(32);
        c.dynamicSmemBytes = aligned_batch * 4;
        CHECK_CUDA(cudaLaunchKernelExC(&c, sched, sargs));
        launch(decode_kernel(), kTmaThreads + kMathThreads, smem, args);
    };
    peer();
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<int32_t> rows;
    std::vector<uint32_t> n;
    for (uint32_t t : {0u, T / 2, T - 1}) {
        if (!rows.empty() && rows.back() == int32_t(t)) continue;
        rows.push_back(int32_t(t));
        n.push_back(visible[t]);
    }
    Result r{"decode", T, 0, 0, 0, 0, 0, double(kDim + 4), 0};
    r.peer_err = sampled_error(logits, N, q, w, cache, nullptr, table_d, pages_per_row, rows, n, N);
    r.peer_ms = median_ms(peer, reps, flush, flush_bytes);
    for (uint32_t v : visible) r.scores += v;
    r.keys_read = r.scores;
    CHECK_CUDA(cudaFree(cache));

    // Ours: each sequence's keys as state entries, a table of their addresses, fp4 queries in fp32.
    const peregrine::EntryFormat kf = peregrine::fp4_entry_format(kDim, 32, false);
    r.ours_key_bytes = kf.bytes + sizeof(void*);
    uint8_t* entries = device<uint8_t>(size_t(T) * N * kf.bytes);
    fill_entries<<<4096, 256>>>(entries, size_t(T) * N, kf, 21);
    const uint8_t** keys = device<const uint8_t*>(size_t(T) * N);
    entry_table<<<4096, 256>>>(entries, size_t(T) * N, kf.bytes, keys);
    float* iq = device<float>(size_t(T) * kHeads * kDim);
    fill_fp4_values<<<256, 256>>>(iq, size_t(T) * kHeads * kDim, 22);
    std::vector<int64_t> width(T, N), vis(visible.begin(), visible.end()), base(T);
    for (uint32_t t = 0; t < T; ++t) base[t] = int64_t(t) * N;
    int64_t *width_d = upload(width), *vis_d = upload(vis), *base_d = upload(base);
    auto ours = [&] {
        pc::index_scores_stream(iq, w, nullptr, int(T), kHeads, kDim, width_d, vis_d, base_d, keys, kf, N, logits);
    };
    r.ours_ms = median_ms(ours, reps, flush, flush_bytes);
    for (void* p : {static_cast<void*>(table_d), static_cast<void*>(lens_d), static_cast<void*>(meta),
                    static_cast<void*>(q), static_cast<void*>(w), static_cast<void*>(logits),
                    static_cast<void*>(entries), static_cast<void*>(keys), static_cast<void*>(iq),
                    static_cast<void*>(width_d), static_cast<void*>(vis_d), static_cast<void*>(base_d)})
        CHECK_CUDA(cudaFree(p));
    return r;
}

// Prefill: T new rows at the end of one sequence of N keys; row t sees the first N - T + t + 1.
Result prefill(uint32_t T, uint32_t N, int reps, void* flush, size_t flush_bytes) {
    std::vector<uint32_t> start(T, 0), end(T);
    for (uint32_t t = 0; t < T; ++t) end[t] = N - T + t + 1;
    __nv_fp8_e4m3* q = device<__nv_fp8_e4m3>(size_t(T) * kHeads * kDim);
    fill_fp8<<<1024, 256>>>(q, size_t(T) * kHeads * kDim, 31);
    uint8_t* kv = device<uint8_t>(size_t(N) * kDim);
    fill_fp8<<<1024, 256>>>(reinterpret_cast<__nv_fp8_e4m3*>(kv), size_t(N) * kDim, 32);
    float* ks = device<float>(N);
    fill_scales<<<256, 256>>>(ks, N, 33);
    float* w = device<float>(size_t(T) * kHeads);
    fill_uniform<<<256, 256>>>(w, size_t(T) * kHeads, 34, 1.0f / 64.0f);
    const uint32_t stride = align_up(N, kBlockKv);
    float* logits = device<float>(size_t(align_up(T, kBlockQ)) * stride);
    uint32_t *start_d = upload(start), *end_d = upload(end);

    const CUtensorMap tq = tensor_map(q, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, kDim, uint64_t(T) * kHeads, kDim,
                                      kBlockQ * kHeads, CU_TENSOR_MAP_SWIZZLE_128B);
    const CUtensorMap tkv =
        tensor_map(kv, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, kDim, N, kDim, kBlockKv, CU_TENSOR_MAP_SWIZZLE_128B);
    const CUtensorMap tks =
        tensor_map(ks, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, align_up(N, 4), 1, kBlockKv, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
    const CUtensorMap tw =
        tensor_map(w, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, kHeads, T, kHeads, kBlockQ, CU_TENSOR_MAP_SWIZZLE_NONE);
    const uint32_t smem = prefill_smem();
    CHECK_CUDA(cudaFuncSetAttribute(prefill_kernel(), cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    uint32_t seq_len = T, seq_len_kv = N, stride_logits = stride;
    void* args[] = {&seq_len, &seq_len_kv, &stride_logits, &start_d, &end_d, &logits,
                    const_cast<CUtensorMap*>(&tq), const_cast<CUtensorMap*>(&tkv), const_cast<CUtensorMap*>(&tks),
                    const_cast<CUtensorMap*>(&tw)};
    auto peer = [&] { launch(prefill_kernel(), kTmaThreads + kMathThreads, smem, args); };
    peer();
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<int32_t> rows;
    std::vector<uint32_t> n;
    for (uint32_t t : {0u, 1u, T / 2, T - 2, T - 1}) rows.push_back(int32_t(t)), n.push_back(end[t]);
    Result r{"prefill", T, 0, N, 0, 0, 0, double(kDim + 4), 0};
    r.peer_err = sampled_error(logits, stride, q, w, kv, ks, nullptr, 0, rows, n, N);
    r.peer_ms = median_ms(peer, reps, flush, flush_bytes);
    for (uint32_t e : end) r.scores += e;
    CHECK_CUDA(cudaFree(kv));

    // Ours: the sequence's key entries through a table, gathered into bf16, queries rounded to bf16, then the
    // wgmma scorer over 64-row tiles.
    const peregrine::EntryFormat kf = peregrine::fp4_entry_format(kDim, 32, false);
    r.ours_key_bytes = kf.bytes + sizeof(void*);
    uint8_t* entries = device<uint8_t>(size_t(N) * kf.bytes);
    fill_entries<<<1024, 256>>>(entries, N, kf, 41);
    const uint8_t** keys = device<const uint8_t*>(N);
    entry_table<<<256, 256>>>(entries, N, kf.bytes, keys);
    float* iq = device<float>(size_t(T) * kHeads * kDim);
    fill_fp4_values<<<1024, 256>>>(iq, size_t(T) * kHeads * kDim, 42);
    uint16_t* qb = device<uint16_t>(size_t(T) * kHeads * kDim);
    uint16_t* kb = device<uint16_t>(size_t(N) * kDim);
    std::vector<int64_t> tiles, vis(end.begin(), end.end());
    for (uint32_t t = 0; t < T; t += 64) tiles.insert(tiles.end(), {t, std::min<int64_t>(64, T - t), 0, N});
    int64_t *tiles_d = upload(tiles), *vis_d = upload(vis);
    auto ours = [&] {
        pc::to_bf16(iq, int64_t(T) * kHeads * kDim, qb);
        pc::gather_keys_bf16(keys, N, kf, kb);
        pc::index_scores_mma(qb, w, kHeads, tiles_d, int(tiles.size() / 4), kb, vis_d, N, logits);
    };
    r.ours_ms = median_ms(ours, reps, flush, flush_bytes);
    for (void* p : {static_cast<void*>(q), static_cast<void*>(ks), static_cast<void*>(w), static_cast<void*>(logits),
                    static_cast<void*>(start_d), static_cast<void*>(end_d), static_cast<void*>(entries),
                    static_cast<void*>(keys), static_cast<void*>(iq), static_cast<void*>(qb), static_cast<void*>(kb),
                    static_cast<void*>(tiles_d), static_cast<void*>(vis_d)})
        CHECK_CUDA(cudaFree(p));
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 10;
    std::string json, decode_rows = "1,8,64,128";
    uint32_t keys = 131072, prefill_rows = 4096, prefill_keys = 65536;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--json")) json = argv[i + 1];
        else if (!std::strcmp(argv[i], "--decode")) decode_rows = argv[i + 1];
        else if (!std::strcmp(argv[i], "--keys")) keys = static_cast<uint32_t>(std::atoi(argv[i + 1]));
        else if (!std::strcmp(argv[i], "--prefill") &&
                 std::sscanf(argv[i + 1], "%ux%u", &prefill_rows, &prefill_keys) != 2) {
            std::fprintf(stderr, "--prefill ROWSxKEYS\n");
            return 2;
        }
    }
    cudaDeviceProp prop{};
    check_device(prop);
    const size_t flush_bytes = size_t(512) << 20;
    void* flush = nullptr;
    CHECK_CUDA(cudaMalloc(&flush, flush_bytes));
    std::printf("%s, indexer 32 heads x 128, median of %d (L2 flushed before each)\n", prop.name, reps);

    std::vector<Result> results;
    for (const char* p = decode_rows.c_str(); *p;) {
        char* end = nullptr;
        const auto T = static_cast<uint32_t>(std::strtoul(p, &end, 10));
        if (T > 0) results.push_back(decode(T, keys, reps, flush, flush_bytes));
        p = *end ? end + 1 : end;
    }
    if (prefill_rows > 0) results.push_back(prefill(prefill_rows, prefill_keys, reps, flush, flush_bytes));

    std::printf("\n%-8s %5s %11s %9s %9s %8s %9s %9s %8s %10s %10s\n", "step", "rows", "scores", "peer ms",
                "GB/s keys", "TFLOP/s", "ours ms", "GB/s keys", "TFLOP/s", "peer/ours", "peer err");
    std::string rows;
    bool failed = false;
    for (const Result& r : results) {
        const double peer_gbs = double(r.keys_read) * r.peer_key_bytes / (r.peer_ms * 1e6);
        const double ours_gbs = double(r.keys_read) * r.ours_key_bytes / (r.ours_ms * 1e6);
        const double flop = 2.0 * double(r.scores) * kHeads * kDim;
        const bool wrong = !(r.peer_err <= 1e-3);
        failed |= wrong;
        std::printf("%-8s %5u %11llu %9.3f %9.0f %8.1f %9.3f %9.0f %8.1f %9.2fx %10.2e%s\n", r.what.c_str(), r.rows,
                    static_cast<unsigned long long>(r.scores), r.peer_ms, peer_gbs, flop / (r.peer_ms * 1e9),
                    r.ours_ms, ours_gbs, flop / (r.ours_ms * 1e9), r.peer_ms / r.ours_ms, r.peer_err,
                    wrong ? "  WRONG" : "");
        char line[512];
        std::snprintf(line, sizeof(line),
                      "%s{\"step\": \"%s\", \"rows\": %u, \"scores\": %llu, \"peer_ms\": %.4f, \"ours_ms\": %.4f, "
                      "\"peer_key_gbs\": %.1f, \"ours_key_gbs\": %.1f, \"peer_max_err_of_max\": %.3e}",
                      rows.empty() ? "" : ",\n  ", r.what.c_str(), r.rows, static_cast<unsigned long long>(r.scores),
                      r.peer_ms, r.ours_ms, peer_gbs, ours_gbs, r.peer_err);
        rows += line;
    }
    const char* peer = "deepinfer-gemm 2.8.2 sm90_fp8_(paged_)mqa_logits";
    if (!json.empty() && !write_json(json, prop.name, peer, rows)) return 1;
    return failed ? 1 : 0;
}
