#!/usr/bin/env bash
# Trains the V4.1 demo model (models/peregrine-demo-v41) on one H200 and writes into $OUT:
# model.safetensors config.json tokenizer.json generation_config.json engram_tables.json metrics.json demo_greedy.json
# demo_heldout.json train.log (9 files). Needs python3 with torch, tokenizers, safetensors, numpy; installs nothing.
# Two phases inside MINUTES: the target (70%), then the DSpark head on the frozen target (30%); then the export, the
# fp32 evaluation of the exported checkpoint and the DSpark acceptance measurement (about 1.5 min more).
# Usage (device, repo root): OUT=$OUT bash tools/gpu/train_demo_v41.sh        [MINUTES=6 training budget; ~8 min in all]
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
MINUTES=${MINUTES:-6}
mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 -c "import torch, tokenizers, safetensors, numpy; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'tokenizers', tokenizers.__version__, 'safetensors', safetensors.__version__, 'numpy', numpy.__version__)"
python3 tools/train_demo.py --arch v41 --out "$OUT" --device cuda --minutes "$MINUTES" --data tools/data/tinyshakespeare.txt \
    --tokenizer-file models/peregrine-demo-v4/tokenizer.json --batch 32 --dspark-anchors 192 --spec-prompts 8 --spec-tokens 64
echo "---- summary ($(( $(date +%s) - start ))s)" | tee -a "$OUT/train.log"
python3 - "$OUT" <<'PY' | tee -a "$OUT/train.log"
import json, sys
m = json.load(open(f"{sys.argv[1]}/metrics.json"))
print(f"params {m['params']/1e6:.2f}M ({m['dspark_params']/1e6:.2f}M DSpark), model.safetensors {m['model_safetensors_bytes']/1e6:.2f} MB, "
      f"target {m['steps']} steps (best {m['best_step']}, {m['epochs']} epochs) in {m['train_seconds']}s, "
      f"DSpark {m['dspark_steps']} steps in {m['dspark_seconds']}s")
tp, ex, ds = m["train_precision"], m["exported_fp32"], m["dspark"]
print(f"training precision: train {tp['train_loss']}, held-out {tp['heldout_loss']} (ppl {tp['heldout_ppl']})")
print(f"exported checkpoint (fp32): held-out {ex['heldout_loss']} (ppl {ex['heldout_ppl']})")
print(f"DSpark: {ds['mean_accepted_per_verify_step']} accepted drafts per verify step ({ds['verify_steps']} steps), "
      f"by position {ds['accept_rate_by_position']}, conditional {ds['conditional_accept_rate_by_position']}")
for c in json.load(open(f"{sys.argv[1]}/demo_greedy.json"))["cases"]:
    print(repr(c["prompt"] + c["text"]))
PY
ls -la "$OUT"
