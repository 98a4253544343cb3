#!/usr/bin/env bash
# Trains the embedded demo model (models/peregrine-demo-v4) on one H200 and writes into $OUT:
# model.safetensors config.json tokenizer.json generation_config.json metrics.json demo_greedy.json
# demo_heldout.json train.log (8 files). Needs python3 with torch, tokenizers, safetensors; installs nothing.
# Also checks the engine-exact torch evaluation against the dsv4-tiny-a goldens on CUDA (appended to train.log).
# Usage (device, repo root): OUT=$OUT bash tools/gpu/train_demo.sh        [MINUTES=6 training budget; about 7.5 min in all]
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
MINUTES=${MINUTES:-6}
mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 -c "import torch, tokenizers, safetensors; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'tokenizers', tokenizers.__version__, 'safetensors', safetensors.__version__)"
python3 tools/train_demo.py --out "$OUT" --device cuda --minutes "$MINUTES" --data tools/data/tinyshakespeare.txt
python3 tools/check_demo_model_vs_fixture.py --device cuda 2>&1 | tee -a "$OUT/train.log" || true
echo "---- summary ($(( $(date +%s) - start ))s)" | tee -a "$OUT/train.log"
python3 - "$OUT" <<'PY' | tee -a "$OUT/train.log"
import json, sys
m = json.load(open(f"{sys.argv[1]}/metrics.json"))
print(f"params {m['params']/1e6:.2f}M, model.safetensors {m['model_safetensors_bytes']/1e6:.2f} MB, "
      f"{m['steps']} steps (best {m['best_step']}, {m['epochs']} epochs) in {m['train_seconds']}s")
tp, ex = m["train_precision"], m["engine_exact"]
print(f"training precision: train {tp['train_loss']}, held-out {tp['heldout_loss']} (ppl {tp['heldout_ppl']})")
print(f"engine-exact: held-out {ex['heldout_loss']} (ppl {ex['heldout_ppl']}), MTP acc {ex['mtp_top1_next_next']}")
for c in json.load(open(f"{sys.argv[1]}/demo_greedy.json"))["cases"]:
    print(repr(c["prompt"] + c["text"]))
PY
ls -la "$OUT"
