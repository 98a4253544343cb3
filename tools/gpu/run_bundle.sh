#!/usr/bin/env bash
# On the GPU machine, one call: unpacks the bundle (tools/gpu/pack.sh), compares the build with the base build it
# carries byte for byte (compare_builds.sh, fast and exact numerics), runs tools/gpu/check.sh on it, and with
# BENCH_COMPARE set times the base and the new build's `bench engine` on the same grid, alternating (BENCH_ROUNDS
# rounds, default 2), so that a refactoring's figures sit beside the code it replaced. Everything goes to OUT_DIR.
#
#   tools/gpu/run_bundle.sh [OUT_DIR]
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-/tmp/peregrine-run}}
mkdir -p "$out"
"$here/tools/gpu/unpack.sh" || exit 1
bin=$here/out/gpu/bin
export LD_LIBRARY_PATH=$bin/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
summary=()
if [[ -x $bin/peregrine-base ]]; then
  for numerics in fast exact; do
    PEREGRINE_CUDA_NUMERICS=$numerics "$here/tools/gpu/compare_builds.sh" "$bin/peregrine-base" "$bin/peregrine" cuda \
      "$out/compare-$numerics" >"$out/compare-$numerics.log" 2>&1
    summary+=("$(tail -n 1 "$out/compare-$numerics.log") [$numerics]")
    # one file back instead of a hundred
    tar -czf "$out/compare-$numerics.tgz" -C "$out" "compare-$numerics" && rm -rf "$out/compare-$numerics"
  done
fi
if [[ ${CHECK:-1} != 0 ]]; then
  PEREGRINE_ROOT=$here "$here/tools/gpu/check.sh" "$bin" "$out/check" >"$out/check.log" 2>&1
  summary+=("check.sh exit $?")
fi
if [[ -n ${BENCH_COMPARE:-} && -x $bin/peregrine-base ]]; then
  for round in $(seq 1 "${BENCH_ROUNDS:-2}"); do
    for b in peregrine-base peregrine; do
      timeout "${BENCH_TIMEOUT:-600}" "$bin/$b" bench engine --device cuda --synthetic v41-flash --balanced-routing \
        $BENCH_COMPARE --json "$out/bench-$b-$round.json" >"$out/bench-$b-$round.log" 2>&1
      summary+=("bench $b round $round: exit $?")
    done
  done
fi
echo "================ run_bundle ================"
cat "$out"/compare-*.log 2>/dev/null | grep -E "DIFFERENT|FAILED|failed|^serve:" || true
[[ -f $out/check.log ]] && sed -n '/==== summary ====/,$p' "$out/check.log"
for s in "${summary[@]}"; do echo "$s"; done
