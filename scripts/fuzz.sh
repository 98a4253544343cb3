#!/usr/bin/env bash
# `make fuzz`: builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan) in FUZZ_BUILD and runs each
# for FUZZ_SECONDS on its seed corpus. New inputs go to FUZZ_BUILD/corpus/<target> (the seeds in the repo stay
# as they are), findings to FUZZ_BUILD/findings/, logs to FUZZ_BUILD/logs/. FUZZ_TARGETS picks targets
# (default: all). Exits non-zero when a target found something.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${FUZZ_BUILD:-build-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-60}
JOBS=${JOBS:-$(nproc)}
targets=${FUZZ_TARGETS:-$(cd tests/fuzz && ls fuzz_*.cpp | sed 's/^fuzz_//; s/\.cpp$//')}

cmake -S . -B "$B" -G Ninja -DPEREGRINE_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
for t in $targets; do exes+=("fuzz_$t"); done
cmake --build "$B" -j "$JOBS" --target "${exes[@]}"

mkdir -p "$B/findings" "$B/logs"
export PEREGRINE_GRAMMAR_THREADS=1
failed=0
printf '%-18s %12s %8s  %s\n' target executions exec/s result
for t in $targets; do
  mkdir -p "$B/corpus/$t"
  log="$B/logs/$t.log"
  # -timeout: an input that takes longer is a hang; -max_len keeps mutations small (seeds may be larger).
  if "$B/tests/fuzz/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=25 -rss_limit_mb=4096 -max_len=16384 \
       -print_final_stats=1 -artifact_prefix="$B/findings/$t-" "$B/corpus/$t" "tests/fuzz/corpus/$t" \
       >"$log" 2>&1; then
    result=ok
  else
    what=$(grep -m1 -oE '(ERROR|WARNING): [A-Za-z]+[^ ]*: [^(]*|deadly signal|timeout|out-of-memory' "$log" || true)
    result="FINDING: ${what:-see $log} $(ls -t "$B/findings/$t"-* 2>/dev/null | head -1)"
    failed=1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  printf '%-18s %12s %8s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$result"
done
exit $failed
