#!/usr/bin/env bash
# On the GPU machine: the start-up memory plan of `serve --device cuda` (--mem-fraction-static), measured on the
# synthetic V4.1-Flash slice: time to ready, the plan it prints, the tokens of state it holds, a serving run at
# concurrency 64 with 8K prompts (TTFT), and the refusals (a fraction too small for the weights, a step too large
# for what is left). Run after tools/gpu/unpack.sh. Everything goes to OUT_DIR.
#
#   tools/gpu/memory_plan.sh BIN_DIR OUT_DIR [LAYERS] [EXPERTS]
set -uo pipefail
bin=$1
out=$2
layers=${3:-40}
experts=${4:-96}
mkdir -p "$out"
export LD_LIBRARY_PATH=$bin/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
model=(--device cuda --synthetic v41-flash --synthetic-layers "$layers" --synthetic-experts "$experts")

# Refusals first (they end before serving).
for args in "--mem-fraction-static 0.05" "--mem-fraction-static 0.99 --chunked-prefill-size 262144"; do
  timeout 300 "$bin/peregrine" serve "${model[@]}" $args --port 0 >"$out/refuse.out" 2>"$out/refuse.err"
  echo "refusal ($args): exit $? :: $(grep -m1 -iE 'error|does not fit|lower' "$out/refuse.err")"
done

source "$(dirname "$0")/serve_lib.sh"
start_serve "$out" 30123 "${model[@]}" --max-running-requests 64 "${@:5}" || exit 1
grep -E "kv memory|gpu memory|loaded in" "$out/serve.err"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader | sed 's/^/nvidia-smi: /'
curl -s localhost:30123/server_info >"$out/server_info.json"
timeout 400 "$bin/peregrine" bench serve --url http://127.0.0.1:30123 --input-len 8192 --output-len 32 \
  --range-ratio 1 --num-prompts 128 --max-concurrency 64 --output-file "$out/bench_8k_c64.json" \
  >"$out/bench_8k_c64.txt" 2>&1
echo "bench serve exit $?"
cat "$out/bench_8k_c64.txt"
curl -s localhost:30123/metrics | grep -E "^peregrine:(num_running_reqs|token_usage|num_used_tokens)" || true
stop_serve
