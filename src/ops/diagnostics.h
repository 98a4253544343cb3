#pragma once
// What benchmarks and tools ask of a backend beyond its ops: device time per op, graphs, memory, bandwidth. The
// CUDA backend answers (Backend::diagnostics); the CPU backend has none.
#include "kv/page_pool.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace peregrine {

class Diagnostics {
public:
    virtual ~Diagnostics() = default;
    virtual std::string device_name() const = 0;
    // Profiling records device time per outermost op (and per phase inside attention and MoE); profile() waits
    // for the device and returns milliseconds by name, then clears.
    virtual void set_profiling(bool on) = 0;
    virtual std::map<std::string, double> profile() = 0;
    // Wall milliseconds the host spent waiting for results (logits, sampled ids) since the last call.
    virtual double take_host_wait_ms() = 0;
    // Routes row t's slot k to expert (t*K + k) % E: every expert equally loaded (the router still computed).
    virtual void set_balanced_routing(bool on) = 0;
    // Whether steps run as CUDA graphs, and the memory the graphs hold (high-water mark; 0 if unknown).
    virtual bool graphs() const = 0;
    virtual size_t graph_memory_bytes() const = 0;
    // Decode batch sizes whose steps are captured as graphs (the second step at a size captures; none: no graphs).
    virtual std::vector<int> graph_batch_sizes() const = 0;
    // What the graphs captured so far hold, summed: kernel nodes, other nodes (copies, memsets, empty joins), edges
    // from one kernel to another, and how many of those are programmatic (the next kernel's blocks may start before
    // the previous one ends, as launches on a stream do: pdl.cuh). A full edge between two kernels of a chain costs
    // the launch latency the overlapping launches hide.
    struct GraphCensus {
        int64_t kernels = 0, other_nodes = 0, kernel_edges = 0, programmatic_edges = 0;
    };
    virtual GraphCensus graph_census() const = 0;
    // Free device memory, and a device-to-device copy's bandwidth (bytes read plus written per second, GB/s).
    virtual size_t free_memory() const = 0;
    // The device's memory, and the bytes of its stream-ordered pool in use now and at most since the last reset
    // (weights and activations come from that pool; state pages do not), what the pool holds mapped (in use or kept
    // for the next step), and the whole device's use (the context included: what nvidia-smi shows). `reset_peak`
    // restarts the peak at now.
    struct MemoryUse {
        size_t total = 0, used_now = 0, used_peak = 0, pool_reserved = 0, device_used = 0;
    };
    virtual MemoryUse memory_use(bool reset_peak) = 0;
    // Parameters (and their tables) copied to the device so far: a warm-up that uploads every weight leaves no
    // later step anything to add.
    virtual size_t weights_uploaded() const = 0;
    // Bytes of parameters copied to the device so far, by every backend of the process (start-up progress).
    virtual size_t weight_bytes_uploaded() const = 0;
    virtual double copy_bandwidth_gbs(size_t bytes, int reps) const = 0;
    // Fills every page of the pool with valid random entries (a cached context without its prefill).
    virtual void fill_state_random(const PagePool& pool, uint64_t seed) = 0;
};

}  // namespace peregrine
