#!/usr/bin/env bash
# examples/edge: a real federation on this machine with one command: one root, two edge
# aggregators and ten clients training the CNN on Fashion-MNIST with top-k compression and
# CurveZMQ on, all on 127.0.0.1. Every process reads examples/edge/federation.toml, the file
# starling-sim runs as it is; the command lines add only what is each process's own. Prints the
# root's per-round accuracy and stops everything it started, by pid.
#
#   examples/edge/run.sh [BUILD_DIR] [CONFIG]
#     BUILD_DIR  default build (`make build` first, or it builds)
#     CONFIG     default examples/edge/federation.toml: any configuration of ten clients
#                (data.num_clients = 10) and the aggregator ids 100 and 101
#   STARLING_EDGE_TIMEOUT  seconds the root may take (default 1800)
#   STARLING_EDGE_PYTHON   client ids that run as Python clients training the CNN in PyTorch
#                          (examples/python/torch_client.py with the starling package of BUILD_DIR;
#                          Debian's python3-torch), e.g. "3 7"; default none
#
# Keys, logs, the checkpoint and the metrics go to a fresh folder under /tmp (printed at the
# start; kept for reading afterwards). docs/deployment.md explains each step.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${1:-$repo/build}
config=${2:-$here/federation.toml}
timeout=${STARLING_EDGE_TIMEOUT:-1800}
bin=$build/bin
if [[ ! -x $bin/starling-server || ! -x $bin/starling-client || ! -x $bin/starling-keygen ]]; then
  (cd "$repo" && make build)
fi
work=$(mktemp -d /tmp/starling-edge.XXXXXX)
echo "examples/edge: working folder $work"

pids=()
declare -A names  # pid -> the process's name (its log is $work/NAME.log)
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  # STARLING_EDGE_CLEAN=1 removes the working folder too (for scripted runs).
  if [[ ${STARLING_EDGE_CLEAN:-0} == 1 ]]; then rm -rf "$work"; fi
}
trap cleanup EXIT INT TERM

# Each server binds a port the kernel picks (tcp://127.0.0.1:*) and logs it: wait for that line.
bound_port() {
  local log=$1 line
  for _ in $(seq 300); do
    line=$(grep -m1 -o 'listening on tcp://127.0.0.1:[0-9]*' "$log" 2>/dev/null || true)
    if [[ -n $line ]]; then echo "${line##*:}"; return 0; fi
    sleep 0.1
  done
  echo "examples/edge: no 'listening on' line in $log:" >&2; cat "$log" >&2; return 1
}

# 1. Keys: the root's pair, one pair per aggregator (id 100, 101), ten client pairs (ids 0-9).
#    Each server admits only the keys in its allow-list folder.
keys=$work/keys
"$bin/starling-keygen" --out "$keys" --server >/dev/null
"$bin/starling-keygen" --out "$keys" --name agg-100 --id 100 >/dev/null
"$bin/starling-keygen" --out "$keys" --name agg-101 --id 101 >/dev/null
"$bin/starling-keygen" --out "$keys" --clients 10 --first-id 0 >/dev/null
mkdir -p "$work/allow-root" "$work/allow-100" "$work/allow-101"
cp "$keys"/agg-10{0,1}.key "$work/allow-root/"
for c in 0 1 2 3 4; do cp "$keys/client-$c.key" "$work/allow-100/"; done
for c in 5 6 7 8 9; do cp "$keys/client-$c.key" "$work/allow-101/"; done

# 2. The root.
"$bin/starling-server" --config "$config" --server.bind "tcp://127.0.0.1:*" \
  --security.key "$keys/server.key_secret" --security.clients "$work/allow-root" \
  --state.checkpoint "$work/root.ckpt" --state.metrics "$work/metrics.jsonl" >"$work/root.log" 2>&1 &
root_pid=$!
pids+=("$root_pid")
names[$root_pid]=root
root_port=$(bound_port "$work/root.log")

# 3. Two aggregators: servers to their clients, clients of the root.
for a in 100 101; do
  "$bin/starling-server" --config "$config" --server.role aggregator --server.id $a \
    --server.bind "tcp://127.0.0.1:*" \
    --server.upstream "tcp://127.0.0.1:$root_port" --security.key "$keys/agg-$a.key_secret" \
    --security.server_key "$keys/server.key" --security.clients "$work/allow-$a" >"$work/agg-$a.log" 2>&1 &
  pids+=("$!")
  names[$!]=agg-$a
done
p100=$(bound_port "$work/agg-100.log")
p101=$(bound_port "$work/agg-101.log")

# 4. Ten clients, five under each aggregator, each keeping its error-feedback state on disk; the
#    ids in STARLING_EDGE_PYTHON are Python clients (PyTorch), the others C++ starling-client.
python_ids=" ${STARLING_EDGE_PYTHON:-} "
for c in 0 1 2 3 4 5 6 7 8 9; do
  a=100; p=$p100; if (( c >= 5 )); then a=101; p=$p101; fi
  if [[ $python_ids == *" $c "* ]]; then
    PYTHONPATH="$build/python" /usr/bin/python3 "$repo/examples/python/torch_client.py" --config "$config" \
      --client-id $c --server "tcp://127.0.0.1:$p" --key "$keys/client-$c.key_secret" \
      --server-key "$keys/agg-$a.key" --state-file "$work/client-$c.state" >"$work/client-$c.log" 2>&1 &
  else
    "$bin/starling-client" --config "$config" --client.id $c --client.server "tcp://127.0.0.1:$p" \
      --security.key "$keys/client-$c.key_secret" --security.server_key "$keys/agg-$a.key" \
      --state.file "$work/client-$c.state" >"$work/client-$c.log" 2>&1 &
  fi
  pids+=("$!")
  names[$!]=client-$c
done

# 5. Follow the root's rounds until it finishes (bounded: STARLING_EDGE_TIMEOUT seconds).
echo "examples/edge: root on port $root_port, aggregators on $p100 and $p101, ten clients; CURVE on"
tail -n +1 -f "$work/root.log" --pid "$root_pid" | grep --line-buffered -E 'round|registered|finished|error' &
tailer=$!
# Every other process is watched too: one that ends before the root (a Python client that died at
# import, a key the server refused) stops the run with the tail of its log, instead of the root
# waiting out its timeout for a client that is gone.
for _ in $(seq "$timeout"); do
  kill -0 "$root_pid" 2>/dev/null || break
  grep -q 'federation finished' "$work/root.log" && { sleep 1; continue; }  # they end with it now
  for p in "${pids[@]}"; do
    [[ $p == "$root_pid" ]] && continue
    if ! kill -0 "$p" 2>/dev/null && kill -0 "$root_pid" 2>/dev/null; then
      prc=0; wait "$p" 2>/dev/null || prc=$?
      echo "examples/edge: ${names[$p]} ended (exit $prc) before the root; its log's last lines:" >&2
      tail -n 20 "$work/${names[$p]}.log" >&2
      exit 1
    fi
  done
  sleep 1
done
if kill -0 "$root_pid" 2>/dev/null; then
  echo "examples/edge: the root did not finish in $timeout s; stopping" >&2
  exit 1
fi
wait "$root_pid"; rc=$?
wait "$tailer" 2>/dev/null || true
echo "examples/edge: done (root exit $rc); per-round metrics: $work/metrics.jsonl"
exit $rc
