#!/usr/bin/env bash
# The cost of SecAgg+ as the round grows (docs/performance.md, "Secure aggregation at 1,000 and
# 10,000 clients a round"): starling-sim with the real protocol among its simulated clients, on
# WORKERS workers, every client of a pool of N taking part in ROUNDS rounds (sampled:size=60 shards of
# Fashion-MNIST, the MODEL, dense updates of uniform weights), once in the clear and once under
# secagg.enabled. Per client a round: the uplink and downlink bytes, what secure aggregation adds
# to them (against the dense update's bytes), and the wall seconds the round took (one thread: the
# clients' training, masking and the server's unmasking, all on it), and the whole run's CPU
# seconds and peak memory (/usr/bin/time: start-up included, the same in both). Runs are skipped
# when their metrics file is complete, so the script resumes.
#
# Usage: bench/secagg_scale.sh [OUT] [BIN]
#   OUT  folder of the metrics files (default secagg-scale)
#   BIN  starling-sim (default build/bin/starling-sim)
# Environment: SIZES ("100 1000 10000"), ROUNDS (2), MODEL (mlp), CLIP (0.3), BITS_FOR (the ring's
# bits by size, "10000:33": at 10,000 clients of the MLP 32 bits would round away too much, and
# starling-sim refuses them with the bits it takes; 32 otherwise), WORKERS (1; each run's files
# are named by it from 2 on: n1000-secagg-w2.jsonl), THREAT (semi-honest; malicious-server runs
# the secure rounds with signed, certified keys and the signed unmask step, its files named
# n1000-secagg-signed.jsonl; the clear run is shared).
set -euo pipefail
out=${1:-secagg-scale}
bin=${2:-build/bin/starling-sim}
sizes=${SIZES:-100 1000 10000}
rounds=${ROUNDS:-2}
model=${MODEL:-mlp}
clip=${CLIP:-0.3}
bits_for=${BITS_FOR:-10000:33}
workers=${WORKERS:-1}
threat=${THREAT:-semi-honest}
tag=""
[ "$workers" = 1 ] || tag="-w$workers"
stag=""
[ "$threat" = semi-honest ] || stag="-signed"
bits_of() {
  local b
  for b in $bits_for; do [ "${b%%:*}" = "$1" ] && { echo "${b#*:}"; return; }; done
  echo 32
}
[ -x "$bin" ] || { echo "secagg_scale: $bin is not an executable (cmake --build build --target starling-sim)" >&2; exit 2; }
mkdir -p "$out"

for n in $sizes; do
  for mode in plain secagg; do
    mtag=$tag
    [ "$mode" = plain ] || mtag="$stag$tag"
    f="$out/n$n-$mode$mtag.jsonl"
    if [ -f "$f" ] && [ "$(wc -l < "$f")" -ge "$rounds" ]; then continue; fi
    rm -f "$f"
    if [ "$mode" = secagg ]; then
      extra=(--secagg.enabled true --secagg.clip "$clip" --secagg.bits "$(bits_of "$n")"
             --secagg.threat "$threat")
    else
      extra=(--aggregation.rule "fedavg:weight=uniform,clip=$clip")
    fi
    echo "secagg_scale: $n clients a round, $mode" >&2
    /usr/bin/time -o "$out/n$n-$mode$mtag.time" -f "%U %S %M" \
      "$bin" --model.spec "$model" --data.num_clients "$n" --data.partition sampled:size=60 \
      --sampling.clients_per_round "$n" --train.rounds "$rounds" \
      --train.lr 0.1 --train.batch_size 20 --compression.compressor none --eval.every 0 \
      --sim.workers "$workers" --sim.device cpu --state.metrics "$f" "${extra[@]}" > "$out/n$n-$mode$mtag.log" 2>&1
  done
done

python3 - "$out" "$tag" "$stag" $sizes <<'PY'
import json, sys, os
out, tag, stag, sizes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
print("| clients a round | uplink / client, plain | under SecAgg+ | added (of the dense update) "
      "| downlink / client, plain | under SecAgg+ | seconds a round, plain | under SecAgg+ "
      "| run's CPU s, plain | under SecAgg+ | peak memory, plain | under SecAgg+ |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for n in sizes:
    rows = {}
    for mode in ("plain", "secagg"):
        mtag = tag if mode == "plain" else stag + tag
        path = os.path.join(out, f"n{n}-{mode}{mtag}.jsonl")
        if not os.path.exists(path):
            break
        recs = [json.loads(l) for l in open(path)]
        done = sum(r["clients_completed"] for r in recs)
        user, system, rss = open(os.path.join(out, f"n{n}-{mode}{mtag}.time")).read().split()[-3:]
        rows[mode] = (sum(r["uplink_bytes"] for r in recs) / done,
                      sum(r["downlink_bytes"] for r in recs) / done,
                      sum(r["wall_seconds"] for r in recs) / len(recs),
                      float(user) + float(system), int(rss) / 1024)
    if len(rows) < 2:
        continue
    p, s = rows["plain"], rows["secagg"]
    print(f"| {int(n):,} | {p[0]:,.0f} B | {s[0]:,.0f} B | {s[0] - p[0]:,.0f} B ({100 * (s[0] - p[0]) / p[0]:.2f}%) "
          f"| {p[1]:,.0f} B | {s[1]:,.0f} B | {p[2]:.1f} | {s[2]:.1f} | {p[3]:.0f} | {s[3]:.0f} "
          f"| {p[4]:,.0f} MB | {s[4]:,.0f} MB |")
PY
