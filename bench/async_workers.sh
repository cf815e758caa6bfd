#!/usr/bin/env bash
# The asynchronous simulator on several workers (docs/simulation.md, docs/performance.md): FedBuff
# with the CNN on Fashion-MNIST (examples/sim/fedbuff.toml), CLIENTS clients, C = K = PER_ROUND,
# STEPS server steps, on 1 and on W workers, for each compressor of COMPRESSORS, REPS times
# alternately. The time is the run's own ("N steps in T s": the event loop and the training, not
# the start-up), so the ratio is what the workers share. Every W-worker run must give the one-worker
# run's metrics (every field but the wall times): the script fails if not.
#
# Usage: bench/async_workers.sh [OUT] [BIN]
#   OUT   folder of the logs and metrics (default async_workers)
#   BIN   starling-sim (default build/bin/starling-sim)
# Environment: W (2), CLIENTS (1000), PER_ROUND (100), STEPS (4), REPS (2),
# COMPRESSORS ("none topk:density=0.05,ef=false stc:density=0.05").
# Output: one JSON object a line per compressor on standard output: the median seconds on 1 and on
# W workers and their ratio.
set -euo pipefail
out=${1:-async_workers}
bin=${2:-build/bin/starling-sim}
workers=${W:-2}
clients=${CLIENTS:-1000}
per_round=${PER_ROUND:-100}
steps=${STEPS:-4}
reps=${REPS:-2}
compressors=${COMPRESSORS:-none topk:density=0.05,ef=false stc:density=0.05}
here=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$bin" ] || { echo "async_workers: $bin is not an executable (cmake --build build --target starling-sim)" >&2; exit 2; }
mkdir -p "$out"

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

for comp in $compressors; do
  tag=$(echo "$comp" | tr -c 'a-zA-Z0-9\n' '_')
  : >"$out/$tag-1.times"
  : >"$out/$tag-$workers.times"
  for rep in $(seq "$reps"); do
    for w in 1 "$workers"; do
      name="$tag-w$w-r$rep"
      rm -f "$out/$name.jsonl"
      "$bin" --config "$here/examples/sim/fedbuff.toml" --sim.workers "$w" --train.rounds "$steps" \
        --eval.every 0 --data.num_clients "$clients" --sampling.clients_per_round "$per_round" \
        --async.buffer_size "$per_round" --compression.compressor "$comp" \
        --state.metrics "$out/$name.jsonl" >"$out/$name.log" 2>&1 ||
        { echo "async_workers: $name failed (see $out/$name.log)" >&2; exit 1; }
      sed -n 's/.* steps in \([0-9.]*\) s .*/\1/p' "$out/$name.log" >>"$out/$tag-$w.times"
      # The same run on every worker count: every field but the wall times.
      if [ "$w" != 1 ]; then
        strip() { sed -E 's/,"(makespan|wall)_seconds":[^,}]*//g' "$1"; }
        cmp -s <(strip "$out/$tag-w1-r$rep.jsonl") <(strip "$out/$name.jsonl") ||
          { echo "async_workers: $name's metrics differ from one worker's" >&2; exit 1; }
      fi
    done
  done
  one=$(median <"$out/$tag-1.times")
  many=$(median <"$out/$tag-$workers.times")
  awk -v c="$comp" -v w="$workers" -v a="$one" -v b="$many" -v n="$clients" -v k="$per_round" \
    -v s="$steps" 'BEGIN {printf "{\"compressor\":\"%s\",\"clients\":%d,\"per_round\":%d,\"steps\":%d,\"workers\":%d,\"seconds_1\":%.2f,\"seconds_w\":%.2f,\"speedup\":%.3f}\n", c, n, k, s, w, a, b, a / b}'
done
