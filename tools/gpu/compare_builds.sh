#!/usr/bin/env bash
# Two builds of peregrine on the same inputs, byte for byte: the logits of every position (`forward`: one-shot
# prefill, prefill then decode, chunked prefill then decode) on the fixtures and the demo model, and greedy ids
# (`generate`). A refactoring that preserves behaviour leaves every file identical. Then both serve 12 concurrent
# requests, reported but not counted: which requests share a step depends on arrival timing, and the old build
# serving twice gives its own differences beside them (the noise floor).
#
#   tools/gpu/compare_builds.sh OLD_BIN NEW_BIN [DEVICE] [OUT_DIR]
#
# DEVICE: cpu (default) or cuda; the environment (PEREGRINE_CUDA_NUMERICS, ...) applies to both builds.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
old=$1 new=$2 device=${3:-cpu} out=${4:-/tmp/peregrine-compare}
mkdir -p "$out"
fx=$here/tests/fixtures
demo=$here/models/peregrine-demo-v4
demo_ids=$("$new" tokenize --model "$demo" --text "KING RICHARD III:
Now is the winter of our discontent
Made glorious summer by this sun of York;
And all the clouds that lour'd upon our house
In the deep bosom of the ocean buried." 2>/dev/null | tr -s ' \n' ',' | sed 's/^,//; s/,$//')
cases=(
  "v41-prefill|$fx/dsv41-tiny-a|ids-file=$fx/dsv41-tiny-a/cases/prefill.ids"
  "v41-decode|$fx/dsv41-tiny-a|ids-file=$fx/dsv41-tiny-a/cases/prefill.ids|--decode-from 20"
  "v41-chunked|$fx/dsv41-tiny-a|ids-file=$fx/dsv41-tiny-a/cases/prefill.ids|--prefill-chunk 7 --decode-from 33"
  "v4-prefill|$fx/dsv4-tiny-a|ids-file=$fx/dsv4-tiny-a/cases/prefill.ids"
  "v4-decode|$fx/dsv4-tiny-a|ids-file=$fx/dsv4-tiny-a/cases/prefill.ids|--decode-from 20"
  "v4-chunked|$fx/dsv4-tiny-a|ids-file=$fx/dsv4-tiny-a/cases/prefill.ids|--prefill-chunk 7 --decode-from 33"
  "demo-prefill|$demo|ids=$demo_ids"
  "demo-decode|$demo|ids=$demo_ids|--decode-from 9"
)
same=0 differ=0
for c in "${cases[@]}"; do
  IFS='|' read -r name model input extra <<<"$c"
  arg=(--${input%%=*} "${input#*=}")
  for b in old new; do
    bin=$old; [[ $b == new ]] && bin=$new
    "$bin" forward --model "$model" "${arg[@]}" $extra --device "$device" --out "$out/$name.$b.f32" >"$out/$name.$b.log" 2>&1 ||
      echo "$name: $b build failed (see $out/$name.$b.log)"
  done
  if cmp -s "$out/$name.old.f32" "$out/$name.new.f32"; then
    echo "same       $name ($(stat -c %s "$out/$name.new.f32") bytes of logits)"; same=$((same + 1))
  else
    echo "DIFFERENT  $name"; differ=$((differ + 1))
  fi
done
for b in old new; do
  bin=$old; [[ $b == new ]] && bin=$new
  "$bin" generate --model "$fx/dsv41-tiny-a" --ids 5,17,42,9,33 --max-tokens 32 --temperature 0 --ignore-eos --print-ids \
    --device "$device" >"$out/gen-v41.$b" 2>/dev/null
  "$bin" generate --model "$demo" --ids "$demo_ids" --max-tokens 48 --temperature 0 --ignore-eos --print-ids \
    --device "$device" >"$out/gen-demo.$b" 2>/dev/null
  "$bin" generate --model "$demo" --ids "$demo_ids" --max-tokens 48 --temperature 0.8 --top-p 0.95 --seed 7 \
    --print-ids --device "$device" >"$out/gen-demo-sampled.$b" 2>/dev/null
done
for g in gen-v41 gen-demo gen-demo-sampled; do
  if [[ -s $out/$g.new ]] && cmp -s "$out/$g.old" "$out/$g.new"; then
    echo "same       $g ($(tr "," " " <"$out/$g.new" | wc -w) ids)"; same=$((same + 1))
  else
    echo "DIFFERENT  $g"; differ=$((differ + 1))
  fi
done
# The serving engine: each build serves the demo model; 12 concurrent /generate requests (greedy and seeded, three
# sharing a prefix, one with a stop string and one under a repetition penalty), answers compared.
serve_case() {  # $1 build, $2 port, $3 output dir
  "$1" serve --device "$device" --port "$2" --host 127.0.0.1 --max-running-requests 8 --chunked-prefill-size 64 ${SERVE_EXTRA:-} \
    >"$3.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$2/health" >/dev/null 2>&1 && break; sleep 0.5; done
  mkdir -p "$3"
  local pids=()
  for i in $(seq 0 11); do
    local extra=""
    ((i % 3 == 1)) && extra=',"temperature":0.9,"top_p":0.95,"seed":'$((100 + i))
    ((i == 5)) && extra=$extra',"stop":["the"]'
    ((i == 7)) && extra=$extra',"repetition_penalty":1.3'
    local text="ROMEO: speak again, $((i % 4)) bright angel"
    ((i < 3)) && text="KING RICHARD III: now is the winter of our discontent, $i"
    curl -s "http://127.0.0.1:$2/generate" -H 'Content-Type: application/json' \
      -d '{"text":"'"$text"'","sampling_params":{"temperature":0,"max_new_tokens":'$((16 + 4 * i))$extra'}}' \
      >"$3/$i.json" &
    pids+=($!)
  done
  wait "${pids[@]}"
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
}
serve_case "$old" 30171 "$out/serve.old"
serve_case "$new" 30172 "$out/serve.new"
serve_case "$old" 30173 "$out/serve.old2"
answer() {  # what a request produced (its ids, text and finish reason; not its timings or cache hits)
  python3 -c 'import json, sys; a = json.load(open(sys.argv[1])); print(a["output_ids"], repr(a["text"]), a["meta_info"]["finish_reason"])' "$1" 2>/dev/null
}
serve_new=0 serve_old=0 serve_failed=0
for i in $(seq 0 11); do
  [[ -z $(answer "$out/serve.new/$i.json") ]] && { echo "FAILED     serve request $i (new build)"; serve_failed=$((serve_failed + 1)); }
  [[ "$(answer "$out/serve.old/$i.json")" == "$(answer "$out/serve.new/$i.json")" ]] || serve_new=$((serve_new + 1))
  [[ "$(answer "$out/serve.old/$i.json")" == "$(answer "$out/serve.old2/$i.json")" ]] || serve_old=$((serve_old + 1))
done
echo "serve: 12 concurrent requests; new differs from old in $serve_new, old from itself in $serve_old (not counted)"
differ=$((differ + serve_failed))
echo "compare_builds ($device): $same same, $differ different"
[[ $differ == 0 ]]
