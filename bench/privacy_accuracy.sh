#!/usr/bin/env bash
# Accuracy against privacy (docs/results.md, "Accuracy against privacy"): central DP (DP-FedAvg,
# docs/privacy.md) on Fashion-MNIST with a population where DP makes sense: POOL clients of 60
# examples each (sampled:size=60), Poisson sampling at rate Q (Q x POOL clients a round), the MLP,
# updates clipped to CLIP, ROUNDS rounds, at each target epsilon of EPSILONS with delta 1e-5 (the
# noise multiplier derived from it), and without DP ("inf": the same clipped uniform mean, no
# noise). Every run writes OUT/q<Q>-eps<E>.jsonl; a run whose file already has ROUNDS lines is
# skipped, so the script resumes. Then one table row per run: the noise multiplier, epsilon spent,
# the mean of the last five evaluations and the final one.
#
# Usage: bench/privacy_accuracy.sh [OUT] [BIN]
#   OUT   folder of the metrics files (default dp-accuracy)
#   BIN   starling-sim (default build/bin/starling-sim)
# Environment: POOL (10000), RATES ("0.01 0.1"), ROUNDS_0.01 / ROUNDS_0.1 style overrides as
# ROUNDS_FOR="0.01:300 0.1:100", EPSILONS ("1 2 4 8 inf"), CLIP (0.3), MODEL (mlp), SEED (1),
# EVAL_EVERY (10), WORKERS (2), ADAPTIVE (1: privacy.adaptive_clip, the clip starting at CLIP and
# following the median update norm; the files are then OUT/q<Q>-eps<E>-adaptive.jsonl).
set -euo pipefail
out=${1:-dp-accuracy}
bin=${2:-build/bin/starling-sim}
pool=${POOL:-10000}
rates=${RATES:-0.01 0.1}
rounds_for=${ROUNDS_FOR:-0.01:300 0.1:100}
epsilons=${EPSILONS:-1 2 4 8 inf}
clip=${CLIP:-0.3}
model=${MODEL:-mlp}
seed=${SEED:-1}
eval_every=${EVAL_EVERY:-10}
workers=${WORKERS:-2}
adaptive=${ADAPTIVE:-0}
suffix=""
[ "$adaptive" = 1 ] && suffix="-adaptive"
[ -x "$bin" ] || { echo "privacy_accuracy: $bin is not an executable (cmake --build build --target starling-sim)" >&2; exit 2; }
mkdir -p "$out"

rounds_of() {
  local r
  for r in $rounds_for; do [ "${r%%:*}" = "$1" ] && { echo "${r#*:}"; return; }; done
  echo 100
}

for q in $rates; do
  rounds=$(rounds_of "$q")
  for e in $epsilons; do
    f="$out/q$q-eps$e$suffix.jsonl"
    if [ -f "$f" ] && [ "$(wc -l < "$f")" -ge "$rounds" ]; then continue; fi
    rm -f "$f"
    if [ "$e" = inf ]; then
      dp=(--aggregation.rule "fedavg:weight=uniform,clip=$clip")
    else
      dp=(--privacy.dp central --privacy.clip "$clip" --privacy.target_epsilon "$e" --privacy.delta 1e-5)
      [ "$adaptive" = 1 ] && dp+=(--privacy.adaptive_clip true)
    fi
    echo "privacy_accuracy: q $q, epsilon $e, $rounds rounds" >&2
    "$bin" --model.spec "$model" --model.seed "$seed" --data.num_clients "$pool" \
      --data.partition sampled:size=60 --sampling.poisson_rate "$q" --train.rounds "$rounds" \
      --train.lr 0.1 --train.batch_size 20 --compression.compressor none \
      --eval.every "$eval_every" --sim.workers "$workers" --sim.device cpu \
      --state.metrics "$f" "${dp[@]}" > "$out/q$q-eps$e$suffix.log" 2>&1
  done
done

python3 - "$out" "$suffix" $rates -- $epsilons <<'PY'
import json, sys, os
out, suffix = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
cut = args.index("--")
rates, epsilons = args[:cut], args[cut + 1:]
print("| q (clients a round) | target epsilon | noise multiplier | epsilon spent | mean of last 5 evaluations | final | last clip |")
print("|---|---|---|---|---|---|---|")
for q in rates:
    for e in epsilons:
        path = os.path.join(out, f"q{q}-eps{e}{suffix}.jsonl")
        if not os.path.exists(path):
            continue
        recs = [json.loads(l) for l in open(path)]
        accs = [r["test_accuracy"] for r in recs if "test_accuracy" in r]
        sigma = "-"
        for line in open(os.path.join(out, f"q{q}-eps{e}{suffix}.log")):
            if line.startswith("central DP:"):
                sigma = line.split("noise multiplier ")[1].split(",")[0]
        spent = recs[-1].get("dp_epsilon")
        per_round = sum(r["clients_selected"] for r in recs) / len(recs)
        print(f"| {q} ({per_round:.0f}) | {e} | {sigma} | {'-' if spent is None else f'{spent:.3f}'} "
              f"| {100 * sum(accs[-5:]) / len(accs[-5:]):.2f}% | {100 * accs[-1]:.2f}% "
              f"| {recs[-1].get('dp_clip', '-')} |")
PY
