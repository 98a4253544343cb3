#!/usr/bin/env bash
# On the GPU machine: `bench serve` at SGLang's cookbook shape (8K in / 1K out) over a list of concurrencies against
# one `serve --device cuda --synthetic v41-flash` (one GPU's slice of the full-depth model): output tok/s, TTFT,
# TPOT per concurrency, each from its own JSON. Run after tools/gpu/unpack.sh. Everything goes to OUT_DIR.
#
#   tools/gpu/serve_grid.sh BIN_DIR OUT_DIR [LAYERS] [EXPERTS] [CONCURRENCIES] [SERVE_ARGS...]
set -uo pipefail
bin=$1
out=$2
layers=${3:-40}
experts=${4:-96}
concs=${5:-1,16}
mkdir -p "$out"
export LD_LIBRARY_PATH=$bin/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
source "$(dirname "$0")/serve_lib.sh"
start_serve "$out" 30125 --device cuda --synthetic v41-flash --synthetic-layers "$layers" \
  --synthetic-experts "$experts" --max-running-requests 256 "${@:6}" || exit 1
tr '\r' '\n' <"$out/serve.err" | grep -E "gpu memory|\] [0-9]/[0-9] .* s$"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader | sed 's/^/nvidia-smi: /'
for c in ${concs//,/ }; do
  n=$((c < 2 ? 2 : c))
  timeout 560 "$bin/peregrine" bench serve --url http://127.0.0.1:30125 --input-len 8192 --output-len 1024 \
    --range-ratio 1 --num-prompts "$n" --max-concurrency "$c" --output-file "$out/bench_8k1k_c$c.json" \
    >"$out/bench_8k1k_c$c.txt" 2>&1
  echo "== concurrency $c ($n prompts): exit $?"
  grep -E "throughput|TTFT|TPOT|ITL|Successful|Benchmark duration" "$out/bench_8k1k_c$c.txt" | head -14
done
stop_serve
