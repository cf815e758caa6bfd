#!/usr/bin/env bash
# starling-split end to end on a slice of Fashion-MNIST: pre-train, then split fine-tuning with
# compressed activations and gradients, the metrics file one JSON line per epoch with the bytes,
# fewer bytes than uncompressed; bad configurations and a missing pre-trained file are clear errors.
set -euo pipefail
bin=$1
keygen=${2:-}
examples=$(cd "$(dirname "$0")/../../examples/split" && pwd)
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
common=(--data.max_train 600 --data.max_test 300 --split.pretrained "$dir/pre.bin" --sim.threads 1)
"$bin" --role pretrain "${common[@]}" > "$dir/pre.log"
# Fine-tuning learns the five private classes reliably from 1,500 examples in two epochs.
common=(--data.max_train 1500 --data.max_test 300 --split.pretrained "$dir/pre.bin" --sim.threads 1)
[[ -s "$dir/pre.bin" ]] || { echo "no pre-trained file"; exit 1; }
"$bin" --role inproc "${common[@]}" --train.epochs 2 --state.metrics "$dir/none.jsonl" > "$dir/none.log"
"$bin" --role inproc "${common[@]}" --train.epochs 2 --split.up lowrank:rank=2 --split.down int8 \
  --state.metrics "$dir/lr.jsonl" > "$dir/lr.log"
"$bin" --role inproc "${common[@]}" --train.epochs 2 --split.weight_rank 32 --state.metrics "$dir/svd.jsonl" > "$dir/svd.log"
[[ $(wc -l < "$dir/none.jsonl") == 2 && $(wc -l < "$dir/lr.jsonl") == 2 ]] || { echo "not one line per epoch"; exit 1; }
up() { /usr/bin/python3 -c 'import json,sys; print(sum(json.loads(l)["uplink_bytes"] for l in open(sys.argv[1])))' "$1"; }
acc() { /usr/bin/python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["test_accuracy"])' "$1"; }
none_up=$(up "$dir/none.jsonl"); lr_up=$(up "$dir/lr.jsonl")
echo "uplink: none $none_up, lowrank $lr_up; accuracy: none $(acc "$dir/none.jsonl"), lowrank $(acc "$dir/lr.jsonl")"
(( lr_up * 5 < none_up )) || { echo "compressed activations are not smaller"; exit 1; }
# The weight-side cut at rank 32 sends 32 values per example instead of 3,136.
svd_up=$(up "$dir/svd.jsonl")
(( svd_up * 90 < none_up )) || { echo "the weight-side cut is not 90x smaller: $svd_up vs $none_up"; exit 1; }
/usr/bin/python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0.5 else 1)' "$(acc "$dir/svd.jsonl")" ||
  { echo "the weight-side cut did not learn"; exit 1; }
if "$bin" --role inproc "${common[@]}" --split.cut conv1 --split.weight_rank 4 > "$dir/out" 2>&1; then
  echo "a weight-side cut before a convolution was accepted"; exit 1; fi
grep -q "needs a linear layer after the cut" "$dir/out"
/usr/bin/python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0.5 else 1)' "$(acc "$dir/none.jsonl")" ||
  { echo "the fine-tuned model did not learn the private classes"; exit 1; }
# Three edge devices sharing the cloud, SplitFed: one line per epoch, the same bytes as one edge.
"$bin" --role inproc "${common[@]}" --train.epochs 1 --split.edges 3 --split.splitfed true \
  --state.metrics "$dir/fed.jsonl" > "$dir/fed.log"
grep -q "on 3 edge device(s) (SplitFed)" "$dir/fed.log"
[[ $(wc -l < "$dir/fed.jsonl") == 1 ]] || { echo "not one line per epoch with 3 edges"; exit 1; }
# Bad input: a wrong cut, an unknown codec, a missing pre-trained file, an unknown role.
for bad in "--split.cut fc9" "--split.up zip" "--role fog" "--data.shift blur"; do
  # shellcheck disable=SC2086
  if "$bin" --role inproc "${common[@]}" $bad > "$dir/out" 2>&1; then echo "accepted: $bad"; exit 1; fi
  grep -q "starling-split:" "$dir/out" || { echo "no clear error for $bad"; cat "$dir/out"; exit 1; }
done
# Devices: an unknown one, a GPU this machine or build cannot give, a GPU for an edge: clear errors.
if "$bin" --role inproc "${common[@]}" --device gpu > "$dir/out" 2>&1; then
  echo "--device gpu accepted"; exit 1; fi
grep -q "'gpu' is not one of auto, cpu, cuda, cuda:N" "$dir/out"
if "$bin" --role inproc "${common[@]}" --device cuda:99 > "$dir/out" 2>&1; then
  echo "--device cuda:99 accepted"; exit 1; fi
grep -qE "has no CUDA|sees no GPU|GPUs? (is|are) visible" "$dir/out" || { cat "$dir/out"; exit 1; }
if "$bin" --role edge --device cuda > "$dir/out" 2>&1; then
  echo "an edge on a GPU accepted"; exit 1; fi
grep -q "an edge device runs its part on the CPU" "$dir/out"
if "$bin" --role inproc --split.pretrained "$dir/none.bin" --data.max_train 10 > "$dir/out" 2>&1; then echo "missing file accepted"; exit 1; fi
grep -q "does not exist: write it first with --role pretrain" "$dir/out"
printf 'garbage' > "$dir/bad.bin"
if "$bin" --role inproc --split.pretrained "$dir/bad.bin" --data.max_train 10 > "$dir/out" 2>&1; then echo "garbage accepted"; exit 1; fi
grep -q "pre-trained checkpoint" "$dir/out"

# The small transformer: pre-trained by the project's own command, then the paper's cut at its
# second FFN with the skip connection removed: 16 values per token of 49 tokens cross, f32.
vit=(--model.spec vit --data.max_train 300 --data.max_test 100 --split.pretrained "$dir/vit.bin" --sim.threads 1)
"$bin" --role pretrain "${vit[@]}" > "$dir/vit-pre.log"
"$bin" --role inproc "${vit[@]}" --train.epochs 1 --train.batch_size 30 --split.weight_rank 16 --split.skip false \
  --state.metrics "$dir/vit.jsonl" > "$dir/vit.log"
grep -q "vit cut at ffn2 with the next projection split at rank 16, the skip connection across it removed: 784 values per example" "$dir/vit.log"
[[ $(up "$dir/vit.jsonl") == $((10 * (10 + 30 * 784 * 4))) ]] || { echo "vit: unexpected uplink bytes"; exit 1; }
if "$bin" --role inproc "${vit[@]}" --split.cut block1 --split.skip false > "$dir/out" 2>&1; then
  echo "a removed skip at block1 was accepted"; exit 1; fi
grep -q "crosses the cut only at ffn2" "$dir/out"
if "$bin" --role inproc "${vit[@]}" --split.pretrained "$dir/pre.bin" > "$dir/out" 2>&1; then
  echo "the cnn's checkpoint was accepted for the vit"; exit 1; fi
grep -q "another model" "$dir/out"

# The ResNet-8 cut after its third stage: 64 x 7 x 7 values per example.
rn=(--model.spec resnet --data.max_train 300 --data.max_test 100 --split.pretrained "$dir/rn.bin" --sim.threads 1)
"$bin" --role pretrain "${rn[@]}" > "$dir/rn-pre.log"
"$bin" --role inproc "${rn[@]}" --split.cut layer3 --train.epochs 1 --train.batch_size 30 --state.metrics "$dir/rn.jsonl" \
  > "$dir/rn.log"
grep -q "resnet cut at layer3: 3136 values per example" "$dir/rn.log"
[[ $(up "$dir/rn.jsonl") == $((10 * (10 + 30 * 3136 * 4))) ]] || { echo "resnet: unexpected uplink bytes"; exit 1; }

# Edge and cloud over ZeroMQ on 127.0.0.1 under CURVE: two edge devices (ids 1 and 2, shards 0 and
# 1) fine-tune through one cloud; the cloud is killed after the first edge's run and restarted
# from its checkpoint, and the second edge, started against the restarted cloud, learns too.
if [[ -n "$keygen" ]]; then
  "$keygen" --out "$dir/keys/server" --server > /dev/null
  "$keygen" --out "$dir/keys/edges" --clients 2 --first-id 1 > /dev/null
  # examples/split/cloud.toml and edge.toml (low-rank rank 8 up, int8 down), paths set here.
  cloud_args=(--role cloud --config "$examples/cloud.toml" --split.pretrained "$dir/pre.bin" --sim.threads 1
    --cloud.checkpoint "$dir/cloud.bin" --cloud.checkpoint_every 10
    --security.key "$dir/keys/server/server.key_secret" --security.clients "$dir/keys/edges")
  start_cloud() {  # start_cloud BIND N
    "$bin" "${cloud_args[@]}" --cloud.bind "$1" > "$dir/cloud$2.log" 2>&1 &
    pids+=($!)
    cloud_pid=$!
    for _ in $(seq 100); do grep -q "serving on" "$dir/cloud$2.log" && break; sleep 0.1; done
    endpoint=$(grep -o "serving on tcp://[0-9.:]*" "$dir/cloud$2.log" | awk '{print $3}')
    [[ -n "$endpoint" ]] || { echo "the cloud did not start"; cat "$dir/cloud$2.log"; exit 1; }
  }
  edge() {  # edge ID SHARD EPOCHS
    timeout 200 "$bin" --role edge --config "$examples/edge.toml" "${common[@]}" --split.edges 2 --edge.id "$1" --edge.shard "$2" \
      --train.epochs "$3" --edge.cloud "$endpoint" --edge.step_timeout_ms 2000 \
      --security.key "$dir/keys/edges/client-$1.key_secret" --security.server_key "$dir/keys/server/server.key" \
      --state.metrics "$dir/edge$1.jsonl" > "$dir/edge$1.log" 2>&1 || { echo "edge $1 failed"; cat "$dir/edge$1.log"; exit 1; }
  }
  start_cloud 'tcp://127.0.0.1:*' 1
  edge 1 0 2
  /usr/bin/python3 - "$dir/edge1.jsonl" <<'PY' || { echo "edge 1 did not learn"; cat "$dir/edge1.log"; exit 1; }
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert len(r) == 2 and r[1]["train_loss"] < r[0]["train_loss"] and r[1]["test_accuracy"] > 0.5, r
assert all(x["uplink_bytes"] > 0 and x["downlink_bytes"] > 0 and x["cloud_seconds"] > 0 for x in r), r
PY
  kill -TERM "$cloud_pid"; wait "$cloud_pid" || true
  steps=$(grep -o "stopped after [0-9]* training steps" "$dir/cloud1.log" | awk '{print $3}')
  [[ "$steps" == 48 ]] || { echo "cloud 1 did not serve edge 1's 2 x 24 steps"; cat "$dir/cloud1.log"; exit 1; }
  start_cloud "$endpoint" 2
  grep -q "resumed from .* after 48 training steps" "$dir/cloud2.log" || { echo "no resume"; cat "$dir/cloud2.log"; exit 1; }
  edge 2 1 1
  /usr/bin/python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); sys.exit(0 if r["test_accuracy"] > 0.5 else 1)' \
    "$dir/edge2.jsonl" || { echo "edge 2 did not learn"; exit 1; }
  # An edge with a key the cloud does not list gets no session: a clear error, no crash.
  "$keygen" --out "$dir/keys/other" --name stranger --id 9 > /dev/null
  if timeout 60 "$bin" --role edge --config "$examples/edge.toml" "${common[@]}" --edge.id 9 --edge.cloud "$endpoint" \
      --edge.step_timeout_ms 300 --edge.tries 2 --security.key "$dir/keys/other/stranger.key_secret" \
      --state.metrics "$dir/stranger.jsonl" \
      --security.server_key "$dir/keys/server/server.key" > "$dir/out" 2>&1; then echo "a stranger trained"; exit 1; fi
  grep -q "did not answer edge 9's hello" "$dir/out" || { echo "no clear error for a stranger"; cat "$dir/out"; exit 1; }
  # An edge asking for other codecs is refused with the cloud's settings in the message.
  if timeout 60 "$bin" --role edge --split.up int8 "${common[@]}" --edge.id 1 --edge.cloud "$endpoint" \
      --security.key "$dir/keys/edges/client-1.key_secret" --security.server_key "$dir/keys/server/server.key" \
      > "$dir/out" 2>&1; then echo "other codecs accepted"; exit 1; fi
  grep -q "serves another cut model or other codecs" "$dir/out" || { echo "no clear error for other codecs"; cat "$dir/out"; exit 1; }
  kill -TERM "$cloud_pid"; wait "$cloud_pid" || true
  grep -q "refused [1-9]" "$dir/cloud2.log" || { echo "the cloud did not count the refusal"; cat "$dir/cloud2.log"; exit 1; }
  echo "edge and cloud over CURVE: $(tail -n 1 "$dir/edge1.jsonl")"
  # SplitFed over the network: two edges at once, their bottoms averaged by the cloud after the
  # epoch; then both hold the same model, so their test accuracies agree exactly.
  cloud_args+=(--cloud.splitfed_edges 2 --cloud.exit_after 2)
  rm -f "$dir/cloud.bin"
  start_cloud 'tcp://127.0.0.1:*' 3
  for i in 1 2; do
    timeout 200 "$bin" --role edge --config "$examples/edge.toml" "${common[@]}" --data.max_train 300 --split.edges 2 \
      --edge.id "$i" --edge.shard $((i - 1)) --train.epochs 1 --split.splitfed true --edge.cloud "$endpoint" \
      --security.key "$dir/keys/edges/client-$i.key_secret" --security.server_key "$dir/keys/server/server.key" \
      --state.metrics "$dir/fed$i.jsonl" > "$dir/fed$i.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[-1]}" "${pids[-2]}" || { echo "a SplitFed edge failed"; cat "$dir/fed1.log" "$dir/fed2.log"; exit 1; }
  wait "$cloud_pid" || true
  a1=$(acc "$dir/fed1.jsonl"); a2=$(acc "$dir/fed2.jsonl")
  [[ "$a1" == "$a2" ]] || { echo "SplitFed edges disagree: $a1 vs $a2"; exit 1; }
  echo "SplitFed over the network: both edges at $a1"
fi
echo "split app: ok"
