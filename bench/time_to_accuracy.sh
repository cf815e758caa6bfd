#!/usr/bin/env bash
# Time to accuracy, FedBuff against synchronous FedAvg (docs/results.md): the CNN on
# Fashion-MNIST, 100 clients with Dirichlet(0.5) label skew, log-normal device speeds and bandwidths
# (examples/sim/fedbuff.toml), ROUNDS rounds (synchronous, 10 clients each, waiting for the
# slowest) or server steps (FedBuff: 10 clients training at once, a step every 10 updates;
# semi-synchronous: rounds of 30 simulated s, late updates joining later rounds), for each
# seed of SEEDS. Both aggregate the same number of updates. Every run writes OUT/NAME-sSEED.jsonl; a
# run whose file already has ROUNDS lines is skipped, so the script resumes. Then the table of
# tools/summarize_runs.py: final accuracy, traffic, and the simulated time and traffic to TARGET%.
#
# Usage: bench/time_to_accuracy.sh [OUT] [BIN]
#   OUT   folder of the metrics files (default tta)
#   BIN   starling-sim (default build/bin/starling-sim)
# Environment: ROUNDS (60), SEEDS ("1 2 3"), TARGET (80), ONLY (run names: sync fedbuff fedbuff20
# semisync fedbuff-eta1.5 fedbuff-eta1.5-sign-q2m fedbuff-eta1.5-sign fedbuff-eta1.5-q2m
# fedbuff-eta1.5-stc10a-stcm10), CLIENTS
# (the population, default 100) and PER_ROUND (clients per synchronous round, and FedBuff's
# concurrency and K; default 10): CLIENTS=1000 PER_ROUND=100 is the same number of examples a round
# at a tenth of the data per client. fedbuff-eta1.5: the server
# step x += 1.5 delta, which gives back what the staleness weights take from FedBuff's mean step
# (mean staleness 0.9 at these settings: an update weighs (1 + 0.9)^-0.5 = 0.73 on average).
set -euo pipefail
out=${1:-tta}
bin=${2:-build/bin/starling-sim}
rounds=${ROUNDS:-60}
seeds=${SEEDS:-1 2 3}
target=${TARGET:-80}
clients=${CLIENTS:-100}
per_round=${PER_ROUND:-10}
here=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$bin" ] || { echo "time_to_accuracy: $bin is not an executable (cmake --build build --target starling-sim)" >&2; exit 2; }
mkdir -p "$out"

# name | options on top of examples/sim/fedbuff.toml
runs=(
  "sync|--round.mode sync"
  "fedbuff|"
  "fedbuff20|--async.concurrency 20"
  "semisync|--round.mode semisync --round.deadline_seconds 30"
  "fedbuff-eta1.5|--aggregation.server_opt fedavg:eta=1.5"
  "fedbuff-eta1.5-sign-q2m|--aggregation.server_opt fedavg:eta=1.5 --compression.compressor sign --downlink.mode q2-mirror"
  "fedbuff-eta1.5-sign|--aggregation.server_opt fedavg:eta=1.5 --compression.compressor sign"
  "fedbuff-eta1.5-q2m|--aggregation.server_opt fedavg:eta=1.5 --downlink.mode q2-mirror"
  "fedbuff-eta1.5-stc10a-stcm10|--aggregation.server_opt fedavg:eta=1.5 --compression.compressor stc:density=0.1,ef_preview=1 --downlink.mode stc-mirror --downlink.density 0.1"
)

for seed in $seeds; do
  for entry in "${runs[@]}"; do
    IFS='|' read -r name extra <<<"$entry"
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
    file="$out/$name-s$seed.jsonl"
    if [ -f "$file" ] && [ "$(wc -l <"$file")" -ge "$rounds" ]; then continue; fi
    rm -f "$file"
    echo "time_to_accuracy: $name seed $seed"
    # shellcheck disable=SC2086
    "$bin" --config "$here/examples/sim/fedbuff.toml" --model.seed "$seed" --train.rounds "$rounds" \
      --state.metrics "$file" --data.num_clients "$clients" --sampling.clients_per_round \
      "$per_round" --async.buffer_size "$per_round" $extra >"$out/$name-s$seed.log"
    tail -1 "$out/$name-s$seed.log"
  done
done
/usr/bin/python3 "$here/tools/summarize_runs.py" --reference sync --traffic total --target "$target" "$out"
