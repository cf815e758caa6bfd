#!/usr/bin/env bash
# The cross-device pool (docs/performance.md, "A pool that costs nothing until sampled"):
# starling-sim on Fashion-MNIST with a pool of N clients, each drawing 60 examples
# (sampled:size=60), PER_ROUND of them a round, ROUNDS rounds of the MODEL with dense FedAvg, one
# worker (one process: its peak resident memory is the run's), no evaluation. Per pool size: the
# peak resident memory (/usr/bin/time), the start-up (the run's wall time less its rounds' wall
# seconds from the metrics file: loading the data, drawing the pool, the first worker's set-up),
# the median round's wall seconds and clients per second. The same run at every pool size, so
# what grows with the pool is what the pool costs.
#
# Usage: bench/pool_scale.sh [OUT] [BIN]
#   OUT  folder of the logs and metrics files (default pool-scale)
#   BIN  starling-sim (default build/bin/starling-sim)
# Environment: POOLS ("100000 1000000 10000000"), PER_ROUND (1000), ROUNDS (3), MODEL (mlp),
# DATA (/usr/share/datasets/fashion-mnist), EXTRA (more starling-sim arguments).
set -euo pipefail
out=${1:-pool-scale}
bin=${2:-build/bin/starling-sim}
pools=${POOLS:-100000 1000000 10000000}
per_round=${PER_ROUND:-1000}
rounds=${ROUNDS:-3}
model=${MODEL:-mlp}
data=${DATA:-/usr/share/datasets/fashion-mnist}
extra=${EXTRA:-}
[ -x "$bin" ] || { echo "pool_scale: $bin is not an executable (cmake --build build --target starling-sim)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "pool_scale: needs /usr/bin/time (apt-get install time)" >&2; exit 2; }
mkdir -p "$out"
printf '| pool | clients a round | peak RSS, MB | start-up, s | round, s (median) | clients/s |\n'
printf '|---:|---:|---:|---:|---:|---:|\n'
for n in $pools; do
  log="$out/n$n.log" metrics="$out/n$n.jsonl"
  rm -f "$metrics"
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  /usr/bin/time -v "$bin" --data.dir "$data" --data.num_clients "$n" \
    --data.partition sampled:size=60 --model.spec "$model" --sampling.clients_per_round "$per_round" \
    --train.rounds "$rounds" --eval.every 0 --compression.compressor none --sim.workers 1 \
    --state.metrics "$metrics" $extra >"$log" 2>&1 || { echo "pool_scale: the run of $n failed, see $log" >&2; exit 1; }
  t1=$(date +%s.%N)
  python3 - "$log" "$metrics" "$n" "$per_round" "$t0" "$t1" <<'EOF'
import json, re, statistics, sys
log, metrics, n, per_round, t0, t1 = sys.argv[1:]
rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(log).read()).group(1))
walls = [json.loads(l)["wall_seconds"] for l in open(metrics) if l.strip()]
startup = float(t1) - float(t0) - sum(walls)
med = statistics.median(walls)
print(f"| {int(n):,} | {int(per_round):,} | {rss_kb / 1024:.0f} | {startup:.1f} | {med:.2f} | "
      f"{int(per_round) / med:.0f} |")
EOF
done
