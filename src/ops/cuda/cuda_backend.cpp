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
#include <mutex>

namespace peregrine {

std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& cfg, const ModelFormat& format,
                                           const StateLayout& layout, const std::string& engram_placement, int gpu) {
    cuda::EngramPlacement p;
    if (engram_placement == "device") p = cuda::EngramPlacement::Device;
    else if (engram_placement == "host") p = cuda::EngramPlacement::Host;
    else fail("unknown engram placement '{}' (device or host)", engram_placement);
    std::string why;
    if (!cuda_device_available(&why)) fail("--device cuda: {}", why);
    int n = 0;
    PG_CUDA(cudaGetDeviceCount(&n));
    if (gpu < 0 || gpu >= n) fail("--device cuda: GPU {} asked for, {} visible", gpu, n);
    return std::make_unique<cuda::CudaBackend>(cfg, format, layout, p, gpu);
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

// Stream-ordered on the stream kernels launch on (launch_stream(): the thread's own, or the hc mixes' side stream),
// and freed on the same stream.
std::shared_ptr<void> device_alloc(size_t bytes) {
    void* p = nullptr;
    const cudaStream_t s = launch_stream();
    PG_CUDA(cudaMallocAsync(&p, std::max<size_t>(bytes, 16), s));
    return std::shared_ptr<void>(p, [s](void* q) { cudaFreeAsync(q, s); });
}

namespace {
// Page-locked staging for host-to-device uploads: an upload is copied into the next free bytes of a pinned ring
// and sent with an async copy, so the host never waits for the GPU (a copy from pageable memory may wait for the
// stream). The ring is cut into segments; leaving a segment records an event on the stream, and a segment is
// written again only once its event has completed, which waits only if the GPU is a whole ring behind. One per
// thread: the events are recorded on the thread's own stream, so they cover only its own copies.
class StagingRing {
public:
    static constexpr size_t kSegment = size_t(4) << 20, kSegments = 16, kAlign = 256;
    static StagingRing& get() {
        thread_local StagingRing ring;
        return ring;
    }
    ~StagingRing() {  // the thread ends (before the runtime does, also for the main thread)
        if (!base_) return;
        cudaDeviceSynchronize();  // the thread's copies out of the ring are done
        for (auto& e : done_) cudaEventDestroy(e);
        cudaFreeHost(base_);
    }
    // Queues the copy of bytes from src to dst through the ring; false (nothing queued) when it is larger than
    // a segment (copy_to_device splits larger uploads).
    bool copy(void* dst, const void* src, size_t bytes) {
        if (bytes > kSegment) return false;
        if (!base_) {
            PG_CUDA(cudaMallocHost(&base_, kSegment * kSegments));
            for (auto& e : done_) PG_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        }
        cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        PG_CUDA(cudaStreamIsCapturing(0, &cap));
        if (cap != cudaStreamCaptureStatusNone)  // a captured copy would re-read a reused slot at replay
            fail("upload during CUDA graph capture (per-step data must go into the graph's fixed buffers)");
        const size_t need = (bytes + kAlign - 1) / kAlign * kAlign;
        if (off_ + need > kSegment) {
            PG_CUDA(cudaEventRecord(done_[seg_], 0));
            used_[seg_] = true;
            seg_ = (seg_ + 1) % kSegments;
            off_ = 0;
            if (used_[seg_]) PG_CUDA(cudaEventSynchronize(done_[seg_]));
        }
        char* p = static_cast<char*>(base_) + seg_ * kSegment + off_;
        std::memcpy(p, src, bytes);
        PG_CUDA(cudaMemcpyAsync(dst, p, bytes, cudaMemcpyHostToDevice, 0));
        off_ += need;
        return true;
    }

private:
    void* base_ = nullptr;
    size_t seg_ = 0, off_ = 0;
    cudaEvent_t done_[kSegments] = {};
    bool used_[kSegments] = {};
};
}  // namespace

// Uploads larger than a segment go through the ring a segment at a time, since a copy from pageable memory may
// wait for the stream (the step's page tables pass 4 MB at batch 128 and a 128K context).
void copy_to_device(void* dst, const void* src, size_t bytes) {
    for (size_t o = 0; o < bytes; o += StagingRing::kSegment) {
        const size_t n = std::min(bytes - o, StagingRing::kSegment);
        char* d = static_cast<char*>(dst) + o;
        const char* s = static_cast<const char*>(src) + o;
        if (!StagingRing::get().copy(d, s, n)) PG_CUDA(cudaMemcpyAsync(d, s, n, cudaMemcpyHostToDevice, 0));
    }
}

Tensor CudaBackend::empty(DType dtype, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    auto keep = device_alloc(static_cast<size_t>(n) * dtype_size(dtype));
    void* p = keep.get();
    return Tensor::view(dtype, std::move(shape), p, Device::CUDA, std::move(keep));
}

Tensor CudaBackend::to_device(const Tensor& host) {
    PEREGRINE_CHECK(host.device() == Device::CPU, "to_device: tensor is already on the device");
    Tensor t = empty(host.dtype(), host.shape());
    if (host.nbytes()) PG_CUDA(cudaMemcpy(t.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice));
    return t;
}

namespace {
// Page-locked host buffers for results copied back every step (logits), reused: a copy into pageable memory
// runs at a fraction of PCIe speed, and a fresh cudaMallocHost costs milliseconds. Buffers return to the pool
// when their tensor goes; the pool lives as long as the process (never freed at exit, when the CUDA context
// may already be gone).
class PinnedPool {
public:
    static PinnedPool& get() {
        static auto* pool = new PinnedPool;
        return *pool;
    }
    std::shared_ptr<void> take(size_t bytes) {
        void* p = nullptr;
        {
            std::lock_guard lk(mu_);
            auto it = free_.lower_bound(bytes);
            if (it != free_.end() && it->first <= 2 * bytes) {
                p = it->second;
                bytes = it->first;
                free_.erase(it);
            }
        }
        if (!p) PG_CUDA(cudaMallocHost(&p, bytes));
        return std::shared_ptr<void>(p, [this, bytes](void* q) { give(q, bytes); });
    }

private:
    void give(void* p, size_t bytes) {
        std::lock_guard lk(mu_);
        if (free_.size() >= 8) {  // bounded: drop the smallest
            cudaFreeHost(free_.begin()->second);
            free_.erase(free_.begin());
        }
        free_.emplace(bytes, p);
    }
    std::mutex mu_;
    std::multimap<size_t, void*> free_;
};
}  // namespace

// Small requests (the sampler's ids and logprobs, whose size follows the batch) are rounded up to a power of two
// of at least 4 KB, so that a pooled buffer serves them again and no step pays for a fresh allocation (or for the
// synchronising free of a buffer the bounded pool drops).
std::shared_ptr<void> pinned_host_buffer(size_t bytes) {
    size_t b = std::max<size_t>(bytes, 64);
    if (b <= (size_t(1) << 20)) {
        size_t r = 4096;
        while (r < b) r <<= 1;
        b = r;
    }
    return PinnedPool::get().take(b);
}

Tensor CudaBackend::to_host_pinned(const Tensor& dev, double* wait_ms) {
    PEREGRINE_CHECK(dev.device() == Device::CUDA, "to_host: tensor is not on the device");
    auto keep = pinned_host_buffer(dev.nbytes());
    void* p = keep.get();
    if (dev.nbytes()) {  // the step's one wait: for its results
        PG_CUDA(cudaMemcpyAsync(p, dev.raw(), dev.nbytes(), cudaMemcpyDeviceToHost, 0));
        const auto t0 = std::chrono::steady_clock::now();
        PG_CUDA(cudaStreamSynchronize(0));
        if (wait_ms)
            *wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    return Tensor::view(dev.dtype(), dev.shape(), p, Device::CPU, std::move(keep));
}

Tensor CudaBackend::to_host(const Tensor& dev) {
    PEREGRINE_CHECK(dev.device() == Device::CUDA, "to_host: tensor is not on the device");
    Tensor t = Tensor::zeros(dev.dtype(), dev.shape());
    if (dev.nbytes()) PG_CUDA(cudaMemcpy(t.raw(), dev.raw(), dev.nbytes(), cudaMemcpyDeviceToHost));
    return t;
}

CudaBackend::CudaBackend(const ModelConfig& cfg, const ModelFormat& format, const StateLayout& layout,
                         EngramPlacement engram, int gpu)
    : Backend(format), gpu_(gpu), cfg_(cfg), layout_(layout), memory_(gpu), sampler_(*this, cfg.vocab_size),
      engram_placement_(engram) {
    PG_CUDA(cudaSetDevice(gpu_));
    graphs_ = switch_is("PEREGRINE_CUDA_GRAPHS", "1");
    hc_small_ = switch_is("PEREGRINE_HC_SMALL", "1");
    side_mixes_on_ = switch_is("PEREGRINE_HC_SIDE_STREAM", "1");
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
    const std::string numerics = switch_value("PEREGRINE_CUDA_NUMERICS");
    numerics_ = numerics == "exact" ? Numerics::Exact : numerics == "reference" ? Numerics::Reference : Numerics::Fast;
}

void CudaBackend::bind_thread() { PG_CUDA(cudaSetDevice(gpu_)); }

CudaBackend::~CudaBackend() {
    cudaSetDevice(gpu_);
    cudaDeviceSynchronize();
    moe_graphs_.clear();
    linear_cublas_release();
    for (void* p : pinned_) cudaFreeHost(p);
}

const void* CudaBackend::dev_raw(const Tensor& t) {
    if (t.device() == Device::CUDA) return t.raw();
    auto it = raw_.find(t.raw());
    if (it != raw_.end()) return it->second.get();
    auto keep = device_alloc(t.nbytes());
    PG_CUDA(cudaMemcpy(keep.get(), t.raw(), t.nbytes(), cudaMemcpyHostToDevice));
    return raw_.emplace(t.raw(), keep).first->second.get();
}

const float* CudaBackend::dev_f32(const Tensor& t) {
    auto it = f32_.find(t.raw());
    if (it != f32_.end()) return static_cast<const float*>(it->second.get());
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
        switch (t.dtype()) {
            case DType::F32: v[i] = t.data<float>()[i]; break;
            case DType::BF16: v[i] = bf16_to_f32(t.data<uint16_t>()[i]); break;
            default: fail("unsupported parameter dtype {}", dtype_name(t.dtype()));
        }
    }
    auto a = upload(v);
    return static_cast<const float*>(f32_.emplace(t.raw(), a.keep).first->second.get());
}

LinearDev CudaBackend::dev_linear(const LinearWeight& w) {
    LinearDev d;
    d.kind = static_cast<int>(w.kind);
    d.out = w.out;
    d.in = w.in;
    d.weight_block = w.weight_block;
    d.act_block = w.act_block;
    d.w_bf16 = w.w.dtype() == DType::BF16;
    d.w = dev_raw(w.w);
    d.scale = w.scale.empty() ? nullptr : static_cast<const uint8_t*>(dev_raw(w.scale));
    return d;
}

const float* CudaBackend::rope_freqs(const AttentionLayerInfo& info) {
    auto key = std::make_pair(info.rope_theta, info.yarn);
    auto it = ropes_.find(key);
    if (it == ropes_.end()) {
        auto f = rope_frequencies(cfg_.rope_head_dim, info.rope_theta, info.yarn ? cfg_.original_seq_len : 0,
                                  cfg_.rope_factor, cfg_.beta_fast, cfg_.beta_slow, format_.yarn_ramp);
        it = ropes_.emplace(key, upload(f).keep).first;
    }
    return static_cast<const float*>(it->second.get());
}

bool CudaBackend::use_gemv(const float* x, int64_t M, const LinearDev& d, const Routed* routed) const {
    // Decode-sized calls: dense M <= 32, or routed tiles of <= 8 rows.
    return numerics_ == Numerics::Fast && linear_gemv_supported(d) && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           (routed ? routed->routing.tile_rows == 8 : M <= 32);
}

void CudaBackend::gemm(const float* x, const float* xs, int64_t M, const LinearDev& d, float* y,
                       const ExpertTable* experts, const Routed* routed) {
    // Fast numerics, decode-sized calls: the memory-bound GEMV (xs null: it quantises the activations itself).
    if (use_gemv(x, M, d, routed)) {
        linear_gemv(x, xs, M, d, y, experts, routed ? &routed->routing : nullptr);
        return;
    }
    // Everything else on the tensor cores (cuBLAS): prefill-sized dense calls, routed calls with many rows
    // per expert (32-row tiles; see routing_tile_rows), and what the GEMV does not take.
    if (numerics_ == Numerics::Fast && linear_cublas_supported(d)) {
        linear_cublas(x, xs, M, d, y, experts, routed ? &routed->routing : nullptr);
        return;
    }
    if (numerics_ != Numerics::Reference && linear_tiled_supported(d))
        linear_tiled(x, xs, M, d, y, experts, routed ? &routed->routing : nullptr);
    else
        cuda::linear(x, xs, M, d, y, experts, routed ? routed->row_expert : nullptr);
}

namespace {
// bf16 activations with bf16-stored weights: exact products on the bf16 tensor cores (for F32 linears the sums stay
// fp32 and unrounded; only their order changes, as for the LM head).
bool takes_bf16_acts(const LinearWeight& w, bool bf16_acts) {
    return bf16_acts && (w.kind == LinearWeight::Kind::BF16 ||
                         (w.kind == LinearWeight::Kind::F32 && w.w.dtype() == DType::BF16));
}
}  // namespace

Tensor CudaBackend::run_linear(const Tensor& x, const LinearWeight& w, const ExpertTable* experts,
                               const Routed* routed, bool bf16_acts) {
    const int64_t M = x.numel() / w.in;
    Tensor y = empty(DType::F32, {M, w.out});
    LinearDev d = dev_linear(w);
    d.bf16_acts = takes_bf16_acts(w, bf16_acts);
    const bool quantised = w.kind == LinearWeight::Kind::FP8 || w.kind == LinearWeight::Kind::FP4;
    if (quantised) {
        PEREGRINE_CHECK(w.act_block > 0 && w.in % w.act_block == 0,
                        "linear: input width {} is not a multiple of the activation block {}", w.in, w.act_block);
        if (use_gemv(x.f32(), M, d, routed) && linear_gemv_quantises(d)) {  // act_quant inside the GEMV
            linear_gemv(x.f32(), nullptr, M, d, y.f32(), experts, routed ? &routed->routing : nullptr);
            return y;
        }
        static const bool fuse = switch_is("PEREGRINE_CUBLAS_QUANTISE", "1");
        if (fuse && !routed && !use_gemv(x.f32(), M, d, routed) && numerics_ == Numerics::Fast &&
            linear_cublas_supported(d) &&
            act_quant_bf16_supported(x.f32(), w.in, w.act_block)) {  // cuBLAS: quantised straight into its bf16 operand
            linear_cublas(x.f32(), nullptr, M, d, y.f32(), nullptr, nullptr);
            return y;
        }
        Tensor xq = empty(DType::F32, {M, w.in}), xs = empty(DType::F32, {M, w.in / w.act_block});
        act_quant(x.f32(), M, w.in, w.act_block, xq.f32(), xs.f32());
        gemm(xq.f32(), xs.f32(), M, d, y.f32(), experts, routed);
    } else {
        gemm(x.f32(), nullptr, M, d, y.f32(), experts, routed);
    }
    return y;
}

std::pair<Tensor, Tensor> CudaBackend::run_linear_pair(const Tensor& x, const LinearWeight& a, const LinearWeight& b,
                                                       bool bf16_acts, const ExpertTable* ea, const ExpertTable* eb,
                                                       const Routed* routed) {
    const int64_t M = x.numel() / a.in;
    LinearDev da = dev_linear(a), db = dev_linear(b);
    da.bf16_acts = takes_bf16_acts(a, bf16_acts);
    db.bf16_acts = takes_bf16_acts(b, bf16_acts);
    // The GEMV quantises FP8/FP4 activations itself; both must be decode-sized GEMV calls of one input width.
    const bool quantised = a.kind == LinearWeight::Kind::FP8 || a.kind == LinearWeight::Kind::FP4;
    if (a.in == b.in && a.kind == b.kind && use_gemv(x.f32(), M, da, routed) && use_gemv(x.f32(), M, db, routed) &&
        (!quantised || (linear_gemv_quantises(da) && linear_gemv_quantises(db)))) {
        Tensor ya = empty(DType::F32, {M, a.out}), yb = empty(DType::F32, {M, b.out});
        linear_gemv_pair(x.f32(), nullptr, M, da, ya.f32(), db, yb.f32(), ea, eb, routed ? &routed->routing : nullptr);
        return {std::move(ya), std::move(yb)};
    }
    Tensor ya = run_linear(x, a, ea, routed, bf16_acts);
    return {std::move(ya), run_linear(x, b, eb, routed, bf16_acts)};
}

Tensor CudaBackend::linear(const Tensor& x, const LinearWeight& w) {
    OpTimer op_(*this, "linear");
    return run_linear(x, w);
}

std::unique_ptr<StepScratch> CudaBackend::begin_step(const ForwardBatch&) { return std::make_unique<CudaScratch>(); }

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
    cuda::embed(dev_raw(table), table.dtype() == DType::BF16, d.ptr, T, cfg_.hc_mult, cfg_.dim, h.f32());
    return h;
}

void CudaBackend::run_hc_mixes(const Tensor& h, const Tensor& fn, int n_mix, const Tensor& base, const Tensor& scale,
                               int iters, int mode, float* pre, float* post, float* comb) {
    const int64_t T = h.dim(0);
    const int hc = cfg_.hc_mult;
    if (numerics_ != Numerics::Fast) {
        cuda::hc_mixes(h.f32(), T, hc, cfg_.dim, dev_f32(fn), n_mix, dev_f32(base), dev_f32(scale), eps(),
                       static_cast<float>(cfg_.hc_eps), iters, mode, pre, post, comb);
    } else if (hc_small_ && T < 8 && hc_mixes_small_supported(T, n_mix)) {
        // A few rows: two launches, fn read as fp32 (18.5 us at one row against the tensor-core kernel's 20.5; from
        // 8 rows on that kernel is faster: 22.8 against 37.8 us at 32 rows, 24.0 against 53.6 at 64).
        auto ws = device_alloc(hc_mixes_small_workspace(T, hc, cfg_.dim, n_mix));
        hc_mixes_small(h.f32(), T, hc, cfg_.dim, dev_f32(fn), n_mix, dev_f32(base), dev_f32(scale), eps(),
                       static_cast<float>(cfg_.hc_eps), iters, mode, pre, post, comb, ws.get());
    } else {
        hc_mixes_fast(h.f32(), T, hc, cfg_.dim, dev_f32(fn), n_mix, dev_f32(base), dev_f32(scale), eps(),
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
    cudaStream_t stream = nullptr;
    cudaEvent_t fork = nullptr, done = nullptr;
    std::vector<Tensor> pending;  // the mix in flight: its outputs, then its input
};

CudaBackend::SideMixes& CudaBackend::side_mixes() {
    thread_local std::map<int, SideMixes> per_device;
    SideMixes& s = per_device[gpu_];
    if (!s.stream) {
        int lo = 0, hi = 0;
        PG_CUDA(cudaDeviceGetStreamPriorityRange(&lo, &hi));
        PG_CUDA(cudaStreamCreateWithPriority(&s.stream, cudaStreamNonBlocking, hi));  // ahead of the block's launches
        PG_CUDA(cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming));
        PG_CUDA(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    }
    return s;
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
    PG_CUDA(cudaStreamWaitEvent(cudaStreamPerThread, s.done, 0));
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
    dev_f32(w.fn), dev_f32(w.base), dev_f32(w.scale);  // first-use uploads go to this thread's stream, before the fork
    SideMixes& s = side_mixes();
    PG_CUDA(cudaEventRecord(s.fork, cudaStreamPerThread));
    PG_CUDA(cudaStreamWaitEvent(s.stream, s.fork, 0));
    {
        LaunchStream on(s.stream);
        run_hc_mixes(h, w.fn, n_mix, w.base, w.scale, cfg_.hc_sinkhorn_iters, 0, m.pre.f32(), m.post.f32(),
                     m.comb.f32());
    }
    PG_CUDA(cudaEventRecord(s.done, s.stream));
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
    cuda::rms_norm(x.f32(), rows, static_cast<int>(D), dev_f32(w), eps(), y.f32());
    return y;
}

Tensor CudaBackend::collapse_norm(const Tensor& h, const Tensor& pre, const Tensor& w) {
    OpTimer op_(*this, "collapse_norm");
    join_mixes(&pre);
    const int64_t T = h.dim(0);
    Tensor y = empty(DType::F32, {T, cfg_.dim});
    cuda::collapse_norm(h.f32(), pre.f32(), T, cfg_.hc_mult, cfg_.dim, dev_f32(w), eps(), y.f32());
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
        LinearDev d = dev_linear(w);
        d.bf16_acts = true;
        y = empty(DType::F32, {M, w.out});
        linear_cublas(x.f32(), nullptr, M, d, y.f32(), nullptr, nullptr);
    } else {
        y = run_linear(x, w);
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

void CudaBackend::fill_state_random(uint8_t* p, size_t bytes, uint64_t seed) {
    fill_random_bf16(reinterpret_cast<float*>(p), static_cast<int64_t>(bytes / sizeof(float)), seed);
    // The entries are packed: random bytes become valid codes and scales (whole pages only).
    const int64_t n_pages = static_cast<int64_t>(bytes / layout_.page_bytes);
    for (const auto& L : layout_.layers)
        for (const StateSection* sec : {&L.window, &L.comp, &L.index_k})
            if (sec->present())
                sanitize_entries(p, n_pages, static_cast<int64_t>(layout_.page_bytes),
                                 static_cast<int64_t>(sec->offset), sec->entries_per_page, sec->format);
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

size_t CudaBackend::graph_memory_bytes() const {
    uint64_t bytes = 0;
    if (cudaDeviceGetGraphMemAttribute(gpu_, cudaGraphMemAttrReservedMemHigh, &bytes) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return static_cast<size_t>(bytes);
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

std::string CudaBackend::device_name() const {
    cudaDeviceProp p{};
    PG_CUDA(cudaGetDeviceProperties(&p, gpu_));
    return p.name;
}

}  // namespace peregrine::cuda
