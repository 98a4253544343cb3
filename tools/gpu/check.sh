#!/usr/bin/env bash
# One run on a GPU machine: CUDA-vs-CPU parity on the fixtures (op by op and end to end), a CLI smoke run
# with --device cuda, then the engine benchmark when the binary has it; prints a summary table last.
#
#   tools/gpu/check.sh [BIN_DIR] [OUT_DIR]
#
# BIN_DIR holds peregrine and the test_cuda_* binaries built on the CPU machine (default: build/, or build/tests/ops
# for the test; bench_read_bandwidth beside them or under bench/ is run too), and optionally lib/ with shared
# libraries the GPU image lacks (spdlog, fmt, ...).
# Without prebuilt binaries it configures and builds with the system compilers (the GPU image's default
# CXX breaks libstdc++ ABI, see docs), which needs the Debian build dependencies there.
set -uo pipefail
here=${PEREGRINE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${1:-$here/build}
out=${2:-${OUT:-/tmp/peregrine-check}}
mkdir -p "$out"
log=$out/check.log
: >"$log"
say() { echo "$@" | tee -a "$log"; }

if [[ ! -x $bin/peregrine ]]; then
  say "== building in $here/build (system gcc)"
  CC=/usr/bin/gcc CXX=/usr/bin/g++ cmake -S "$here" -B "$here/build" -G Ninja >>"$log" 2>&1 &&
    cmake --build "$here/build" -j"$(nproc)" >>"$log" 2>&1 || { say "build failed (see $log)"; exit 1; }
  bin=$here/build
fi
[[ -d $bin/lib ]] && export LD_LIBRARY_PATH=$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# cuBLAS: the toolkit's, else the one PyTorch's wheels bring.
if ! ldconfig -p 2>/dev/null | grep -q libcublasLt.so.13 && [[ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]]; then
  cublas_dir=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null)
  [[ -n $cublas_dir ]] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$cublas_dir
fi
[[ -d /usr/local/cuda/lib64 ]] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
# Every GPU test binary: test_cuda_* beside the binary, else under tests/ops.
test_bins=$(ls "$bin"/test_cuda_* 2>/dev/null || ls "$bin"/tests/ops/test_cuda_* 2>/dev/null)

say "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$log"
say "== commit ${PEREGRINE_COMMIT:-$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)}, $(date -u +%FT%TZ)"

export PEREGRINE_TEST_DATA_DIR=$here/tests/fixtures
parity_rc=0
: >"$out/parity.log"
for test_bin in $test_bins; do
  say "== parity: $test_bin"
  ( cd "$here" && timeout "${PARITY_TIMEOUT:-1800}" "$test_bin" --gtest_color=no ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} 2>&1 ) |
    tee -a "$out/parity.log" >>"$log"
  rc=${PIPESTATUS[0]}
  [[ $rc == 0 ]] || parity_rc=$rc
done

say "== CLI: peregrine generate --device cuda (greedy, tiny fixture) vs --device cpu"
gen() { "$bin/peregrine" generate --model "$here/tests/fixtures/dsv41-tiny-a" --ids 5,17,42,9,33 --max-tokens 24 --temperature 0 --ignore-eos --print-ids --device "$1" 2>&1; }
g_cuda=$(gen cuda); g_cpu=$(gen cpu)
echo "cuda: $g_cuda" >>"$log"; echo "cpu:  $g_cpu" >>"$log"
[[ "$g_cuda" == "$g_cpu" ]] && cli=same || cli=DIFFERENT

say "== serve --device cuda: /generate (greedy, demo model) vs generate --device cpu"
serve_log=$out/serve.log
"$bin/peregrine" serve --device cuda --port 30123 --host 127.0.0.1 >"$serve_log" 2>&1 &
serve_pid=$!
for _ in $(seq 1 120); do curl -sf http://127.0.0.1:30123/health >/dev/null 2>&1 && break; sleep 0.5; done
s_cuda=$(curl -s http://127.0.0.1:30123/generate -H 'Content-Type: application/json' \
  -d '{"input_ids":[0,849,271],"sampling_params":{"temperature":0,"max_new_tokens":24,"ignore_eos":true}}' |
  python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["output_ids"])))' 2>&1)
kill $serve_pid 2>/dev/null; wait $serve_pid 2>/dev/null
s_cpu=$("$bin/peregrine" generate --ids 0,849,271 --max-tokens 24 --temperature 0 --ignore-eos --print-ids --device cpu 2>&1 |
  tr -s ' \n' ',' | sed 's/^,//; s/,$//')
echo "serve cuda: $s_cuda" >>"$log"; echo "cpu:        $s_cpu" >>"$log"
[[ -n $s_cuda && "$s_cuda" == "$s_cpu" ]] && serve=same || serve=DIFFERENT

bench_rc=skipped
# BENCH_ARGS overrides the benchmark grid (default: the full one of docs/perf); BENCH_TIMEOUT bounds it; BENCH=0
# skips it.
if [[ ${BENCH:-1} != 0 ]] && "$bin/peregrine" bench engine --help >/dev/null 2>&1; then
  say "== bench engine"
  timeout "${BENCH_TIMEOUT:-3000}" "$bin/peregrine" bench engine --device cuda --synthetic v41-flash --balanced-routing \
    ${BENCH_ARGS:---layers 6} --json "$out/bench.json" 2>&1 | tee "$out/bench.log" >>"$log"
  bench_rc=${PIPESTATUS[0]}
fi

# Serving at V4.1-Flash's dimensions (synthetic weights; SERVE_LAYERS, default 4): `bench serve` with the overlapped
# schedule and without (SERVE_BENCH=0 skips it).
serve_bench=()
if [[ ${SERVE_BENCH:-1} != 0 ]]; then
  say "== serve --synthetic v41-flash: bench serve, overlap on / off"
  for ov in on off; do
    flag=(); [[ $ov == off ]] && flag=(--disable-overlap-schedule)
    "$bin/peregrine" serve --device cuda --synthetic v41-flash --synthetic-layers "${SERVE_LAYERS:-4}" --port 30124 \
      --host 127.0.0.1 "${flag[@]}" >"$out/serve-synthetic-$ov.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do curl -sf http://127.0.0.1:30124/health >/dev/null 2>&1 && break; sleep 0.5; done
    timeout 600 "$bin/peregrine" bench serve --url http://127.0.0.1:30124 --dataset random --input-len 512 --output-len 128 \
      --num-prompts 64 --max-concurrency 16 --output-file "$out/bench-serve-$ov.json" >"$out/bench-serve-$ov.log" 2>&1
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    serve_bench+=("$(printf '%-28s %s' "bench serve (overlap $ov)" "$(grep -E 'Output token throughput|Median TPOT|Median TTFT' \
      "$out/bench-serve-$ov.log" | sed -E 's/ +/ /g; s/ \(ms\)//; s/ \(tok\/s\)//' | tr '\n' ';')")")
  done
fi

# Read-only streaming ceilings of this GPU by load scheme (bench/bench_read_bandwidth), when the binary is there.
rb=$(ls "$bin"/bench_read_bandwidth "$bin"/bench/bench_read_bandwidth 2>/dev/null | head -1)
if [[ -n $rb ]]; then
  say "== read bandwidth"
  timeout 120 "$rb" 2>&1 | tee "$out/read_bandwidth.log" >>"$log"
fi

echo
echo "================ summary ================"
grep '^PARITY' "$out/parity.log" | sed 's/^PARITY //'
grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/parity.log"
[[ -f $out/read_bandwidth.log ]] && cat "$out/read_bandwidth.log"
[[ -f $out/bench.log ]] && tail -n 40 "$out/bench.log"
printf '%-28s %s\n' "gtest exit code" "$parity_rc" "CLI generate cuda vs cpu" "$cli" "serve cuda vs generate cpu" "$serve" \
  "bench" "$bench_rc"
for l in "${serve_bench[@]}"; do echo "$l"; done
[[ $parity_rc == 0 && $cli == same && $serve == same ]]
