#pragma once
// Where state pages and carries live: host memory for the CPU backend, device memory for CUDA (each backend
// provides its own). Copies are ordered with the compute that reads and writes the state (on a GPU: the
// calling thread's stream), so a state may be set up while earlier steps still run.
#include <cstddef>
#include <cstdint>
#include <functional>

namespace peregrine {

class StateMemory {
public:
    virtual ~StateMemory() = default;
    // `bytes` of zeroed memory; fails with the size when there is not enough.
    virtual uint8_t* alloc(size_t bytes) = 0;
    virtual void free(uint8_t* p) = 0;
    // Into host memory, once every write before it is done.
    virtual void to_host(const uint8_t* src, size_t bytes, void* dst) = 0;
    virtual void from_host(uint8_t* dst, const void* src, size_t bytes) = 0;
    virtual void copy(uint8_t* dst, const uint8_t* src, size_t bytes) = 0;

    // The hierarchical cache's host tier: host memory the two copies below may use (pinned on a GPU, so that
    // they run asynchronously, ordered with compute like the copies above).
    virtual uint8_t* alloc_host(size_t bytes);
    virtual void free_host(uint8_t* p);
    virtual void page_to_host(const uint8_t* src, size_t bytes, uint8_t* host) { to_host(src, bytes, host); }
    virtual void page_from_host(uint8_t* dst, const uint8_t* host, size_t bytes) { from_host(dst, host, bytes); }
    // A call that returns, on any thread, once every copy this thread enqueued before fence() is done.
    virtual std::function<void()> fence() { return {}; }
};

// Plain host memory (64-byte aligned).
class HostStateMemory final : public StateMemory {
public:
    uint8_t* alloc(size_t bytes) override;
    void free(uint8_t* p) override;
    void to_host(const uint8_t* src, size_t bytes, void* dst) override;
    void from_host(uint8_t* dst, const void* src, size_t bytes) override;
    void copy(uint8_t* dst, const uint8_t* src, size_t bytes) override;
};

}  // namespace peregrine
