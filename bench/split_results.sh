#!/usr/bin/env bash
# Split fine-tuning results (docs/results.md, "Split fine-tuning"): the CNN pre-trained on the
# public part of Fashion-MNIST (classes 0-4, all 30,000 training examples, PRETRAIN_EPOCHS epochs),
# then fine-tuned split at conv2 on the private part (classes 5-9: 30,000 training and 5,000 test
# examples) for EPOCHS epochs, in process (every activation and gradient through its codec's real
# encoding, so the bytes are those that would cross), for each codec or weight-side rank, each seed
# of SEEDS. Every run writes OUT/NAME-sSEED.jsonl (one line per epoch: accuracy, loss, uplink and
# downlink bytes, the cloud's compute seconds); a run whose file has EPOCHS lines is skipped, so the
# script resumes. The pre-trained model of each seed is OUT/pretrained-sSEED.bin.
#
# Usage: bench/split_results.sh [OUT] [BIN]
#   OUT   folder of the metrics files (default split-results)
#   BIN   starling-split (default build/bin/starling-split)
# Environment: EPOCHS (3), PRETRAIN_EPOCHS (2), SEEDS ("1 2 3"), ONLY (space-separated run names),
# THREADS (2), MODEL (cnn, cut at conv2; or vit, the small transformer cut in its second FFN, run
# names prefixed "vit-", its own pre-trained model OUT/vit-pretrained-sSEED.bin), LR (0.05).
# Then: tools/summarize_runs.py --reference none --traffic total OUT, and
# tools/plot_runs.py --bytes total --out split.png LABEL=OUT/NAME-s1.jsonl ...
set -euo pipefail
out=${1:-split-results}
bin=${2:-build/bin/starling-split}
epochs=${EPOCHS:-3}
pre_epochs=${PRETRAIN_EPOCHS:-2}
seeds=${SEEDS:-1 2 3}
threads=${THREADS:-2}
model=${MODEL:-cnn}
lr=${LR:-0.05}
[ -x "$bin" ] || { echo "split_results: $bin is not an executable (cmake --build build --target starling-split)" >&2; exit 2; }
mkdir -p "$out"

# name | options
if [ "$model" = vit ]; then
  runs=(
    "vit-none|"
    "vit-int8|--split.up int8 --split.down int8"
    "vit-svd16|--split.weight_rank 16"
    "vit-svd16-noskip|--split.weight_rank 16 --split.skip false"
    "vit-svd8-noskip|--split.weight_rank 8 --split.skip false"
    "vit-svd8-noskip-int8|--split.weight_rank 8 --split.skip false --split.up int8 --split.down int8"
    "vit-svd4-noskip-int8|--split.weight_rank 4 --split.skip false --split.up int8 --split.down int8"
  )
else
runs=(
  "none|"
  "int8|--split.up int8 --split.down int8"
  "topk5|--split.up topk:density=0.05 --split.down topk:density=0.05"
  "lowrank8|--split.up lowrank:rank=8 --split.down lowrank:rank=8"
  "lowrank8-ef|--split.up lowrank:rank=8,ef=true --split.down lowrank:rank=8"
  "svd32|--split.weight_rank 32"
  "svd16|--split.weight_rank 16"
  "svd32-int8|--split.weight_rank 32 --split.up int8 --split.down int8"
)
fi
prefix=$([ "$model" = vit ] && echo "vit-" || true)

for seed in $seeds; do
  pre="$out/${prefix}pretrained-s$seed.bin"
  if [ ! -s "$pre" ]; then
    echo "[$(date +%H:%M:%S)] pre-training, seed $seed" >&2
    "$bin" --role pretrain --model.spec "$model" --model.seed "$seed" --pretrain.epochs "$pre_epochs" \
      --train.lr "$lr" --split.pretrained "$pre" --sim.threads "$threads" > "${pre%.bin}.log" 2>&1 ||
      { echo "split_results: pre-training seed $seed failed, see ${pre%.bin}.log" >&2; exit 1; }
    grep "public test accuracy" "${pre%.bin}.log" | tail -n 1 >&2
  fi
  for entry in "${runs[@]}"; do
    IFS='|' read -r name opts <<<"$entry"
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
    file="$out/$name-s$seed.jsonl"
    if [ -f "$file" ] && [ "$(wc -l <"$file")" -ge "$epochs" ]; then continue; fi
    rm -f "$file"
    echo "[$(date +%H:%M:%S)] $name seed $seed: $opts" >&2
    # shellcheck disable=SC2086
    "$bin" --role inproc --model.spec "$model" --model.seed "$seed" --split.pretrained "$pre" --train.epochs "$epochs" \
      --train.lr "$lr" \
      --sim.threads "$threads" --state.metrics "$file" $opts > "$out/$name-s$seed.log" 2>&1 ||
      { echo "split_results: $name seed $seed failed, see $out/$name-s$seed.log" >&2; exit 1; }
    tail -n 1 "$file" >&2
  done
done
