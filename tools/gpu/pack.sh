#!/usr/bin/env bash
# Packs what a GPU run needs into one xz bundle inside the repository (out/ is ignored; carry it): peregrine and
# every test_cuda_* binary of BUILD_DIR (stripped), optionally a second peregrine to compare against (as
# peregrine-base, for compare_builds.sh), the peer harnesses of out/peers/bin (peers/, from bench/peers/build.sh),
# and the shared libraries the GPU image lacks (lib/). The binaries share most of their bytes (the kernels), so one
# xz stream with a large dictionary holds them in a few MB (7.6 MB with the peers).
#
#   tools/gpu/pack.sh [BUILD_DIR] [BASE_PEREGRINE]        -> out/gpu/bundle.tar.xz
#
# On the GPU machine: tools/gpu/unpack.sh (-> out/gpu/bin), then tools/gpu/check.sh out/gpu/bin.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
base=${2:-}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$here/out/gpu"
strip -o "$stage/peregrine" "$build/peregrine"
for t in "$build"/tests/ops/test_cuda_*; do
  [[ -x $t && -f $t ]] && strip -o "$stage/$(basename "$t")" "$t"
done
[[ -n $base ]] && strip -o "$stage/peregrine-base" "$base"
# The peer harnesses, where bench/peers/build.sh built them.
if [[ -d $here/out/peers/bin ]]; then
  mkdir -p "$stage/peers"
  cp "$here"/out/peers/bin/* "$stage/peers/"
fi
for lib in libspdlog libfmt libpcre2-8 libutf8proc libcpp-httplib libhiredis libcudart; do
  path=$(ldd "$build/peregrine" | awk -v l="$lib" '$1 ~ "^"l"\\.so" {print $3; exit}')
  [[ -n $path ]] && cp -L "$path" "$stage/lib/"
done
tar -C "$stage" -cf - . | xz -T1 --lzma2=preset=6,dict=256MiB >"$here/out/gpu/bundle.tar.xz"
echo "out/gpu/bundle.tar.xz: $(du -h "$here/out/gpu/bundle.tar.xz" | cut -f1) ($(ls "$stage" | wc -l) entries)"
