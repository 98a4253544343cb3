#!/usr/bin/env bash
# On the GPU machine: unpacks out/gpu/bundle.tar.xz (tools/gpu/pack.sh) into out/gpu/bin with Python's lzma (the
# image has no xz binary).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$here/out/gpu/bin"
python3 -c "import lzma, tarfile, sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" \
  "$here/out/gpu/bundle.tar.xz" "$here/out/gpu/bin"
echo "unpacked: $(ls "$here/out/gpu/bin" | tr '\n' ' ')"
