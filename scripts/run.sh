#!/usr/bin/env bash
# `make run`: start Peregrine's main job on the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-tests/fixtures/dsv41-tiny-a}
echo "peregrine generate on $MODEL (greedy):"
exec ./build/peregrine generate --model "$MODEL" --ids "$(cat "$MODEL/cases/prefill.ids")" --max-tokens 16 --temperature 0
