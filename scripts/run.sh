#!/usr/bin/env bash
# `make run`: start Peregrine's main job on the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-tests/fixtures/dsv41-tiny-a}
exec ./build/peregrine info --model "$MODEL"
