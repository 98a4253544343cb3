#!/usr/bin/env bash
# On the GPU machine: the start-up memory plan of `serve --device cuda --synthetic v41-flash` at several depths
# against what nvidia-smi shows once the server is ready: the plan's items (weights, graphs, state pages, context and
# reserves) and their sum beside nvidia-smi's memory.used. Run after tools/gpu/unpack.sh. Everything goes to OUT_DIR.
#
#   tools/gpu/plan_vs_smi.sh BIN_DIR OUT_DIR [DEPTHS] [EXPERTS] [SERVE_ARGS...]
set -uo pipefail
bin=$1
out=$2
depths=${3:-4,16,40}
experts=${4:-96}
mkdir -p "$out"
export LD_LIBRARY_PATH=$bin/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
source "$(dirname "$0")/serve_lib.sh"
for layers in ${depths//,/ }; do
  echo "== $layers layers x $experts experts"
  start_serve "$out" 30127 --device cuda --synthetic v41-flash --synthetic-layers "$layers" \
    --synthetic-experts "$experts" "${@:5}" || continue
  grep -E "gpu memory" "$out/serve.err"
  smi=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  curl -s localhost:30127/server_info >"$out/server_info_$layers.json"
  python3 - "$out/server_info_$layers.json" "$smi" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["memory_plan"]
smi = float(sys.argv[2]) * 2**20
g = lambda b: b / 2**30
items = p["weight_bytes"] + p["graph_bytes"] + p["state_allocated_bytes"] + p["pool_kept_bytes"]
print(f"plan: weights {g(p['weight_bytes']):.2f} + graphs {g(p['graph_bytes']):.2f} + state pages "
      f"{g(p['state_allocated_bytes']):.2f} + freed activations kept {g(p['pool_kept_bytes']):.2f} = {g(items):.2f} "
      f"GiB; with the CUDA context and libraries {g(p['in_use_bytes']):.2f} "
      f"GiB; nvidia-smi {g(smi):.2f} GiB: in use / nvidia-smi = {p['in_use_bytes'] / smi:.4f}, "
      f"items / nvidia-smi = {items / smi:.4f}")
PY
  stop_serve
done
