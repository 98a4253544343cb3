#!/usr/bin/env bash
# Builds the peer harnesses of bench/peers against the peers' own packages, fetched from PyPI into OUT_DIR (default
# out/peers; nothing of theirs enters the repository), for the GPU machine's H200 (sm_90a). The indexer, grouped,
# MegaMoE and FlashInfer harnesses also link our kernels from BUILD_DIR (default build; configured and built first).
# The stripped harnesses land in OUT_DIR/bin, which tools/gpu/pack.sh adds to its bundle (as peers/); on the GPU
# machine, after unpack.sh: tools/gpu/peers.sh out/gpu/bin out/gpu/bin/peers OUT.
#
#   bench/peers/build.sh [OUT_DIR] [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$here/out/peers}
build=${2:-$here/build}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
flags=(-std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -diag-suppress 174,177,20050)
mkdir -p "$out/wheels"

# SGLang's DeepGEMM fork: its wheel carries the kernel headers (with the CuTe and CUTLASS it builds with).
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$out/wheels" sgl-deep-gemm==0.2.5
rm -rf "$out/sgl-deep-gemm"
python3 -m zipfile -e "$out"/wheels/sgl_deep_gemm-0.2.5-*.whl "$out/sgl-deep-gemm"
"$nvcc" "${flags[@]}" -I"$out/sgl-deep-gemm/deep_gemm/include" "$here/bench/peers/deepgemm_dense.cu" \
  -o "$out/deepgemm_dense" -lcublas

# DeepInfer's DeepGEMM: an sdist (its metadata names another package, so pip will not fetch it by this name): the
# kernel headers, the host code that shows how they are configured, and CUTLASS under third-party/.
sdist=deepinfer_gemm-2.8.2.tar.gz
sha=aad050965750f809b8dbb744a8db54fc4eba0eb3bc99d565fa9b41010fe25351
if ! echo "$sha  $out/wheels/$sdist" | sha256sum -c --quiet 2>/dev/null; then
  url=$(curl -sSf https://pypi.org/simple/deepinfer-gemm/ | grep -o "https://[^\"#]*/$sdist" | head -1)
  curl -sSfL -o "$out/wheels/$sdist" "$url"
  echo "$sha  $out/wheels/$sdist" | sha256sum -c --quiet
fi
rm -rf "$out/deepinfer"
mkdir -p "$out/deepinfer"
tar -xzf "$out/wheels/$sdist" -C "$out/deepinfer" --strip-components=1
di=(-I"$out/deepinfer/deep_gemm/include" -I"$out/deepinfer/third-party/cutlass/include")
lib=$build/src
ours=("$lib/ops/libperegrine_ops.a" "$lib/kv/libperegrine_kv.a" "$lib/io/libperegrine_io.a"
  "$lib/tensor/libperegrine_tensor.a" "$lib/util/libperegrine_util.a" -lspdlog -lfmt -lcublas -lcublasLt)
"$nvcc" "${flags[@]}" "${di[@]}" -I"$here/src" "$here/bench/peers/deepinfer_grouped.cu" -o "$out/deepinfer_grouped" \
  "${ours[@]}"
"$nvcc" "${flags[@]}" "${di[@]}" -I"$here/src" "$here/bench/peers/deepinfer_indexer.cu" -o "$out/deepinfer_indexer" \
  "${ours[@]}"
"$nvcc" "${flags[@]}" -I"$out/sgl-deep-gemm/deep_gemm/include" -I"$here/src" "$here/bench/peers/sgl_megamoe.cu" \
  -o "$out/sgl_megamoe" "${ours[@]}"

# FlashInfer: its wheel carries TensorRT-LLM's MoE GEMM sources (csrc) and the CUTLASS they build with. The harness
# instantiates the sm90 mixed-input launcher at a handful of tiles (W4A16, W4A8: ~4 minutes each), with the few of
# TensorRT-LLM's common sources the launcher calls and FlashInfer's weight-interleave kernels.
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$out/wheels" flashinfer-python==0.7.2
rm -rf "$out/flashinfer"
python3 -m zipfile -e "$out"/wheels/flashinfer_python-0.7.2-*.whl "$out/flashinfer"
fd=$out/flashinfer/flashinfer/data
nv=$fd/csrc/nv_internal
# FlashInfer's kernels with its JIT's flags for this module (flashinfer/jit/core.py, fused_moe.py: C++17, -O3,
# NDEBUG, fast math; without NDEBUG the device asserts become calls that serialise the kernels' wgmmas).
fi_defs=(-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -DCOMPILE_HOPPER_TMA_GEMMS -DCOMPILE_HOPPER_TMA_GROUPED_GEMMS
  -DENABLE_BF16 -DENABLE_FP8 -DENABLE_FP8_BLOCK_SCALE -DENABLE_FP4 -DUSING_OSS_CUTLASS_MOE_GEMM
  -DCUTLASS_ENABLE_GDC_FOR_SM90=1 -DCUTLASS_MIXED_GEMM_FP4_FP8_PREPROCESSED_SIGNS=1 -DFLASHINFER_ENABLE_F16
  -DFLASHINFER_ENABLE_BF16 -DFLASHINFER_ENABLE_FP8_E4M3 -DFLASHINFER_ENABLE_FP8_E5M2 -DFLASHINFER_ENABLE_FP8_E8M0
  -DFLASHINFER_ENABLE_FP4_E2M1 -I"$nv" -I"$nv/include" -I"$nv/tensorrt_llm/cutlass_extensions/include"
  -I"$nv/tensorrt_llm/kernels/cutlass_kernels/include" -I"$nv/tensorrt_llm/kernels/cutlass_kernels"
  -I"$fd/cutlass/include" -I"$fd/cutlass/tools/util/include")
fi_flags=(-std=c++17 -O3 -DNDEBUG -use_fast_math -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr
  -static-global-template-stub=false -diag-suppress 174,177,20012,20050 "${fi_defs[@]}")
mkdir -p "$out/fi-obj"
for part in w4a16 w4a8; do  # one at a time: each compiler process takes ~12 GB
  "$nvcc" "${fi_flags[@]}" -c "$here/bench/peers/flashinfer_moe_$part.cu" -o "$out/fi-obj/$part.o"
done
"$nvcc" "${fi_flags[@]}" -c "$nv/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.cu" \
  -o "$out/fi-obj/mixed_utils.o"
for f in logger tllmException stringUtils; do
  g++ -std=c++17 -O3 -DNDEBUG -DENABLE_BF16 -DENABLE_FP8 -I"$nv" -I"$nv/include" -I/usr/local/cuda/include \
    -c "$nv/cpp/common/$f.cpp" -o "$out/fi-obj/$f.o"
done
"$nvcc" "${flags[@]}" "${fi_defs[@]}" -I"$here/src" -c "$here/bench/peers/flashinfer_moe.cu" \
  -o "$out/fi-obj/harness.o"
# (-lz -lhiredis: a libstdc++ instantiation TensorRT-LLM's logger needs is first found in our kv library's objects.)
"$nvcc" "${flags[@]}" "$out"/fi-obj/*.o -o "$out/flashinfer_moe" "${ours[@]}" -lz -lhiredis

mkdir -p "$out/bin"
for h in deepgemm_dense deepinfer_indexer deepinfer_grouped sgl_megamoe flashinfer_moe; do
  strip -o "$out/bin/$h" "$out/$h"
done
ls "$out"/bin/*
