#!/usr/bin/env bash
# Accuracy and uplink under secure aggregation (docs/results.md, "Secure aggregation: accuracy and
# bytes"): the task of bench/privacy_accuracy.sh (POOL clients of 60 Fashion-MNIST examples,
# Poisson sampling at Q, the MLP, updates clipped to CLIP and weighing alike, ROUNDS rounds),
# each variant once with the round's sum in the clear and once under SecAgg+ (the real protocol
# among the simulated clients, one worker):
#   dense       compressor none                     (plain: the clipped uniform mean, no noise)
#   block       compressor randblock:density=BLOCK  (its shared block; under SecAgg the ring is
#               BLOCK_BITS bits a value)
#   dense-eps1  central DP at epsilon 1, delta 1e-5  (under SecAgg the root adds the noise to the
#               unmasked sum)
#   block-m     block with server momentum (fedavgm, eta 1, beta1 0.9) on the round's mean
#   acp         compressor acpsgd:rank=ACP_RANK (one low-rank factor a round against the shared
#               side, error feedback; under SecAgg each client masks its factor)
#   acp-m       acp with server momentum (fedavgm, eta 1, beta1 0.9)
#   psgd        compressor powersgd:rank=PSGD_RANK (two-phase PowerSGD: P against the shared Q,
#               then Q against P-hat, error feedback; under SecAgg each phase a secure sum of its
#               own, with fresh keys)
#   psgd-m      psgd with server momentum (fedavgm, eta 1, beta1 0.9)
#   ddg-eps1    distributed DP at epsilon 1, delta 1e-5: each client adds its share of discrete
#               Gaussian noise in the ring (under SecAgg only: there is no plain run of it);
#               MIN_CLIENTS sets privacy.min_clients (default: half of Q POOL)
#   dense-epsE, ddg-epsE   the same at epsilon E (dense-eps2, ddg-eps8, ...)
# Every run writes OUT/<variant>-<plain|secagg>.jsonl and is skipped when that file already has
# ROUNDS lines (the script resumes). Then one table row per run: the mean of the last five
# evaluations, the final one, and the mean uplink bytes per client a round.
#
# Usage: bench/secagg_accuracy.sh [OUT] [BIN]
#   OUT  folder of the metrics files (default secagg-accuracy)
#   BIN  starling-sim (default build/bin/starling-sim)
# Environment: POOL (10000), Q (0.01), ROUNDS (300), CLIP (0.3), MODEL (mlp), SEED (1),
# EVAL_EVERY (10), BLOCK (0.05), BLOCK_BITS (26), ACP_RANK (4), PSGD_RANK (4), VARIANTS ("dense
# block dense-eps1 block-m"; add ddg-eps1 for distributed DP, acp for ACP-SGD, psgd for PowerSGD),
# MIN_CLIENTS (ddg-eps1's privacy.min_clients; default derived).
set -euo pipefail
out=${1:-secagg-accuracy}
bin=${2:-build/bin/starling-sim}
pool=${POOL:-10000}
q=${Q:-0.01}
rounds=${ROUNDS:-300}
clip=${CLIP:-0.3}
model=${MODEL:-mlp}
seed=${SEED:-1}
eval_every=${EVAL_EVERY:-10}
block=${BLOCK:-0.05}
block_bits=${BLOCK_BITS:-26}
acp_rank=${ACP_RANK:-4}
psgd_rank=${PSGD_RANK:-4}
variants=${VARIANTS:-dense block dense-eps1 block-m}
[ -x "$bin" ] || { echo "secagg_accuracy: $bin is not an executable (cmake --build build --target starling-sim)" >&2; exit 2; }
mkdir -p "$out"

for v in $variants; do
  for mode in plain secagg; do
    case "$v" in ddg-eps*) [ "$mode" = plain ] && continue ;; esac
    f="$out/$v-$mode.jsonl"
    if [ -f "$f" ] && [ "$(wc -l < "$f")" -ge "$rounds" ]; then continue; fi
    rm -f "$f"
    comp=none
    extra=()
    case "$v" in
      dense) ;;
      block) comp="randblock:density=$block" ;;
      block-m) comp="randblock:density=$block"; extra=(--aggregation.server_opt "fedavgm:eta=1,beta1=0.9") ;;
      acp) comp="acpsgd:rank=$acp_rank" ;;
      acp-m) comp="acpsgd:rank=$acp_rank"; extra=(--aggregation.server_opt "fedavgm:eta=1,beta1=0.9") ;;
      psgd) comp="powersgd:rank=$psgd_rank" ;;
      psgd-m) comp="powersgd:rank=$psgd_rank"; extra=(--aggregation.server_opt "fedavgm:eta=1,beta1=0.9") ;;
      dense-eps*) extra=(--privacy.dp central --privacy.clip "$clip" --privacy.target_epsilon "${v#dense-eps}" --privacy.delta 1e-5) ;;
      ddg-eps*) extra=(--privacy.dp distributed --privacy.clip "$clip" --privacy.target_epsilon "${v#ddg-eps}" --privacy.delta 1e-5)
                [ -n "${MIN_CLIENTS:-}" ] && extra+=(--privacy.min_clients "$MIN_CLIENTS") ;;
      *) echo "secagg_accuracy: unknown variant '$v' (dense, block, dense-epsE, block-m, ddg-epsE, acp, acp-m, psgd, psgd-m)" >&2; exit 2 ;;
    esac
    if [ "$mode" = secagg ]; then
      extra+=(--secagg.enabled true --secagg.clip "$clip")
      [ "${v%-m}" = block ] && extra+=(--secagg.bits "$block_bits")
    elif [ "${v#dense-eps}" = "$v" ]; then
      extra+=(--aggregation.rule "fedavg:weight=uniform,clip=$clip")
    fi
    echo "secagg_accuracy: $v, $mode, $rounds rounds" >&2
    "$bin" --model.spec "$model" --model.seed "$seed" --data.num_clients "$pool" \
      --data.partition sampled:size=60 --sampling.poisson_rate "$q" --train.rounds "$rounds" \
      --train.lr 0.1 --train.batch_size 20 --compression.compressor "$comp" \
      --eval.every "$eval_every" --sim.workers 1 --sim.device cpu \
      --state.metrics "$f" "${extra[@]}" > "$out/$v-$mode.log" 2>&1
  done
done

python3 - "$out" $variants <<'PY'
import json, sys, os
out, variants = sys.argv[1], sys.argv[2:]
print("| variant | aggregation | mean of last 5 evaluations | final | uplink per client a round |")
print("|---|---|---|---|---|")
for v in variants:
    for mode in ("plain", "secagg"):
        path = os.path.join(out, f"{v}-{mode}.jsonl")
        if not os.path.exists(path):
            continue
        recs = [json.loads(l) for l in open(path)]
        accs = [r["test_accuracy"] for r in recs if "test_accuracy" in r]
        up = sum(r["uplink_bytes"] for r in recs) / max(1, sum(r["clients_completed"] for r in recs))
        print(f"| {v} | {mode} | {100 * sum(accs[-5:]) / len(accs[-5:]):.2f}% | {100 * accs[-1]:.2f}% "
              f"| {up:,.0f} B |")
PY
