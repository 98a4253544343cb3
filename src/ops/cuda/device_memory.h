#pragma once
// Device memory for the CUDA backend's pieces: stream-ordered allocations, uploads that never make the host wait
// (a pinned staging ring), page-locked buffers for results copied back every step, and tensor copies.
#include "ops/cuda/arena_layout.h"
#include "tensor/tensor.h"

#include <cstddef>
#include <memory>
#include <vector>

namespace peregrine::cuda {

// Device memory of `bytes`, freed in stream order when the last reference goes (during a graph capture with an
// arena in scope, a block of the arena).
std::shared_ptr<void> device_alloc(size_t bytes);

// Device memory for the allocations of one captured graph (GraphRunner). With the stream-ordered pool, every
// allocation and free inside a capture becomes a memory node of the graph, and a node between two kernels breaks
// their programmatic dependency (the next kernel's prologue no longer overlaps the previous one's tail). So while
// an arena is in scope (CaptureArena::Scope), device_alloc hands out its blocks: fixed addresses, no nodes. A block
// freed during the capture is handed out again only to a later allocation on the same stream, which the capture
// orders after every earlier use on that stream, as the pool orders its own reuse. Blocks are laid out as if the
// arena had no end (ArenaLayout); those past its end come from the pool (memory nodes: right, only slower), and
// needed() is the size that would have held them all.
class CaptureArena : public std::enable_shared_from_this<CaptureArena> {
public:
    explicit CaptureArena(size_t bytes);
    ~CaptureArena();
    CaptureArena(const CaptureArena&) = delete;
    CaptureArena& operator=(const CaptureArena&) = delete;
    size_t bytes() const { return cap_; }
    size_t needed() const { return layout_.top(); }

    // device_alloc uses `arena` on this thread while the scope lives.
    class Scope {
    public:
        explicit Scope(CaptureArena& arena);
        ~Scope();
        Scope(const Scope&) = delete;
        Scope& operator=(const Scope&) = delete;

    private:
        CaptureArena* prev_;
    };

private:
    friend std::shared_ptr<void> device_alloc(size_t bytes);
    char* base_ = nullptr;
    size_t cap_ = 0;
    ArenaLayout layout_;
};

void copy_to_device(void* dst, const void* src, size_t bytes);
// A parameter's upload at start-up, complete on return: large ones are read by every thread of the global pool into
// pinned staging (two buffers, so one goes over the bus while the next is read), small ones through the ring.
void upload_weight(void* dst, const void* src, size_t bytes);
// Bytes upload_weight has copied, by every thread of the process (start-up progress).
size_t weight_bytes_uploaded();
// Page-locked host memory of at least `bytes` from a reused pool (results copied back every step).
std::shared_ptr<void> pinned_host_buffer(size_t bytes);

// Host memory the GPUs read over the bus (Engram tables placed on the host), pinned where it lies: no copy, and one
// registration per process however many ranks' backends read the same bytes (ranks share the checkpoint's map).
// The handle's pointer is what kernels read through; the last handle of a range unpins it. Where the system refuses
// to pin the memory in place, one pinned copy is made (and shared) instead.
std::shared_ptr<const void> pin_host_memory(const void* host, size_t bytes);
// Bytes pinned or copied by pin_host_memory and still held, process-wide.
size_t pinned_host_bytes();

// A typed device copy of a host vector (kept alive by `keep`).
template <typename T>
struct DevArray {
    std::shared_ptr<void> keep;
    T* ptr = nullptr;
};
template <typename T>
DevArray<T> upload(const std::vector<T>& v) {
    DevArray<T> a;
    a.keep = device_alloc(sizeof(T) * std::max<size_t>(v.size(), 1));
    a.ptr = static_cast<T*>(a.keep.get());
    if (!v.empty()) copy_to_device(a.ptr, v.data(), sizeof(T) * v.size());
    return a;
}

// An uninitialised device tensor.
Tensor empty(DType dtype, std::vector<int64_t> shape);
// Host <-> device copies of tensors (tests, tools).
Tensor to_device(const Tensor& host);
Tensor to_host(const Tensor& dev);
// The same into reused page-locked memory (results copied back every step); *wait_ms (if given) adds the wall
// time spent waiting for the device.
Tensor to_host_pinned(const Tensor& dev, double* wait_ms = nullptr);

}  // namespace peregrine::cuda
