#!/usr/bin/env bash
# `make run`: start Peregrine's main job on the embedded default model (models/peregrine-demo-v4).
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPT=${PROMPT:-$'ROMEO:\n'}
echo "peregrine generate on the embedded demo model, prompt: ${PROMPT@Q}"
exec ./build/peregrine generate --prompt "$PROMPT" --add-bos --max-tokens 64 --temperature 0.8 --top-p 0.95 --seed 1
