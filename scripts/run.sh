#!/usr/bin/env bash
# `make run`: serve the embedded default model (models/peregrine-demo-v4) on 127.0.0.1:8000.
set -euo pipefail
cd "$(dirname "$0")/.."
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
cat <<MSG
Peregrine is starting on http://$HOST:$PORT with the embedded demo model (a small DeepSeek-V4 trained on
Shakespeare). Once it reports it is listening, try:

  curl http://$HOST:$PORT/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "peregrine-demo-v4", "messages": [{"role": "user", "content": "ROMEO:"}], "max_tokens": 64}'

MSG
exec ./build/peregrine serve --host "$HOST" --port "$PORT" "$@"
