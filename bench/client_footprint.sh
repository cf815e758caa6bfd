#!/usr/bin/env bash
# The edge client's footprint (docs/performance.md, "Deployment"):
#   1. the stripped size of starling-client (x86-64 from BUILD_DIR; arm64 from ARM64_DIR when its
#      bin/starling-client exists; each stripped as a temporary copy, the binaries are untouched);
#   2. its peak RSS (VmHWM, from /usr/bin/time -v) during a real federation on loopback: BUILD_DIR's
#      starling-server (MODEL on Fashion-MNIST, 2 clients, ROUNDS rounds, insecure) and
#      two starling-client processes; with an arm64 client, one of the two runs under
#      `qemu-aarch64 -L /` (its figure includes the emulator's own memory).
# SHARDS (default 2): the clients are shards 0 and 1 of that many (--data.num_clients); each holds
# only its shard (and its share of the test set), so its memory follows 1 / SHARDS.
# MODEL (default softmax): the model spec of the server and the clients (cnn: the CNN).
# COMPRESSOR (default none: dense updates), PARTITION (default iid), EVAL_EVERY (default 0: no
# federated evaluation): the usual deployment is COMPRESSOR=topk:density=0.05
# PARTITION=dirichlet:alpha=0.5 EVAL_EVERY=1 (docs/deployment.md gives both figures).
# Usage: [SHARDS=N] [MODEL=SPEC] [COMPRESSOR=..] [PARTITION=..] [EVAL_EVERY=..]
#        bench/client_footprint.sh BUILD_DIR [ARM64_DIR] [ROUNDS]
# Prints one `key value` per line.
set -euo pipefail
build=${1:?usage: bench/client_footprint.sh BUILD_DIR [ARM64_DIR] [ROUNDS]}
arm=${2:-}
rounds=${3:-5}
shards=${SHARDS:-2}
model=${MODEL:-softmax}
compressor=${COMPRESSOR:-none}
partition=${PARTITION:-iid}
eval_every=${EVAL_EVERY:-0}
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

size() { stat -c %s "$1"; }
cp "$build/bin/starling-client" "$tmp/client-x86"
strip "$tmp/client-x86"
echo "x86_64_unstripped_bytes $(size "$build/bin/starling-client")"
echo "x86_64_stripped_bytes $(size "$tmp/client-x86")"
arm_client=""
if [[ -n $arm && -x $arm/bin/starling-client ]]; then
  arm_client=$arm/bin/starling-client
  cp "$arm_client" "$tmp/client-arm64"
  aarch64-linux-gnu-strip "$tmp/client-arm64"
  echo "arm64_unstripped_bytes $(size "$arm_client")"
  echo "arm64_stripped_bytes $(size "$tmp/client-arm64")"
fi

port=$((20000 + RANDOM % 20000))
ep=tcp://127.0.0.1:$port
common=(--security.insecure true --log.level warn --model.spec "$model")
"$build/bin/starling-server" "${common[@]}" --server.bind "$ep" --train.rounds "$rounds" \
  --sampling.min_available 2 --sampling.min_clients 2 --eval.every "$eval_every" \
  --compression.compressor "$compressor" > "$tmp/server.log" 2>&1 &
pids+=($!)
server=$!

run_client() {  # id, label, command...
  local id=$1 label=$2
  shift 2
  /usr/bin/time -v -o "$tmp/time-$label" "$@" "${common[@]}" --client.server "$ep" --client.id "$id" \
    --data.num_clients "$shards" --data.partition "$partition" > "$tmp/client-$label.log" 2>&1
}
run_client 0 x86_64 "$tmp/client-x86" &
c1=$!
if [[ -n $arm_client ]]; then
  run_client 1 arm64_qemu qemu-aarch64 -L / "$arm_client" &
else
  run_client 1 x86_64_b "$tmp/client-x86" &
fi
c2=$!
wait "$c1" "$c2"
wait "$server" || true
pids=()
for f in "$tmp"/time-*; do
  label=${f##*/time-}
  echo "${label}_client_peak_rss_kb $(awk -F': ' '/Maximum resident set size/ {print $2}' "$f")"
  echo "${label}_client_wall $(awk -F'): ' '/Elapsed \(wall clock\)/ {print $2}' "$f")"
  echo "${label}_client_exit $(awk -F': ' '/Exit status/ {print $2}' "$f")"
done
echo "server_log_tail $(tail -n 1 "$tmp/server.log")"
