// Device memory, uploads through a pinned staging ring, page-locked buffers for results, and tensor copies.
#include "ops/cuda/device_memory.h"
#include "ops/cuda/launch_check.h"
#include "ops/cuda/launch_stream.h"
#include "util/error.h"
#include "util/log.h"

#include <cuda_runtime.h>

#include "util/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <unistd.h>

namespace peregrine::cuda {

namespace {
thread_local CaptureArena* active_arena = nullptr;
}

// Stream-ordered on the stream kernels launch on (launch_stream(): the thread's own, or a side stream), and freed
// on the same stream.
std::shared_ptr<void> device_alloc(size_t bytes) {
    void* p = nullptr;
    const cudaStream_t s = launch_stream();
    if (CaptureArena* arena = active_arena) {
        const size_t offset = arena->layout_.take(bytes, s);
        const bool pooled = offset + arena->layout_.size_of(offset) > arena->cap_;  // past the arena's end
        if (pooled) PG_CUDA(cudaMallocAsync(&p, std::max<size_t>(bytes, 16), s));
        else p = arena->base_ + offset;
        return std::shared_ptr<void>(p, [a = arena->shared_from_this(), offset, pooled, s](void* q) {
            a->layout_.give(offset, s);
            if (pooled) cudaFreeAsync(q, s);
        });
    }
    PG_CUDA(cudaMallocAsync(&p, std::max<size_t>(bytes, 16), s));
    return std::shared_ptr<void>(p, [s](void* q) { cudaFreeAsync(q, s); });
}

CaptureArena::CaptureArena(size_t bytes) : cap_(bytes) {
    PG_CUDA(cudaMalloc(&base_, std::max<size_t>(cap_, ArenaLayout::kAlign)));
}

CaptureArena::~CaptureArena() {
    cudaFree(base_);  // synchronising: the graphs that used it are gone
}

CaptureArena::Scope::Scope(CaptureArena& arena) : prev_(active_arena) { active_arena = &arena; }
CaptureArena::Scope::~Scope() { active_arena = prev_; }

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

namespace {
std::atomic<size_t> g_weight_bytes{0};

// Two pinned buffers per thread (their events are recorded on the thread's stream).
struct WeightStaging {
    static constexpr size_t kChunk = size_t(64) << 20, kSlice = size_t(4) << 20;
    void* buf[2] = {};
    cudaEvent_t done[2] = {};
    bool used[2] = {};
    ~WeightStaging() {
        if (!buf[0]) return;
        cudaDeviceSynchronize();
        for (int b = 0; b < 2; ++b) {
            cudaEventDestroy(done[b]);
            cudaFreeHost(buf[b]);
        }
    }
};
}  // namespace

void upload_weight(void* dst, const void* src, size_t bytes) {
    thread_local WeightStaging st;
    constexpr size_t kChunk = WeightStaging::kChunk, kSlice = WeightStaging::kSlice;
    if (bytes < 2 * kSlice) {
        PG_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
        g_weight_bytes += bytes;
        return;
    }
    if (!st.buf[0])
        for (int b = 0; b < 2; ++b) {
            PG_CUDA(cudaMallocHost(&st.buf[b], kChunk));
            PG_CUDA(cudaEventCreateWithFlags(&st.done[b], cudaEventDisableTiming));
        }
    const cudaStream_t s = launch_stream();
    int last = 0;
    for (size_t o = 0, i = 0; o < bytes; o += kChunk, ++i) {
        const int b = static_cast<int>(i % 2);
        const size_t n = std::min(kChunk, bytes - o);
        if (st.used[b]) PG_CUDA(cudaEventSynchronize(st.done[b]));
        char* to = static_cast<char*>(st.buf[b]);
        const char* from = static_cast<const char*>(src) + o;
        // The reads (page cache or disk, behind the checkpoint's mapping) on every thread at once.
        parallel_for(static_cast<int64_t>((n + kSlice - 1) / kSlice), [&](int64_t k0, int64_t k1) {
            for (int64_t k = k0; k < k1; ++k) {
                const size_t at = static_cast<size_t>(k) * kSlice;
                std::memcpy(to + at, from + at, std::min(kSlice, n - at));
            }
        });
        PG_CUDA(cudaMemcpyAsync(static_cast<char*>(dst) + o, to, n, cudaMemcpyHostToDevice, s));
        PG_CUDA(cudaEventRecord(st.done[b], s));
        st.used[b] = true;
        last = b;
        g_weight_bytes += n;
    }
    PG_CUDA(cudaEventSynchronize(st.done[last]));  // complete, as a parameter is read from any stream
}

size_t weight_bytes_uploaded() { return g_weight_bytes.load(); }

Tensor empty(DType dtype, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    auto keep = device_alloc(static_cast<size_t>(n) * dtype_size(dtype));
    void* p = keep.get();
    return Tensor::view(dtype, std::move(shape), p, Device::CUDA, std::move(keep));
}

Tensor to_device(const Tensor& host) {
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

namespace {
// Page ranges registered with cudaHostRegister, by start: their end and how many handles use them. Ranges are never
// merged or split: a request overlapping registered pages registers only the gaps and holds every range it touches.
struct PinRegistry {
    std::mutex mu;
    std::map<uintptr_t, std::pair<uintptr_t, int>> ranges;
    std::map<const void*, std::weak_ptr<const void>> copies;  // the fallback's copies, by source
    size_t bytes = 0;
};
PinRegistry& pin_registry() {
    static auto* r = new PinRegistry;  // lives as long as the process, like the CUDA context
    return *r;
}

void unpin(std::vector<uintptr_t> starts) {
    PinRegistry& r = pin_registry();
    std::lock_guard lk(r.mu);
    for (uintptr_t a : starts) {
        auto it = r.ranges.find(a);
        if (--it->second.second > 0) continue;
        cudaHostUnregister(reinterpret_cast<void*>(a));
        r.bytes -= it->second.first - a;
        r.ranges.erase(it);
    }
}

// The fallback: one portable, mapped pinned copy per source, filled by every thread of the pool.
std::shared_ptr<const void> pinned_copy(const void* host, size_t bytes) {
    PinRegistry& r = pin_registry();
    std::lock_guard lk(r.mu);
    if (auto c = r.copies[host].lock()) return c;
    void* p = nullptr;
    PG_CUDA(cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
    parallel_for(static_cast<int64_t>(bytes), [&](int64_t i0, int64_t i1) {
        const size_t n = static_cast<size_t>(i1 - i0);
        std::memcpy(static_cast<uint8_t*>(p) + i0, static_cast<const uint8_t*>(host) + i0, n);
    }, int64_t(64) << 20);
    void* dev = nullptr;
    PG_CUDA(cudaHostGetDevicePointer(&dev, p, 0));
    r.bytes += bytes;
    std::shared_ptr<const void> c(dev, [p, bytes](const void*) {
        cudaFreeHost(p);
        PinRegistry& reg = pin_registry();
        std::lock_guard l(reg.mu);
        reg.bytes -= bytes;
    });
    r.copies[host] = c;
    return c;
}
}  // namespace

std::shared_ptr<const void> pin_host_memory(const void* host, size_t bytes) {
    PEREGRINE_CHECK(bytes > 0, "pin_host_memory: nothing to pin");
    static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t a = reinterpret_cast<uintptr_t>(host) / page * page;
    const uintptr_t b = (reinterpret_cast<uintptr_t>(host) + bytes + page - 1) / page * page;
    PinRegistry& r = pin_registry();
    std::vector<uintptr_t> held;  // ranges this handle holds: those it overlaps, then the gaps it registers
    bool pinned = true;
    {
        std::lock_guard lk(r.mu);
        auto it = r.ranges.upper_bound(a);
        if (it != r.ranges.begin() && std::prev(it)->second.first > a) --it;
        std::vector<std::pair<uintptr_t, uintptr_t>> gaps;
        uintptr_t at = a;
        for (; it != r.ranges.end() && it->first < b; ++it) {
            if (it->first > at) gaps.emplace_back(at, it->first);
            held.push_back(it->first);
            at = std::max(at, it->second.first);
        }
        if (at < b) gaps.emplace_back(at, b);
        std::vector<uintptr_t> registered;
        for (auto [g0, g1] : gaps) {
            // Read-only where the device supports it (a checkpoint is mapped without write access); plain otherwise.
            void* g = reinterpret_cast<void*>(g0);
            const unsigned flags = cudaHostRegisterMapped | cudaHostRegisterPortable;
            if (cudaHostRegister(g, g1 - g0, flags | cudaHostRegisterReadOnly) != cudaSuccess &&
                (cudaGetLastError(), cudaHostRegister(g, g1 - g0, flags) != cudaSuccess)) {
                cudaGetLastError();
                pinned = false;
                break;
            }
            registered.push_back(g0);
            r.ranges[g0] = {g1, 0};
            r.bytes += g1 - g0;
        }
        // Kernels read through the host address itself (unified addressing), across registrations.
        void* dev = nullptr;
        if (pinned && (cudaHostGetDevicePointer(&dev, const_cast<void*>(host), 0) != cudaSuccess || dev != host)) {
            cudaGetLastError();
            pinned = false;
        }
        if (!pinned) {
            for (uintptr_t g : registered) {
                cudaHostUnregister(reinterpret_cast<void*>(g));
                r.bytes -= r.ranges[g].first - g;
                r.ranges.erase(g);
            }
            held.clear();
        } else {
            held.insert(held.end(), registered.begin(), registered.end());
            for (uintptr_t h : held) ++r.ranges[h].second;
        }
    }
    if (!pinned) {
        spdlog::warn("{:.2f} GB of host memory could not be pinned in place: the GPUs read a pinned copy",
                     static_cast<double>(bytes) / 1e9);
        return pinned_copy(host, bytes);
    }
    return std::shared_ptr<const void>(host, [held](const void*) { unpin(held); });
}

size_t pinned_host_bytes() {
    PinRegistry& r = pin_registry();
    std::lock_guard lk(r.mu);
    return r.bytes;
}

Tensor to_host_pinned(const Tensor& dev, double* wait_ms) {
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

Tensor to_host(const Tensor& dev) {
    PEREGRINE_CHECK(dev.device() == Device::CUDA, "to_host: tensor is not on the device");
    Tensor t = Tensor::zeros(dev.dtype(), dev.shape());
    if (dev.nbytes()) PG_CUDA(cudaMemcpy(t.raw(), dev.raw(), dev.nbytes(), cudaMemcpyDeviceToHost));
    return t;
}

}  // namespace peregrine::cuda
