// FlashInfer's W4A8 MoE GEMM configurations for flashinfer_moe.cu: e4m3 activations x MXFP4 weights in the pre-MMA
// form (FP4 codes turned into e4m3 with each 32-block's exponent offset before the MMAs, MixedInputScaleMode::
// kPreMmaE8M0; a scale per row after them), as its sm90 W4A8 path instantiates them; the same tiles as W4A16.
#include "flashinfer_moe_launchers.h"

namespace fi {

template <>
std::vector<Config<__nv_fp8_e4m3>> configs() {
    return launchers<__nv_fp8_e4m3, cutlass::gemm::collective::MixedInputScaleMode::kPreMmaE8M0>();
}

}  // namespace fi
