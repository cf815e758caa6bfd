#!/usr/bin/env bash
# Learning per byte (docs/results.md, "Learning per byte"): the CNN on Fashion-MNIST, 100 clients with
# Dirichlet(0.5) label skew, 10 per round, 1 local epoch (examples/sim/results.toml), ROUNDS rounds,
# for each compressor with its default error feedback and with plain error feedback, each seed of
# SEEDS. Every run writes OUT/NAME-sSEED.jsonl (the simulator's per-round metrics: accuracy, uplink
# and downlink bytes); a run whose file already has ROUNDS lines is skipped, so the script resumes.
# Then tools/plot_runs.py draws accuracy against the round and against cumulative bytes.
#
# Usage: bench/learning_per_byte.sh [OUT] [BIN]
#   OUT   folder of the metrics files (default lpb)
#   BIN   starling-sim (default build/bin/starling-sim)
# Environment: ROUNDS (100), SEEDS ("1 2 3"), ONLY (space-separated run names, default all),
# EVAL_EVERY (5), WORKERS (2).
set -euo pipefail
out=${1:-lpb}
bin=${2:-build/bin/starling-sim}
rounds=${ROUNDS:-100}
seeds=${SEEDS:-1 2 3}
eval_every=${EVAL_EVERY:-5}
workers=${WORKERS:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$bin" ] || { echo "learning_per_byte: $bin is not an executable (cmake --build build --target starling-sim)" >&2; exit 2; }
mkdir -p "$out"

# name | compressor spec | extra options
runs=(
  "dense|none|"
  "randblock5|randblock:density=0.05|"
  "randblock5-plain|randblock:density=0.05,ef_preview=0|"
  "randblock5-client|randblock:density=0.05,offset=client|"
  "acpsgd4|acpsgd:rank=4|"
  "acpsgd4-plain|acpsgd:rank=4,ef_preview=0|"
  "topk1|topk:density=0.01|"
  "topk1-down|topk:density=0.01|--downlink.mode topk --downlink.density 0.01 --downlink.history 64"
  "powersgd4|powersgd:rank=4|"
  "sign|sign|"
  "sign-plain|sign:ef_preview=0|"
  "qsgd|qsgd:levels=16|"
  "randk5|randk:density=0.05|"
  "topk01|topk:density=0.001|"
  "powersgd4-plain|powersgd:rank=4,ef_preview=0|"
  "randk5-plain|randk:density=0.05,ef_preview=0|"
  "topk1-fwd|topk:density=0.01,ef_preview=1|"
  "qsgd-ef|qsgd:levels=16,ef=true|"
  "stc5|stc:density=0.05|"
  "stc5-ahead|stc:density=0.05,ef_preview=1|"
  "stc2|stc:density=0.02|"
  "stc10|stc:density=0.1|"
  "stc5-down|stc:density=0.05|--downlink.mode topk --downlink.density 0.05 --downlink.history 64"
  "dense-q8|none|--downlink.mode q8"
  "stc5-q8|stc:density=0.05|--downlink.mode q8"
  "stc5-q4|stc:density=0.05|--downlink.mode q4"
  "stc5-stc1|stc:density=0.05|--downlink.mode stc --downlink.density 0.01 --downlink.history 64"
  "stc5-stc2|stc:density=0.05|--downlink.mode stc --downlink.density 0.02 --downlink.history 64"
  "dense-stc1|none|--downlink.mode stc --downlink.density 0.01 --downlink.history 64"
  "sign-stc1|sign|--downlink.mode stc --downlink.density 0.01 --downlink.history 64"
  "dense-q3|none|--downlink.mode q3"
  "dense-q2|none|--downlink.mode q2"
  "sign-q3|sign|--downlink.mode q3"
  "sign-q2|sign|--downlink.mode q2"
  "stc5-q2|stc:density=0.05|--downlink.mode q2"
  "dense-q2m|none|--downlink.mode q2-mirror"
  "sign-q2m|sign|--downlink.mode q2-mirror"
  "sign-q2m-eta1.5|sign|--downlink.mode q2-mirror --aggregation.server_opt fedavg:eta=1.5"
  "dense-eta1.5|none|--aggregation.server_opt fedavg:eta=1.5"
  "sign-q3m|sign|--downlink.mode q3-mirror"
  "stc5-q2m|stc:density=0.05|--downlink.mode q2-mirror"
  "dense-stcm10|none|--downlink.mode stc-mirror --downlink.density 0.1"
  "stc5-stcm10|stc:density=0.05|--downlink.mode stc-mirror --downlink.density 0.1"
  "stc5-stcm10-eta1.5|stc:density=0.05|--downlink.mode stc-mirror --downlink.density 0.1 --aggregation.server_opt fedavg:eta=1.5"
  "sign-stcm10-eta1.5|sign|--downlink.mode stc-mirror --downlink.density 0.1 --aggregation.server_opt fedavg:eta=1.5"
  "stc10a-stcm10-eta1.5|stc:density=0.1,ef_preview=1|--downlink.mode stc-mirror --downlink.density 0.1 --aggregation.server_opt fedavg:eta=1.5"
  "stc5a-stcm10-eta1.5|stc:density=0.05,ef_preview=1|--downlink.mode stc-mirror --downlink.density 0.1 --aggregation.server_opt fedavg:eta=1.5"
  "stc5a-stcm10|stc:density=0.05,ef_preview=1|--downlink.mode stc-mirror --downlink.density 0.1"
  "topk5|topk:density=0.05|"
  "acpsgd8|acpsgd:rank=8|"
  "powersgd8|powersgd:rank=8|"
  "randk25|randk:density=0.25|"
  "randblock25|randblock:density=0.25|"
)

for seed in $seeds; do
  for entry in "${runs[@]}"; do
    IFS='|' read -r name spec extra <<<"$entry"
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
    file="$out/$name-s$seed.jsonl"
    if [ -f "$file" ] && [ "$(wc -l <"$file")" -ge "$rounds" ]; then continue; fi
    rm -f "$file" "$out/$name-s$seed.ckpt"
    echo "[$(date +%H:%M:%S)] $name seed $seed: $spec $extra" >&2
    # shellcheck disable=SC2086
    "$bin" --config "$here/examples/sim/results.toml" --train.rounds "$rounds" --model.seed "$seed" \
      --eval.every "$eval_every" --sim.workers "$workers" --compression.compressor "$spec" \
      --state.metrics "$file" $extra >"$out/$name-s$seed.log" 2>&1 ||
      { echo "learning_per_byte: $name seed $seed failed, see $out/$name-s$seed.log" >&2; exit 1; }
    tail -n 1 "$file" >&2
  done
done
