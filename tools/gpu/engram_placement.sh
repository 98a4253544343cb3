#!/usr/bin/env bash
# On the GPU machine: decode (and one prefill) step times of the synthetic V4.1-Flash slice without engram, then with
# V4.1-Flash's engram layers (1 and 14, tables of the release's row count: one 101 GB table both read) in device
# memory and in pinned host memory (--engram-placement). Host memory in use is printed around each run. Run after
# tools/gpu/unpack.sh. Everything goes to OUT_DIR.
#
#   tools/gpu/engram_placement.sh BIN_DIR OUT_DIR [LAYERS] [EXPERTS] [BATCHES]
set -uo pipefail
bin=$1
out=$2
layers=${3:-15}
experts=${4:-32}
batches=${5:-1,8,32,64}
mkdir -p "$out"
export LD_LIBRARY_PATH=$bin/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
free -g | sed -n 2p | sed 's/^/host memory before: /'
for run in none device host; do
  args=()
  [ "$run" != none ] && args=(--synthetic-engram --engram-placement "$run")
  echo "== engram: $run"
  start=$(date +%s)
  timeout 200 "$bin/peregrine" bench engine --layers "$layers" --experts "$experts" --balanced-routing \
    --decode-batches "$batches" --contexts 8192 --prefill-tokens 4096 --prefill-context 8192 --steps 5 \
    --json "$out/engram_$run.json" "${args[@]}" >"$out/engram_$run.txt" 2>&1 &
  pid=$!
  peak=0
  while kill -0 $pid 2>/dev/null; do
    used=$(free -m | awk 'NR==2 {print $3}')
    [ "$used" -gt "$peak" ] && peak=$used
    sleep 1
  done
  wait $pid
  echo "exit $? after $(( $(date +%s) - start )) s; host memory in use at most $peak MiB"
  grep -E "^engram layers|synthetic weights in" "$out/engram_$run.txt"
  tail -3 "$out/engram_$run.txt"
done
python3 - "$out" <<'PY'
import json, os, sys
runs = {r: json.load(open(f"{sys.argv[1]}/engram_{r}.json")) for r in ("none", "device", "host")
        if os.path.exists(f"{sys.argv[1]}/engram_{r}.json")}
print(f"{'mode':8} {'tokens':>7} " + " ".join(f"{r + ' ms':>10} {r + ' engram':>14}" for r in runs))
size = lambda x: x.get("batch", x.get("new_tokens"))
keys = sorted({(x["mode"], size(x)) for j in runs.values() for x in j.get("results", []) if "ms_per_step" in x})
for mode, b in keys:
    cells = []
    for j in runs.values():
        x = next((x for x in j.get("results", []) if x["mode"] == mode and size(x) == b and "ms_per_step" in x), {})
        cells.append(f"{x.get('ms_per_step', float('nan')):10.3f} {x.get('ops_ms', {}).get('engram', 0):14.3f}")
    print(f"{mode:8} {b:7} " + " ".join(cells))
PY
