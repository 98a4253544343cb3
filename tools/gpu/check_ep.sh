#!/usr/bin/env bash
# Expert parallelism on N GPUs of one host (docs/parallel.md): the NCCL ranks against one GPU model
# (test_cuda_expert_parallel), `serve --device cuda --dp N --ep N` against greedy ids on the CPU, then
# `bench engine --ep N` at V4.1-Flash dimensions (batches and prefill tokens per GPU).
#
#   tools/gpu/check_ep.sh [BIN_DIR] [OUT_DIR]      (N = EP_RANKS, default: every visible GPU)
#
# BIN_DIR as for check.sh (peregrine, test_cuda_*, optional lib/); libnccl.so.2 is found on the machine.
set -uo pipefail
here=${PEREGRINE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${1:-$here/build}
out=${2:-${OUT:-/tmp/peregrine-check-ep}}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0  # no NVLink multicast
nccl=$(find / -name "libnccl.so.2" -not -path "/proc/*" 2>/dev/null | head -1)
[[ -d $bin/lib ]] && export LD_LIBRARY_PATH=$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64${nccl:+:$(dirname "$nccl")}
export PEREGRINE_TEST_DATA_DIR=$here/tests/fixtures
test_bin=$bin/test_cuda_expert_parallel
[[ -x $test_bin ]] || test_bin=$bin/tests/ops/test_cuda_expert_parallel
n=${EP_RANKS:-$(nvidia-smi -L | wc -l)}
echo "== $n GPUs, NCCL at ${nccl:-(not found)}"
"$test_bin" --gtest_color=no 2>&1 | tee "$out/ep_tests.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED)|^PARITY|Failure"
tests_rc=${PIPESTATUS[0]}

echo "== serve --device cuda --dp $n --ep $n (demo model) vs generate --device cpu"
"$bin/peregrine" serve --device cuda --dp "$n" --ep "$n" --port 30124 --host 127.0.0.1 >"$out/serve_ep.log" 2>&1 &
pid=$!
for _ in $(seq 1 240); do curl -sf http://127.0.0.1:30124/health >/dev/null 2>&1 && break; sleep 0.5; done
serve=same
for ids in 0,849,271 0,1000,42,7 0,5,6,7,8,9; do
  a=$(curl -s http://127.0.0.1:30124/generate -H 'Content-Type: application/json' \
    -d "{\"input_ids\":[$ids],\"sampling_params\":{\"temperature\":0,\"max_new_tokens\":16,\"ignore_eos\":true}}" |
    python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["output_ids"])))' 2>&1)
  b=$("$bin/peregrine" generate --ids "$ids" --max-tokens 16 --temperature 0 --ignore-eos --print-ids --device cpu 2>&1 |
    tr -s ' \n' ',' | sed 's/^,//; s/,$//')
  [[ -n $a && "$a" == "$b" ]] || serve=DIFFERENT
  echo "[$ids] serve: $a | cpu: $b"
done
kill $pid 2>/dev/null; wait $pid 2>/dev/null

echo "== bench engine --ep $n"
"$bin/peregrine" bench engine --device cuda --synthetic v41-flash --balanced-routing --ep "$n" \
  ${EP_BENCH_ARGS:---layers 4 --decode-batches 8,32,128 --contexts 8192 --prefill-tokens 4096,16384 --prefill-context 16384 --steps 3} \
  --json "$out/bench_ep.json" 2>&1 | tee "$out/bench_ep.log"
bench_rc=${PIPESTATUS[0]}
printf '%-28s %s\n' "gtest exit code" "$tests_rc" "serve dp/ep cuda vs cpu" "$serve" "bench --ep" "$bench_rc"
[[ $tests_rc == 0 && $serve == same && $bench_rc == 0 ]]
