#pragma once
// Programmatic dependent launch (sm_90): a kernel launched with launch_pdl may start while the kernel before it
// in the stream is still running, once every block of that one has called pdl_trigger (or exited). Decode steps
// are chains of a few hundred small kernels, each of which would otherwise wait for the previous one to drain
// before its blocks are even placed; this way the placement, and whatever a kernel does before pdl_wait (the
// GEMV streams its first weight stages: weights never change during a step), overlap the previous kernel.
//
// The rule that keeps it correct: a kernel launched with launch_pdl reads nothing another kernel wrote, and
// writes no global memory, before pdl_wait, which returns once the previous kernel has completed and its writes
// are visible (and therefore every kernel before that one too). Kernels call pdl_trigger after their pdl_wait,
// so that at most the next kernel's blocks wait beside a running one. Both are no-ops where the launch was a
// plain one. PEREGRINE_PDL=0 (or set_pdl(false)) launches every kernel plainly (A/B).
#include "ops/cuda/launch_check.h"
#include "ops/cuda/launch_stream.h"
#include "util/switches.h"

#include <cuda_runtime.h>

#include <atomic>
#include <utility>

namespace peregrine::cuda {

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
// The usual entry of a kernel launched with launch_pdl that has nothing to do before its inputs are ready.
__device__ __forceinline__ void pdl_enter() {
    pdl_wait();
    pdl_trigger();
}

// Settable for tests (set_pdl in kernels.h); one flag for every translation unit.
inline std::atomic<bool>& pdl_flag() {
    static std::atomic<bool> on{switch_is("PEREGRINE_PDL", "1")};
    return on;
}

// kernel<<<grid, block, smem>>>(args...) on launch_stream(), allowed to overlap the previous kernel there.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = launch_stream();
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl_flag().load(std::memory_order_relaxed) ? 1 : 0;
    PG_CUDA(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace peregrine::cuda
