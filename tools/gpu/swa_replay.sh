#!/usr/bin/env bash
# On the GPU machine, one call: SWA bounded replay's CUDA-vs-CPU parity (exact and fast numerics), then whole
# prompts prefilled with and without decoder replay at full depth (bench engine --prompts) and the encoder
# replay's recompute (a window of tokens on a cached context) beside a whole prefix.
#
#   tools/gpu/swa_replay.sh [OUT_DIR] [LAYERS] [EXPERTS] [PROMPTS]
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-/tmp/peregrine-replay}}
layers=${2:-40}
experts=${3:-96}
prompts=${4:-8192,32768,131072}
mkdir -p "$out"
"$here/tools/gpu/unpack.sh" || exit 1
bin=$here/out/gpu/bin
export LD_LIBRARY_PATH=$bin/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PEREGRINE_TEST_DATA_DIR=$here/tests/fixtures
for numerics in exact fast; do
  echo "== parity ($numerics)"
  PEREGRINE_CUDA_NUMERICS=$numerics "$bin/test_cuda_backend" --gtest_color=no \
    --gtest_filter='*SwaBoundedReplay*:*MixedBatchAndPrefixResume*' 2>&1 | grep -E "PARITY|OK|FAILED|Failure|Skipped" |
    tee "$out/parity-$numerics.log"
done
"$bin/test_cuda_paged_tables" --gtest_color=no 2>&1 | tail -n 3 | tee "$out/paged-tables.log"
echo "== bench engine --layers $layers --experts $experts --prompts $prompts"
"$bin/peregrine" bench engine --layers "$layers" --experts "$experts" --decode-batches "" \
  --prefill-tokens 128,160 --prefill-context 32768 --steps 3 --prompts "$prompts" --prompt-chunk 8192 \
  --json "$out/swa-replay.json" 2>&1 | tee "$out/bench.log" | grep -v "^    ops"
