#!/usr/bin/env bash
# One run on a GPU machine: CUDA-vs-CPU parity on the fixtures (op by op and end to end), a CLI smoke run
# with --device cuda, then the engine benchmark when the binary has it; prints a summary table last.
#
#   tools/gpu/check.sh [BIN_DIR] [OUT_DIR]
#
# BIN_DIR holds peregrine and test_cuda_backend built on the CPU machine (default: build/, or build/tests/ops
# for the test), and optionally lib/ with shared libraries the GPU image lacks (spdlog, fmt, ...).
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
test_bin=$bin/test_cuda_backend
[[ -x $test_bin ]] || test_bin=$bin/tests/ops/test_cuda_backend

say "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$log"
say "== commit ${PEREGRINE_COMMIT:-$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)}, $(date -u +%FT%TZ)"

say "== parity: $test_bin"
export PEREGRINE_TEST_DATA_DIR=$here/tests/fixtures
( cd "$here" && timeout "${PARITY_TIMEOUT:-1800}" "$test_bin" --gtest_color=no 2>&1 ) | tee "$out/parity.log" >>"$log"
parity_rc=${PIPESTATUS[0]}
# The fast kernels against the exact ones at V4.1-Flash sizes (with device times).
fast_bin=${test_bin%/*}/test_cuda_attn_fast
if [[ -x $fast_bin ]]; then
  say "== fast kernels: $fast_bin"
  ( cd "$here" && timeout "${PARITY_TIMEOUT:-1800}" "$fast_bin" --gtest_color=no 2>&1 ) | tee -a "$out/parity.log" >>"$log"
  [[ ${PIPESTATUS[0]} == 0 ]] || parity_rc=1
fi

say "== CLI: peregrine generate --device cuda (greedy, tiny fixture) vs --device cpu"
gen() { "$bin/peregrine" generate --model "$here/tests/fixtures/dsv41-tiny-a" --ids 5,17,42,9,33 --max-tokens 24 --temperature 0 --ignore-eos --print-ids --device "$1" 2>&1; }
g_cuda=$(gen cuda); g_cpu=$(gen cpu)
echo "cuda: $g_cuda" >>"$log"; echo "cpu:  $g_cpu" >>"$log"
[[ "$g_cuda" == "$g_cpu" ]] && cli=same || cli=DIFFERENT

bench_rc=skipped
# BENCH_ARGS overrides the benchmark grid (default: the full one of docs/perf); BENCH_TIMEOUT bounds it.
if "$bin/peregrine" bench engine --help >/dev/null 2>&1; then
  say "== bench engine"
  timeout "${BENCH_TIMEOUT:-3000}" "$bin/peregrine" bench engine --device cuda --synthetic v41-flash --balanced-routing \
    ${BENCH_ARGS:---layers 6} --json "$out/bench.json" 2>&1 | tee "$out/bench.log" >>"$log"
  bench_rc=${PIPESTATUS[0]}
fi

echo
echo "================ summary ================"
grep '^PARITY' "$out/parity.log" | sed 's/^PARITY //'
grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/parity.log"
[[ -f $out/bench.log ]] && tail -n 40 "$out/bench.log"
printf '%-28s %s\n' "gtest exit code" "$parity_rc" "CLI generate cuda vs cpu" "$cli" "bench" "$bench_rc"
[[ $parity_rc == 0 && $cli == same ]]
