#pragma once
// The tiles flashinfer_moe_w4a16.cu and flashinfer_moe_w4a8.cu instantiate FlashInfer's launcher at (its .inl, from
// the wheel: every kernel is compiled here, where its own build would JIT them on first use).
#include "flashinfer_moe.h"

#include "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/moe_gemm_tma_ws_mixed_input_launcher.inl"

namespace fi {

using namespace cute;
namespace launch = tensorrt_llm::kernels::cutlass_kernels_oss;
using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;

// One configuration: tile M (weight rows, swapped into the MMA's M) x N (tokens) x K, one CTA a cluster; the epilogue
// schedule FlashInfer pairs with both mainloop schedules.
template <typename T, cutlass::gemm::collective::MixedInputScaleMode Mode, int M, int N, int K, typename Schedule>
Config<T> launcher(const char* name) {
    return {name, &launch::sm90_generic_mixed_moe_gemm_kernelLauncher<
                      T, ck::Fp4Type, Out, tensorrt_llm::cutlass_extensions::EpilogueOpDefault,
                      Shape<Int<M>, Int<N>, Int<K>>, Shape<_1, _1, _1>, Schedule,
                      cutlass::epilogue::TmaWarpSpecializedCooperative,
                      cutlass::WeightOnlyQuantOp::FINEGRAINED_SCALE_ONLY, Mode>};
}

template <typename T, cutlass::gemm::collective::MixedInputScaleMode Mode>
std::vector<Config<T>> launchers() {
    return {launcher<T, Mode, 128, 16, 128, Cooperative>("128x16x128 cooperative"),
            launcher<T, Mode, 128, 16, 256, Cooperative>("128x16x256 cooperative"),
            launcher<T, Mode, 64, 16, 256, Pingpong>("64x16x256 pingpong"),
            launcher<T, Mode, 128, 32, 256, Cooperative>("128x32x256 cooperative"),
            launcher<T, Mode, 128, 64, 128, Cooperative>("128x64x128 cooperative"),
            launcher<T, Mode, 128, 64, 256, Cooperative>("128x64x256 cooperative"),
            launcher<T, Mode, 64, 64, 256, Pingpong>("64x64x256 pingpong"),
            launcher<T, Mode, 128, 128, 128, Cooperative>("128x128x128 cooperative"),
            launcher<T, Mode, 128, 128, 128, Pingpong>("128x128x128 pingpong"),
            launcher<T, Mode, 128, 256, 128, Cooperative>("128x256x128 cooperative")};
}

}  // namespace fi
