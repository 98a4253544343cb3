#pragma once
// Device memory for the CUDA backend's pieces: stream-ordered allocations, uploads that never make the host wait
// (a pinned staging ring), page-locked buffers for results copied back every step, and tensor copies.
#include "tensor/tensor.h"

#include <cstddef>
#include <memory>
#include <vector>

namespace peregrine::cuda {

// Device memory of `bytes`, freed in stream order when the last reference goes.
std::shared_ptr<void> device_alloc(size_t bytes);
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
