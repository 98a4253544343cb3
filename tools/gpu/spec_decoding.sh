#!/usr/bin/env bash
# Speculative decoding on the GPU machine, one run: the CUDA parity tests of verify steps and cuts (exact and fast
# numerics) and of the engine's verification; `bench engine` verify steps against decode steps on the synthetic
# V4.1-Flash model (40 layers, one GPU's EP4 slice of experts, its DSpark head; VERIFY_GRID=0 skips it); then the
# demo models (V4.1 drafting with DSpark, V4 with its MTP layer) served without speculation, with every draft verified
# and confidence-scheduled, on held-out prompts at concurrency 1/4/16/64 (bench/spec_decoding.py), checking that the
# greedy texts are the same in all three. DEMOS (default "v41:dspark v4:mtp") and LABELS pick the served runs;
# SERVE_LOGS=DIR keeps the servers' logs there (default OUT_DIR).
#
#   tools/gpu/spec_decoding.sh BIN_DIR OUT_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=$1 out=$2
mkdir -p "$out"
[[ -d $bin/lib ]] && export LD_LIBRARY_PATH=$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PEREGRINE_TEST_DATA_DIR=$here/tests/fixtures
source "$here/tools/gpu/serve_lib.sh"

for numerics in exact fast; do
  echo "== verify steps and cuts, $numerics numerics"
  PEREGRINE_CUDA_NUMERICS=$numerics "$bin/test_cuda_backend" --gtest_filter='*RejectedDrafts*' --gtest_color=no 2>&1 |
    grep -E "PARITY|FAILED|PASSED|OK \]|Failure|error" | tee -a "$out/tests.log"
done
echo "== drafting and engine verification on the device"
"$bin/test_cuda_backend" --gtest_filter='CudaDSpark*:CudaMtp*' --gtest_color=no 2>&1 |
  grep -E "PARITY|FAILED|PASSED|OK \]|Failure|error|Expected|Which" | tee -a "$out/tests.log"
"$bin/test_cuda_sampling" --gtest_filter='*Speculative*:*EngineDevicePath*' --gtest_color=no 2>&1 |
  grep -E "PARITY|FAILED|PASSED|OK \]|Failure|error|Expected|Which" | tee -a "$out/tests.log"

if [[ ${VERIFY_GRID:-1} != 0 ]]; then
  echo "== bench engine: verify steps vs decode steps"
  timeout "${BENCH_TIMEOUT:-240}" "$bin/peregrine" bench engine --layers "${LAYERS:-40}" --experts "${EXPERTS:-96}" \
    --balanced-routing --synthetic-dspark --decode-batches 1,4,16,64 --contexts 8192 --prefill-tokens '' \
    --verify-tokens 2,3,4,5,6 --steps 5 --json "$out/verify_steps.json" 2>&1 | grep -v "^    ops\|^    host" |
    tee "$out/verify_steps.txt"
fi

# Fast numerics (the default) and, for the greedy texts, exact numerics (logits independent of the step's shape).
for demo in ${DEMOS:-v41:dspark v4:mtp}; do
  name=${demo%%:*} algorithm=${demo#*:}
  for label in ${LABELS:-off fixed confidence exact-off exact-fixed}; do
    echo "== demo $name, speculation $label"
    args=(--model "$here/models/peregrine-demo-$name" --device cuda --host 127.0.0.1)
    [[ ${label#exact-} != off ]] && args+=(--speculative-algorithm "$algorithm" --speculative-schedule "${label#exact-}")
    numerics=fast conc=1,4,16,64
    [[ $label == exact-* ]] && numerics=exact conc=1,16
    logs=${SERVE_LOGS:-$out}/$name-$label
    mkdir -p "$logs"
    PEREGRINE_CUDA_NUMERICS=$numerics start_serve "$logs" 30170 "${args[@]}" || continue
    python3 "$here/bench/spec_decoding.py" --url http://127.0.0.1:30170 --label "$label" --concurrency "$conc" \
      --out "$out/demo_${name}_$label.json"
    stop_serve
  done
done
python3 - "$out" ${DEMOS:-v41:dspark v4:mtp} <<'PY'
import json, os, sys
def load(name, l):
    path = f"{sys.argv[1]}/demo_{name}_{l}.json"
    return {r["concurrency"]: r["texts"] for r in json.load(open(path))} if os.path.exists(path) else {}
for name in (d.split(":")[0] for d in sys.argv[2:]):
    for base, l in (("off", "fixed"), ("off", "confidence"), ("exact-off", "exact-fixed"), ("off", "exact-off")):
        a, b = load(name, base), load(name, l)
        diff = {c: sum(x != y for x, y in zip(a[c], b[c])) for c in a if c in b}
        print(f"demo {name}: greedy texts, {l} against {base}: prompts that differ by concurrency {diff}")
PY
