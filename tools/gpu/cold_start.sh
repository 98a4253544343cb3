#!/usr/bin/env bash
# On the GPU machine: cold start of `serve --device cuda --model DIR` on a synthetic checkpoint in the released
# format (peregrine synth-checkpoint): time to ready with the shards read from disk (the writer drops them from the
# page cache) and again from the page cache, the disk's sequential read bandwidth beside it, and the start-up
# stages. Run after tools/gpu/unpack.sh. Everything goes to OUT_DIR; the checkpoint is deleted at the end.
#
#   tools/gpu/cold_start.sh BIN_DIR OUT_DIR [LAYERS] [EXPERTS] [CKPT_DIR]
set -uo pipefail
bin=$1
out=$2
layers=${3:-16}
experts=${4:-96}
ckpt=${5:-/tmp/peregrine-ckpt}
mkdir -p "$out"
export LD_LIBRARY_PATH=$bin/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
now() { python3 -c 'import time; print(time.time())'; }
since() { python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$1"; }

rm -rf "$ckpt"
t=$(now)
"$bin/peregrine" synth-checkpoint --preset v41-flash --layers "$layers" --experts "$experts" --out "$ckpt" \
  >"$out/synth.log" 2>&1
echo "synth-checkpoint exit $? in $(since "$t") s: $(tail -1 "$out/synth.log")"
du -sh "$ckpt"
# The storage's sequential read bandwidth, on a shard the page cache does not hold.
shard=$(ls "$ckpt"/model-*.safetensors | head -1)
python3 - "$shard" <<'PY'
import os, sys, time
f = sys.argv[1]; fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
t = time.time(); n = 0
while True:
    b = os.read(fd, 64 << 20)
    if not b: break
    n += len(b)
print(f"disk read: {n / 1e9:.2f} GB in {time.time() - t:.1f} s = {n / 1e9 / (time.time() - t):.2f} GB/s")
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
PY
for run in disk cache; do
  t=$(now)
  "$bin/peregrine" serve --device cuda --model "$ckpt" --port 30124 >"$out/serve-$run.out" 2>"$out/serve-$run.err" &
  pid=$!
  until grep -q listening "$out/serve-$run.out" 2>/dev/null; do
    kill -0 $pid 2>/dev/null || { echo "serve died"; tail -5 "$out/serve-$run.err"; break; }
    sleep 0.2
  done
  echo "ready from the $run after $(since "$t") s"
  tr '\r' '\n' <"$out/serve-$run.err" | grep -E "gpu memory|loaded in|kv memory|\] [0-9]/[0-9] .* s$" | sed 's/^/  /'
  curl -s -m 60 localhost:30124/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt": "hello", "max_tokens": 4}' | head -c 200; echo
  kill $pid; wait $pid 2>/dev/null
done
rm -rf "$ckpt"
