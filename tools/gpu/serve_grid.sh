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
t0=$(date +%s.%N)
"$bin/peregrine" serve --device cuda --synthetic v41-flash --synthetic-layers "$layers" --synthetic-experts "$experts" \
  --port 30125 --max-running-requests 256 "${@:6}" >"$out/serve.out" 2>"$out/serve.err" &
pid=$!
until grep -q listening "$out/serve.out" 2>/dev/null; do
  kill -0 $pid 2>/dev/null || { echo "serve died"; tail -5 "$out/serve.err"; exit 1; }
  sleep 0.5
done
echo "ready after $(python3 -c "import sys; print(round(float(sys.argv[1]) - float(sys.argv[2]), 1))" "$(date +%s.%N)" "$t0") s"
tr '\r' '\n' <"$out/serve.err" | grep -E "gpu memory|\] [0-9]/[0-9] .* s$"
for c in ${concs//,/ }; do
  n=$((c < 2 ? 2 : c))
  timeout 560 "$bin/peregrine" bench serve --url http://127.0.0.1:30125 --input-len 8192 --output-len 1024 \
    --range-ratio 1 --num-prompts "$n" --max-concurrency "$c" --output-file "$out/bench_8k1k_c$c.json" \
    >"$out/bench_8k1k_c$c.txt" 2>&1
  echo "== concurrency $c ($n prompts): exit $?"
  grep -E "throughput|TTFT|TPOT|ITL|Successful|Benchmark duration" "$out/bench_8k1k_c$c.txt" | head -14
done
kill $pid
wait $pid 2>/dev/null
