// FlashInfer's W4A16 MoE GEMM configurations for flashinfer_moe.cu: bf16 activations x MXFP4 weights, the ue8m0
// scales applied after each k-block's MMAs (MixedInputScaleMode::kPostMma), as its sm90 W4A16 path instantiates
// them. FlashInfer autotunes over ~30 tiles x 2 schedules x 4 clusters; these are a spread from one token tile of 16
// (decode) to 256 (prefill), one cluster.
#include "flashinfer_moe_launchers.h"

namespace fi {

template <>
std::vector<Config<__nv_bfloat16>> configs() {
    return launchers<__nv_bfloat16, cutlass::gemm::collective::MixedInputScaleMode::kPostMma>();
}

}  // namespace fi
