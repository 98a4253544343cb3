#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/launch_stream.h"
#include "ops/cuda/linear_cublas.h"
#include "ops/attention_plan.h"
#include "util/error.h"
#include "util/switches.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

namespace peregrine {

std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& cfg, const ModelFormat& format,
                                           const StateLayout& layout, const std::string& engram_placement, int gpu,
                                           bool exact) {
    cuda::EngramPlacement p;
    if (engram_placement == "device") p = cuda::EngramPlacement::Device;
    else if (engram_placement == "host") p = cuda::EngramPlacement::Host;
    else fail("unknown engram placement '{}' (device or host)", engram_placement);
    std::string why;
    if (!cuda_device_available(&why)) fail("--device cuda: {}", why);
    int n = 0;
    PG_CUDA(cudaGetDeviceCount(&n));
    if (gpu < 0 || gpu >= n) fail("--device cuda: GPU {} asked for, {} visible", gpu, n);
    return std::make_unique<cuda::CudaBackend>(cfg, format, layout, p, gpu, exact);
}

bool cuda_device_available(std::string* why) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (why) *why = e != cudaSuccess ? std::string("no usable CUDA device: ") + cudaGetErrorString(e)
                                         : std::string("no CUDA device found");
        cudaGetLastError();
        return false;
    }
    return true;
}

namespace cuda {

void cuda_fail(cudaError_t e, const char* what, const char* file, int line) {
    fail("CUDA error '{}' in {} at {}:{}", cudaGetErrorString(e), what, file, line);
}

namespace {
Numerics numerics_from_switch(bool exact) {
    const std::string n = switch_value("PEREGRINE_CUDA_NUMERICS");
    return n == "exact" || exact ? Numerics::Exact : n == "reference" ? Numerics::Reference : Numerics::Fast;
}
}  // namespace

CudaBackend::CudaBackend(const ModelConfig& cfg, const ModelFormat& format, const StateLayout& layout,
                         EngramPlacement engram, int gpu, bool exact)
    : Backend(format), gpu_(gpu), numerics_(numerics_from_switch(exact)), cfg_(cfg), layout_(layout), memory_(gpu),
      sampler_(*this, cfg.vocab_size), weights_(cfg, format, engram), linear_(weights_, numerics_) {
    PG_CUDA(cudaSetDevice(gpu_));
    graphs_ = switch_is("PEREGRINE_CUDA_GRAPHS", "1");
    hc_small_ = switch_is("PEREGRINE_HC_SMALL", "1");
    side_mixes_on_ = switch_is("PEREGRINE_HC_SIDE_STREAM", "1");
    side_shared_on_ = switch_is("PEREGRINE_SHARED_EXPERT_SIDE_STREAM", "1");
    launch_folds_ = switch_is("PEREGRINE_LAUNCH_FOLDS", "1");
    decode_tables_ = switch_is("PEREGRINE_DECODE_TABLES", "1");
    // Activations come from the stream-ordered pool (cudaMallocAsync). With its default release threshold (0) every
    // synchronisation hands the freed memory back to the driver, and the next step maps it again; after a large
    // cudaFree (a batch's state) that mapping stalled the host for tens of milliseconds inside a prefill step. Keep
    // it (alloc_state trims the pool when a state allocation would not fit otherwise). PEREGRINE_CUDA_POOL_KEEP=0:
    // the driver's default (A/B).
    if (switch_is("PEREGRINE_CUDA_POOL_KEEP", "1")) {
        cudaMemPool_t pool = nullptr;
        PG_CUDA(cudaDeviceGetDefaultMemPool(&pool, gpu_));
        uint64_t keep = UINT64_MAX;
        PG_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    }
    index_score_bytes_ = static_cast<int64_t>(switch_int("PEREGRINE_INDEX_SCORE_MB", 1, int64_t{1} << 20)) << 20;

}

void CudaBackend::bind_thread() { PG_CUDA(cudaSetDevice(gpu_)); }

CudaBackend::~CudaBackend() {
    cudaSetDevice(gpu_);
    cudaDeviceSynchronize();
    graph_runner_.drop_all();
    linear_cublas_release();
}

Tensor CudaBackend::linear(const Tensor& x, const LinearWeight& w) {
    OpTimer op_(*this, "linear");
    return linear_.run(x, w);
}

std::unique_ptr<StepScratch> CudaBackend::begin_step(const ForwardBatch&) { return std::make_unique<CudaScratch>(); }

// The selection and candidate mask of rows `rows`; the page tables are made again by the narrower step's first
// attention layer.
std::unique_ptr<StepScratch> CudaBackend::narrow_step(StepScratch& scratch, const std::vector<int>& rows) {
    auto& from = static_cast<CudaScratch&>(scratch);
    auto s = std::make_unique<CudaScratch>();
    const auto n = static_cast<int64_t>(rows.size());
    auto r = upload(std::vector<int32_t>(rows.begin(), rows.end()));
    auto take = [&](const void* src, size_t row_bytes) {
        std::shared_ptr<void> dst = device_alloc(std::max<size_t>(row_bytes * static_cast<size_t>(n), 4));
        cuda::gather_bytes(src, r.ptr, n, static_cast<int64_t>(row_bytes), dst.get());
        return dst;
    };
    if (from.topk) {
        s->topk = take(from.topk.get(), sizeof(int32_t) * static_cast<size_t>(from.topk_k));
        s->topk_count = take(from.topk_count.get(), sizeof(int32_t));
        s->topk_k = from.topk_k;
    }
    if (from.mask) {
        s->mask = take(from.mask.get(), static_cast<size_t>(from.mask_stride));
        s->mask_width = std::static_pointer_cast<const int64_t>(take(from.mask_width.get(), sizeof(int64_t)));
        s->mask_stride = from.mask_stride;
        s->mask_ratio = from.mask_ratio;
    }
    return s;
}

// State memory is made and freed from whichever thread owns the pool: on this backend's GPU.
uint8_t* CudaStateMemory::alloc(size_t bytes) {
    PG_CUDA(cudaSetDevice(gpu_));
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 64));
    if (e == cudaErrorMemoryAllocation) {  // the activation pool may hold freed memory: give it back and retry
        cudaGetLastError();
        PG_CUDA(cudaDeviceSynchronize());
        cudaMemPool_t pool = nullptr;
        PG_CUDA(cudaDeviceGetDefaultMemPool(&pool, gpu_));
        PG_CUDA(cudaMemPoolTrimTo(pool, 0));
        e = cudaMalloc(&p, std::max<size_t>(bytes, 64));
    }
    PG_CUDA(e);
    PG_CUDA(cudaMemset(p, 0, bytes));
    return static_cast<uint8_t*>(p);
}

void CudaStateMemory::free(uint8_t* p) {
    cudaSetDevice(gpu_);
    cudaDeviceSynchronize();
    cudaFree(p);
}

void CudaStateMemory::to_host(const uint8_t* src, size_t bytes, void* dst) {
    PG_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

void CudaStateMemory::from_host(uint8_t* dst, const void* src, size_t bytes) { copy_to_device(dst, src, bytes); }

void CudaStateMemory::copy(uint8_t* dst, const uint8_t* src, size_t bytes) {
    PG_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
}

uint8_t* CudaStateMemory::alloc_host(size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, std::max<size_t>(bytes, 64), cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fail("cannot pin {} bytes of host memory for the hierarchical cache: {}", bytes, cudaGetErrorString(e));
    }
    return static_cast<uint8_t*>(p);
}

void CudaStateMemory::free_host(uint8_t* p) {
    cudaDeviceSynchronize();
    cudaFreeHost(p);
}

// Pinned memory: both directions are asynchronous on the calling thread's stream, so they overlap the host's
// work and stay ordered with the steps that write and read the pages.
void CudaStateMemory::page_to_host(const uint8_t* src, size_t bytes, uint8_t* host) {
    PG_CUDA(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, cudaStreamPerThread));
}

void CudaStateMemory::page_from_host(uint8_t* dst, const uint8_t* host, size_t bytes) {
    PG_CUDA(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, cudaStreamPerThread));
}

std::function<void()> CudaStateMemory::fence() {
    cudaEvent_t e = nullptr;
    PG_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    PG_CUDA(cudaEventRecord(e, cudaStreamPerThread));
    auto done = std::shared_ptr<CUevent_st>(e, [](cudaEvent_t ev) { cudaEventDestroy(ev); });
    return [done] { cudaEventSynchronize(done.get()); };
}

float* CudaBackend::device_carry(SeqState& s) {
    PEREGRINE_CHECK(s.carry, "sequence state has no carry slot (PagePool::init or restore sets one up)");
    return reinterpret_cast<float*>(s.carry.get());
}

Tensor CudaBackend::first_stream_mix(int T) {
    OpTimer op_(*this, "first_stream_mix");
    Tensor pre = empty(DType::F32, {T, cfg_.hc_mult});
    cuda::first_stream_mix(T, cfg_.hc_mult, pre.f32());
    return pre;
}

Tensor CudaBackend::gather_rows(const Tensor& x, const std::vector<int>& rows) {
    OpTimer op_(*this, "gather_rows");
    join_mixes(&x);
    std::vector<int64_t> shape = x.shape();
    const int64_t len = x.numel() / shape[0];
    shape[0] = static_cast<int64_t>(rows.size());
    Tensor y = empty(DType::F32, shape);
    auto r = upload(std::vector<int32_t>(rows.begin(), rows.end()));
    cuda::gather_rows(x.f32(), r.ptr, static_cast<int64_t>(rows.size()), len, y.f32());
    return y;
}

Tensor CudaBackend::embed(const Tensor& table, const std::vector<int32_t>& ids) {
    OpTimer op_(*this, "embed");
    const int64_t T = static_cast<int64_t>(ids.size());
    for (int32_t id : ids)  // negative: deferred (upload_ids reads them on the device)
        if (id >= table.dim(0)) fail("token id {} is outside the vocabulary (0..{})", id, table.dim(0) - 1);
    PEREGRINE_CHECK(table.dtype() == DType::BF16 || table.dtype() == DType::F32, "embedding must be bf16 or f32");
    Tensor h = empty(DType::F32, {T, cfg_.hc_mult, cfg_.dim});
    auto d = upload_ids(ids);
    cuda::embed(weights_.raw(table), table.dtype() == DType::BF16, d.ptr, T, cfg_.hc_mult, cfg_.dim, h.f32());
    return h;
}

void CudaBackend::run_hc_mixes(const Tensor& h, const Tensor& fn, int n_mix, const Tensor& base, const Tensor& scale,
                               int iters, int mode, float* pre, float* post, float* comb) {
    const int64_t T = h.dim(0);
    const int hc = cfg_.hc_mult;
    if (numerics_ != Numerics::Fast) {
        cuda::hc_mixes(h.f32(), T, hc, cfg_.dim, weights_.f32(fn), n_mix, weights_.f32(base), weights_.f32(scale), eps(),
                       static_cast<float>(cfg_.hc_eps), iters, mode, pre, post, comb);
    } else if (hc_small_ && T < 8 && hc_mixes_small_supported(T, n_mix)) {
        // A few rows: two launches, fn read as fp32 (18.5 us at one row against the tensor-core kernel's 20.5; from
        // 8 rows on that kernel is faster: 22.8 against 37.8 us at 32 rows, 24.0 against 53.6 at 64).
        auto ws = device_alloc(hc_mixes_small_workspace(T, hc, cfg_.dim, n_mix));
        hc_mixes_small(h.f32(), T, hc, cfg_.dim, weights_.f32(fn), n_mix, weights_.f32(base), weights_.f32(scale), eps(),
                       static_cast<float>(cfg_.hc_eps), iters, mode, pre, post, comb, ws.get());
    } else {
        hc_mixes_fast(h.f32(), T, hc, cfg_.dim, weights_.f32(fn), n_mix, weights_.f32(base), weights_.f32(scale), eps(),
                      static_cast<float>(cfg_.hc_eps), iters, mode, pre, post, comb);
    }
}

// The hc mixes of a sublayer are needed only after it: V4.1 collapses a sublayer's input with the previous mix's
// pre, and hc_expand takes post and comb once the attention or MoE block has run. So they run on a side stream of
// this thread, forked after their inputs and joined where an op first reads one of their outputs (join_mixes);
// their small, latency-bound launches then overlap the block's instead of adding to the chain. Decode sizes only,
// up to kSideMixRows rows (H200, 4 layers at 8K: batch 1 2.15 -> 2.05 ms, 32 8.36 -> 8.26, 64 14.18 -> 13.73,
// 128 16.31 -> 16.00, 256 19.1 -> 19.0); a 4K prefill step took 86.4 ms against 84.8 with them on the side, where
// they are large kernels of their own. One mix is in flight at a time; its tensors and input are kept until the
// join, so that no memory is freed under it.
constexpr int64_t kSideMixRows = 256;
struct CudaBackend::SideMixes {
    SideStream side{true};        // ahead of the block's launches
    std::vector<Tensor> pending;  // the mix in flight: its outputs, then its input
};

CudaBackend::SideMixes& CudaBackend::side_mixes() {
    thread_local std::map<int, SideMixes> per_device;
    return per_device.try_emplace(gpu_).first->second;
}

void CudaBackend::join_mixes(const Tensor* t) {
    if (!side_mixes_on_) return;
    SideMixes& s = side_mixes();
    if (s.pending.empty()) return;
    if (t) {
        bool reads = false;
        for (size_t i = 0; i + 1 < s.pending.size(); ++i) reads |= s.pending[i].raw() == t->raw();
        if (!reads) return;
    }
    s.side.join();
    s.pending.clear();
}

bool CudaBackend::set_side_mixes(bool on) {
    join_mixes(nullptr);
    const bool was = side_mixes_on_;
    side_mixes_on_ = on;
    return was;
}

HcMix CudaBackend::hc_mixes(const Tensor& h, const HcWeight& w) {
    OpTimer op_(*this, "hc_mixes");
    const int64_t T = h.dim(0);
    const int hc = cfg_.hc_mult;
    HcMix m{empty(DType::F32, {T, hc}), empty(DType::F32, {T, hc}), empty(DType::F32, {T, hc, hc})};
    const int n_mix = static_cast<int>(w.fn.dim(0));
    if (!side_mixes_on_ || numerics_ != Numerics::Fast || T > kSideMixRows) {
        run_hc_mixes(h, w.fn, n_mix, w.base, w.scale, cfg_.hc_sinkhorn_iters, 0, m.pre.f32(), m.post.f32(),
                     m.comb.f32());
        return m;
    }
    join_mixes(nullptr);
    weights_.f32(w.fn), weights_.f32(w.base), weights_.f32(w.scale);  // first-use uploads go to this thread's stream, before the fork
    SideMixes& s = side_mixes();
    s.side.run([&] {
        run_hc_mixes(h, w.fn, n_mix, w.base, w.scale, cfg_.hc_sinkhorn_iters, 0, m.pre.f32(), m.post.f32(),
                     m.comb.f32());
    });
    s.pending = {m.pre, m.post, m.comb, h};
    return m;
}

Tensor CudaBackend::hc_collapse(const Tensor& h, const Tensor& pre) {
    OpTimer op_(*this, "hc_collapse");
    join_mixes(&pre);
    const int64_t T = h.dim(0);
    Tensor y = empty(DType::F32, {T, cfg_.dim});
    cuda::hc_collapse(h.f32(), pre.f32(), T, cfg_.hc_mult, cfg_.dim, y.f32());
    return y;
}

Tensor CudaBackend::hc_expand(const Tensor& y, const Tensor& residual, const HcMix& mix) {
    OpTimer op_(*this, "hc_expand");
    join_mixes(&mix.post);
    const int64_t T = y.dim(0);
    Tensor out = empty(DType::F32, {T, cfg_.hc_mult, cfg_.dim});
    (numerics_ == Numerics::Fast ? cuda::hc_expand_fast : cuda::hc_expand)(
        y.f32(), residual.f32(), mix.post.f32(), mix.comb.f32(), T, cfg_.hc_mult, cfg_.dim, out.f32());
    return out;
}

Tensor CudaBackend::hc_head(const Tensor& h, const HcWeight& w) {
    OpTimer op_(*this, "hc_head");
    const int64_t T = h.dim(0);
    Tensor pre = empty(DType::F32, {T, cfg_.hc_mult});
    run_hc_mixes(h, w.fn, cfg_.hc_mult, w.base, w.scale, 0, 1, pre.f32(), nullptr, nullptr);
    return hc_collapse(h, pre);
}

Tensor CudaBackend::rms_norm(const Tensor& x, const Tensor& w) {
    OpTimer op_(*this, "rms_norm");
    const int64_t D = x.dim(-1), rows = x.numel() / D;
    Tensor y = empty(DType::F32, x.shape());
    cuda::rms_norm(x.f32(), rows, static_cast<int>(D), weights_.f32(w), eps(), y.f32());
    return y;
}

Tensor CudaBackend::collapse_norm(const Tensor& h, const Tensor& pre, const Tensor& w) {
    OpTimer op_(*this, "collapse_norm");
    join_mixes(&pre);
    const int64_t T = h.dim(0);
    Tensor y = empty(DType::F32, {T, cfg_.dim});
    cuda::collapse_norm(h.f32(), pre.f32(), T, cfg_.hc_mult, cfg_.dim, weights_.f32(w), eps(), y.f32());
    return y;
}

Tensor CudaBackend::hc_mean(const Tensor& h) {
    OpTimer op_(*this, "hc_mean");
    const int64_t T = h.dim(0);
    Tensor y = empty(DType::F32, {T, cfg_.dim});
    cuda::hc_mean(h.f32(), T, cfg_.hc_mult, cfg_.dim, y.f32());
    return y;
}

Tensor CudaBackend::logits(const Tensor& x, const LinearWeight& head, bool to_host) {
    OpTimer op_(*this, "logits");
    // fp32 on the (bf16-stored) weights, as the reference upcasts them.
    LinearWeight w = head;
    w.kind = LinearWeight::Kind::F32;
    const int64_t M = x.numel() / w.in;
    Tensor y;
    if (numerics_ == Numerics::Fast && w.w.dtype() == DType::BF16) {
        // One read of the head on the bf16 tensor cores (measured on the H200 at batch 8: 0.40 ms against the
        // GEMV's 1.19; equal at one row). Its input is an rms_norm output (bf16 values), so the products are
        // exact and only the fp32 sum order changes.
        LinearDev d = weights_.linear(w);
        d.bf16_acts = true;
        y = empty(DType::F32, {M, w.out});
        linear_cublas(x.f32(), nullptr, M, d, y.f32(), nullptr, nullptr);
    } else {
        y = linear_.run(x, w);
    }
    return to_host ? to_host_pinned(y, &host_wait_ms_) : y;
}

}  // namespace cuda
}  // namespace peregrine

namespace peregrine::cuda {

namespace {
void* record_event() {
    cudaEvent_t e;
    PG_CUDA(cudaEventCreate(&e));
    PG_CUDA(cudaEventRecord(e, 0));
    return e;
}
}  // namespace

OpTimer::OpTimer(CudaBackend& b, const char* name) : b_(b) {
    record_ = b_.profiling_ && b_.depth_ == 0;
    ++b_.depth_;
    if (record_) {
        index_ = b_.events_.size();
        b_.events_.push_back({name, record_event(), nullptr});
    }
}

OpTimer::~OpTimer() {
    --b_.depth_;
    if (!record_) return;
    if (b_.open_phase_ >= 0) {
        b_.events_[static_cast<size_t>(b_.open_phase_)].stop = record_event();
        b_.open_phase_ = -1;
    }
    b_.events_[index_].stop = record_event();
}

void CudaBackend::phase(const char* name) {
    if (!profiling_ || depth_ != 1) return;
    if (open_phase_ >= 0) events_[static_cast<size_t>(open_phase_)].stop = record_event();
    open_phase_ = static_cast<int>(events_.size());
    events_.push_back({name, record_event(), nullptr});
}

std::map<std::string, double> CudaBackend::profile() {
    PG_CUDA(cudaDeviceSynchronize());
    std::map<std::string, double> ms;
    for (auto& e : events_) {
        float t = 0.0f;
        if (e.stop)
            PG_CUDA(cudaEventElapsedTime(&t, static_cast<cudaEvent_t>(e.start), static_cast<cudaEvent_t>(e.stop)));
        ms[e.name] += t;
        cudaEventDestroy(static_cast<cudaEvent_t>(e.start));
        if (e.stop) cudaEventDestroy(static_cast<cudaEvent_t>(e.stop));
    }
    events_.clear();
    return ms;
}

void CudaBackend::fill_state_random(const PagePool& pool, uint64_t seed) {
    const StateLayout& layout = pool.layout();
    for (int t = 0; t < kPageTables; ++t) {
        const int64_t page_bytes = static_cast<int64_t>(layout.page_bytes[static_cast<size_t>(t)]);
        uint8_t* p = pool.base(static_cast<PageTable>(t));
        if (!p) continue;
        const int64_t pages = pool.capacity(static_cast<PageTable>(t));
        fill_random_bf16(reinterpret_cast<float*>(p), pages * page_bytes / 4, seed + static_cast<uint64_t>(t));
        // The entries are packed: random bytes become valid codes and scales.
        for (const auto& L : layout.layers)
            for (const StateSection* sec : {&L.window, &L.comp, &L.index_k})
                if (sec->present() && sec->table == t)
                    sanitize_entries(p, pages, page_bytes, static_cast<int64_t>(sec->offset),
                                     sec->entries_per_page, sec->format);
    }
    PG_CUDA(cudaDeviceSynchronize());
}

double CudaBackend::copy_bandwidth_gbs(size_t bytes, int reps) const {
    PG_CUDA(cudaSetDevice(gpu_));
    void *a = nullptr, *b = nullptr;
    PG_CUDA(cudaMalloc(&a, bytes));
    PG_CUDA(cudaMalloc(&b, bytes));
    fill_random_bf16(static_cast<float*>(a), static_cast<int64_t>(bytes / 4), 7);
    PG_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    cudaEvent_t e0, e1;
    PG_CUDA(cudaEventCreate(&e0));
    PG_CUDA(cudaEventCreate(&e1));
    PG_CUDA(cudaEventRecord(e0, 0));
    for (int i = 0; i < reps; ++i)
        PG_CUDA(cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, 0));
    PG_CUDA(cudaEventRecord(e1, 0));
    PG_CUDA(cudaEventSynchronize(e1));
    float ms = 0.0f;
    PG_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * static_cast<double>(bytes) * reps / (ms * 1e-3) / 1e9;
}

std::vector<int> CudaBackend::graph_batch_sizes() const {
    std::vector<int> sizes;
    for (int t = 1; graphs_ && t <= 32; ++t)
        if (graph_bucket(t)) sizes.push_back(t);
    return sizes;
}

// The graphs' capture arenas, and what their memory nodes reserved (allocations an arena did not hold).
size_t CudaBackend::graph_memory_bytes() const {
    uint64_t bytes = 0;
    if (cudaDeviceGetGraphMemAttribute(gpu_, cudaGraphMemAttrReservedMemHigh, &bytes) != cudaSuccess) {
        cudaGetLastError();
        bytes = 0;
    }
    return static_cast<size_t>(bytes) + graph_runner_.arena_bytes();
}

size_t CudaBackend::free_memory() const {
    PG_CUDA(cudaSetDevice(gpu_));
    size_t free = 0, total = 0;
    PG_CUDA(cudaMemGetInfo(&free, &total));
    cudaMemPool_t pool = nullptr;
    PG_CUDA(cudaDeviceGetDefaultMemPool(&pool, gpu_));
    uint64_t reserved = 0, used = 0;
    PG_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    PG_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    return free + static_cast<size_t>(reserved > used ? reserved - used : 0);
}

Diagnostics::MemoryUse CudaBackend::memory_use(bool reset_peak) {
    PG_CUDA(cudaSetDevice(gpu_));
    PG_CUDA(cudaDeviceSynchronize());  // frees in stream order are done
    MemoryUse m;
    size_t free = 0;
    PG_CUDA(cudaMemGetInfo(&free, &m.total));
    cudaMemPool_t pool = nullptr;
    PG_CUDA(cudaDeviceGetDefaultMemPool(&pool, gpu_));
    uint64_t now = 0, peak = 0;
    PG_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &now));
    PG_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &peak));
    m.used_now = static_cast<size_t>(now);
    m.used_peak = static_cast<size_t>(peak);
    m.device_used = m.total - free;
    uint64_t reserved = 0;
    PG_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    m.pool_reserved = static_cast<size_t>(reserved);
    if (reset_peak) {
        uint64_t zero = 0;  // the driver restarts the high-water mark at the current use
        PG_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
    }
    return m;
}

std::string CudaBackend::device_name() const {
    cudaDeviceProp p{};
    PG_CUDA(cudaGetDeviceProperties(&p, gpu_));
    return p.name;
}

}  // namespace peregrine::cuda
