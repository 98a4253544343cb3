# Sourced by the GPU machine's serving scripts: start_serve OUT_DIR PORT SERVE_ARGS... runs `peregrine serve` in
# the background (stdout and stderr to OUT_DIR/serve.out and serve.err), waits until it listens and prints how long
# that took; its process id is left in $serve_pid. Needs $bin (the unpacked binaries).
start_serve() {
  local out=$1 port=$2
  shift 2
  local t0
  t0=$(date +%s.%N)
  "$bin/peregrine" serve --port "$port" "$@" >"$out/serve.out" 2>"$out/serve.err" &
  serve_pid=$!
  until grep -q listening "$out/serve.out" 2>/dev/null; do
    kill -0 "$serve_pid" 2>/dev/null || { echo "serve died"; tail -5 "$out/serve.err"; return 1; }
    sleep 0.5
  done
  echo "ready after $(python3 -c "import sys; print(round(float(sys.argv[1]) - float(sys.argv[2]), 1))" \
    "$(date +%s.%N)" "$t0") s"
}

stop_serve() {
  kill "$serve_pid"
  wait "$serve_pid" 2>/dev/null
}
