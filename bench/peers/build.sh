#!/usr/bin/env bash
# Builds the peer harnesses of bench/peers against the peers' own packages, fetched from PyPI into OUT_DIR (default
# out/peers; nothing of theirs enters the repository), for the GPU machine's H200 (sm_90a). Then carry OUT_DIR and run
# tools/gpu/peers.sh there.
#
#   bench/peers/build.sh [OUT_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$here/out/peers}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$out/wheels"
# SGLang's DeepGEMM fork: its wheel carries the kernel headers (with the CuTe and CUTLASS it builds with).
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$out/wheels" sgl-deep-gemm==0.2.5
rm -rf "$out/sgl-deep-gemm"
python3 -m zipfile -e "$out"/wheels/sgl_deep_gemm-0.2.5-*.whl "$out/sgl-deep-gemm"
"$nvcc" -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -diag-suppress 174 \
  -I"$out/sgl-deep-gemm/deep_gemm/include" "$here/bench/peers/deepgemm_dense.cu" -o "$out/deepgemm_dense" -lcublas
echo "$out/deepgemm_dense"
