#!/usr/bin/env bash
# Builds the peer harnesses of bench/peers against the peers' own packages, fetched from PyPI into OUT_DIR (default
# out/peers; nothing of theirs enters the repository), for the GPU machine's H200 (sm_90a). The indexer, grouped
# and MegaMoE harnesses also link our kernels from BUILD_DIR (default build; configured and built first). The stripped
# harnesses land in OUT_DIR/bin, which tools/gpu/pack.sh adds to its bundle (as peers/); on the GPU machine, after
# unpack.sh: tools/gpu/peers.sh out/gpu/bin out/gpu/bin/peers OUT.
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
mkdir -p "$out/bin"
for h in deepgemm_dense deepinfer_indexer deepinfer_grouped sgl_megamoe; do strip -o "$out/bin/$h" "$out/$h"; done
ls "$out"/bin/*
