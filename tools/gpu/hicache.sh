#!/usr/bin/env bash
# On the GPU machine: the hierarchical cache on `serve --device cuda --synthetic v41-flash` with a small device
# state pool (--kv-memory), so that eviction is real: TTFT of a re-sent long prompt cold, from the device, from
# host memory and from the file store (tools/gpu/prefix_ttft.py --tiers), for each write policy; then a
# shared-prefix workload (bench serve generated-shared-prefix) with and without the hierarchical cache. Run after
# tools/gpu/unpack.sh; everything goes to OUT_DIR.
#
#   tools/gpu/hicache.sh BIN_DIR OUT_DIR [LAYERS] [TOKENS] [KV_MEMORY] [EXPERTS] [PARTS]
#
# PARTS: any of ttft (both write policies and none), gsp (the shared-prefix workload), pcie (pinned copy GB/s with
# torch, the limit a host hit's copies run against); default all. POLICIES (env): the write policies to time.
set -uo pipefail
bin=$1
out=$2
layers=${3:-4}
tokens=${4:-32768}
kv=${5:-128M}
experts=${6:-0}
parts=${7:-ttft gsp pcie}
expert_args=()
((experts > 0)) && expert_args=(--synthetic-experts "$experts")
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export LD_LIBRARY_PATH=$bin/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
port=30125

serve() {  # name, extra args...
  local name=$1
  shift
  "$bin/peregrine" serve --device cuda --synthetic v41-flash --synthetic-layers "$layers" \
    "${expert_args[@]}" --kv-memory "$kv" \
    --context-length 140000 --chunked-prefill-size 8192 --max-running-requests 16 --port $port "$@" \
    >"$out/serve-$name.out" 2>"$out/serve-$name.err" &
  pid=$!
  until grep -q listening "$out/serve-$name.out" 2>/dev/null; do
    kill -0 $pid 2>/dev/null || { echo "serve $name died"; tail -5 "$out/serve-$name.err"; return 1; }
    sleep 0.2
  done
  tr '\r' '\n' <"$out/serve-$name.err" | grep -E "kv memory|hicache" | sed 's/^/  /'
}
stop() { kill $pid; wait $pid 2>/dev/null; }

if [[ $parts == *pcie* ]]; then
  echo "== pinned host <-> device copy bandwidth (torch, 1 GiB)"
  python3 - <<'PY'
import time, torch
n = 1 << 30
h = torch.empty(n, dtype=torch.uint8).pin_memory()
d = torch.empty(n, dtype=torch.uint8, device="cuda")
for name, f in (("host to device", lambda: d.copy_(h, non_blocking=True)),
                ("device to host", lambda: h.copy_(d, non_blocking=True))):
    f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5):
        f()
    torch.cuda.synchronize()
    print(f"  {name}: {5 * n / (time.perf_counter() - t) / 1e9:.1f} GB/s")
PY
fi
[[ $parts == *ttft* ]] && for policy in ${POLICIES:-write_through write_back}; do
  rm -rf /tmp/peregrine-kv && mkdir -p /tmp/peregrine-kv
  echo "== prefix TTFT, hierarchical cache ($policy, file store)"
  serve "ttft-$policy" --enable-hierarchical-cache --hicache-ratio 8 --hicache-write-policy $policy \
    --hicache-storage-backend file --hicache-storage-dir /tmp/peregrine-kv || continue
  python3 "$here/prefix_ttft.py" --url http://127.0.0.1:$port --tokens "$tokens" --tiers \
    --json "$out/prefix-ttft-$policy.json"
  du -sh /tmp/peregrine-kv
  stop
done
if [[ $parts == *ttft* && -z ${POLICIES:-} ]]; then
  echo "== prefix TTFT, no hierarchical cache"
  serve ttft-off && python3 "$here/prefix_ttft.py" --url http://127.0.0.1:$port --tokens "$tokens" \
    --json "$out/prefix-ttft-off.json" && stop
fi

[[ $parts == *gsp* ]] && for mode in off on; do
  echo "== shared-prefix workload, hierarchical cache $mode"
  args=()
  [[ $mode == on ]] && args=(--enable-hierarchical-cache --hicache-ratio 8)
  serve "gsp-$mode" "${args[@]}" || continue
  "$bin/peregrine" bench serve --url http://127.0.0.1:$port --dataset-name generated-shared-prefix \
    --gsp-num-groups 32 --gsp-prompts-per-group 8 --gsp-system-prompt-len 8192 --gsp-question-len 256 \
    --gsp-output-len 64 --max-concurrency 16 --output-file "$out/gsp-$mode.json" |
    grep -E "hit|storage|TTFT|throughput|duration"
  stop
done
rm -rf /tmp/peregrine-kv
