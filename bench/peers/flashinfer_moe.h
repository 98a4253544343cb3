#pragma once
// What flashinfer_moe.cu and its configuration files share: FlashInfer's types for one grouped MoE GEMM on sm90
// (TensorRT-LLM's mixed-input launcher; headers from the flashinfer-python wheel, bench/peers/build.sh) and the
// configurations compiled here, each a launcher of FlashInfer's own, instantiated at one tile shape and schedule.
#include "tensorrt_llm/kernels/cutlass_kernels/include/moe_gemm_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <vector>

namespace fi {

namespace ck = tensorrt_llm::kernels::cutlass_kernels;
using Out = __nv_bfloat16;
template <typename T>  // T: the activations, __nv_bfloat16 (W4A16) or __nv_fp8_e4m3 (W4A8)
using Inputs = ck::GroupedGemmInput<T, ck::Fp4Type, Out, Out>;
using Hopper = ck::TmaWarpSpecializedGroupedGemmInput;
template <typename T>  // with workspace_size set it only sizes the GEMM's workspace
using Launcher = void (*)(Inputs<T>, Hopper, int sm_count, size_t* workspace_size);

template <typename T>
struct Config {
    const char* name;  // tile M (weight rows) x N (tokens) x K, schedule
    Launcher<T> run;
};

// Defined in flashinfer_moe_w4a16.cu and flashinfer_moe_w4a8.cu (one compiler process each: they are slow to build).
template <typename T>
std::vector<Config<T>> configs();

}  // namespace fi
