#!/usr/bin/env bash
# starling-split end to end on a slice of Fashion-MNIST: pre-train, then split fine-tuning with
# compressed activations and gradients, the metrics file one JSON line per epoch with the bytes,
# fewer bytes than uncompressed; bad configurations and a missing pre-trained file are clear errors.
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
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
for bad in "--split.cut fc9" "--split.up zip" "--role edge" "--data.shift blur"; do
  # shellcheck disable=SC2086
  if "$bin" --role inproc "${common[@]}" $bad > "$dir/out" 2>&1; then echo "accepted: $bad"; exit 1; fi
  grep -q "starling-split:" "$dir/out" || { echo "no clear error for $bad"; cat "$dir/out"; exit 1; }
done
if "$bin" --role inproc --split.pretrained "$dir/none.bin" --data.max_train 10 > "$dir/out" 2>&1; then echo "missing file accepted"; exit 1; fi
grep -q "does not exist: write it first with --role pretrain" "$dir/out"
printf 'garbage' > "$dir/bad.bin"
if "$bin" --role inproc --split.pretrained "$dir/bad.bin" --data.max_train 10 > "$dir/out" 2>&1; then echo "garbage accepted"; exit 1; fi
grep -q "pre-trained checkpoint" "$dir/out"
echo "split app: ok"
