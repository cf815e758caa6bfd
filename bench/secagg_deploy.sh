#!/usr/bin/env bash
# A figure of docs/privacy.md: the cost of secure aggregation (SecAgg+) in a real deployment on
# this machine, against the same federation without it, measured in the same run: a root
# (starling-server) and N client processes (starling-client) on 127.0.0.1, CURVE off (the same for
# both), dense updates with uniform weights, R rounds each way. Per configuration: the median round
# wall time (the root's records), uplink and downlink bytes per client per round, the root's CPU
# seconds and the clients' CPU seconds (from /proc), and the final test accuracy.
#
#   bench/secagg_deploy.sh [BUILD_DIR] [N] [ROUNDS] [MODEL] [OUT]
#     defaults: build, 50 clients, 5 rounds, mlp, BUILD_DIR/secagg_deploy.json
# Only processes this script started are ended (by pid).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
n=${2:-50}
rounds=${3:-5}
model=${4:-mlp}
out=${5:-$build/secagg_deploy.json}
work=$(mktemp -d /tmp/starling-secagg.XXXXXX)
echo "secagg_deploy: $n clients, $rounds rounds, $model; working folder $work" >&2

run() {  # run TAG PORT EXTRA...: each process under /usr/bin/time (its CPU seconds in a file)
  local tag=$1 port=$2
  shift 2
  local common=(--model.spec "$model" --data.num_clients "$n" --data.partition iid
                --security.insecure true)
  /usr/bin/time -f "%U %S" -o "$work/$tag-root.cpu" \
    "$build/bin/starling-server" "${common[@]}" --server.bind "tcp://127.0.0.1:$port" \
    --net.heartbeat_ms 500 --net.silence_ms 20000 \
    --train.rounds "$rounds" --sampling.clients_per_round "$n" --sampling.min_available "$n" \
    --compression.compressor none --eval.every "$rounds" --round.deadline_ms 600000 \
    --state.metrics "$work/$tag.jsonl" "$@" >"$work/$tag-root.log" 2>&1 &
  local root=$!
  local pids=()
  for ((i = 0; i < n; i++)); do
    /usr/bin/time -f "%U %S" -o "$work/$tag-client-$i.cpu" \
      "$build/bin/starling-client" "${common[@]}" --client.server "tcp://127.0.0.1:$port" \
      --client.id "$i" >"$work/$tag-client-$i.log" 2>&1 &
    pids+=($!)
  done
  wait "$root" || { echo "the root of $tag failed: $work/$tag-root.log" >&2; exit 1; }
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  echo "$tag $(awk '{print $1 + $2}' "$work/$tag-root.cpu") $(cat "$work/$tag"-client-*.cpu | awk '{s += $1 + $2} END {print s}')" >>"$work/cpu.txt"
}

tick=1
run plain 7811 --aggregation.rule fedavg:weight=uniform
run secagg 7812 --secagg.enabled true --secagg.clip 5

python3 - "$work" "$n" "$rounds" "$model" "$out" "$tick" <<'PY'
import json, statistics, sys
work, n, rounds, model, out, tick = sys.argv[1:]
n, tick = int(n), float(tick)
cpu = {l.split()[0]: (float(l.split()[1]) / tick, float(l.split()[2]) / tick) for l in open(work + "/cpu.txt")}
res = {"clients": n, "rounds": int(rounds), "model": model, "folder": work}
for tag in ("plain", "secagg"):
    recs = [json.loads(l) for l in open(f"{work}/{tag}.jsonl") if l.strip()]
    res[tag] = {
        "applied": sum(1 for r in recs if r["applied"]),
        "median_round_seconds": statistics.median(r["wall_seconds"] for r in recs),
        "uplink_bytes_per_client_round": statistics.median(r["uplink_bytes"] / max(r["clients_selected"], 1) for r in recs if "test_accuracy" not in r) if len(recs) > 1 else None,
        "downlink_bytes_per_client_round": statistics.median(r["downlink_bytes"] / max(r["clients_selected"], 1) for r in recs if "test_accuracy" not in r) if len(recs) > 1 else None,
        "root_cpu_seconds": cpu[tag][0],
        "clients_cpu_seconds": cpu[tag][1],
        "final_test_accuracy": [r.get("test_accuracy") for r in recs][-1],
    }
p, s = res["plain"], res["secagg"]
res["round_time_ratio"] = s["median_round_seconds"] / p["median_round_seconds"]
res["uplink_ratio"] = s["uplink_bytes_per_client_round"] / p["uplink_bytes_per_client_round"]
res["downlink_ratio"] = s["downlink_bytes_per_client_round"] / p["downlink_bytes_per_client_round"]
res["root_cpu_ratio"] = s["root_cpu_seconds"] / max(p["root_cpu_seconds"], 1e-9)
res["clients_cpu_ratio"] = s["clients_cpu_seconds"] / max(p["clients_cpu_seconds"], 1e-9)
json.dump(res, open(out, "w"), indent=1)
print(json.dumps(res, indent=1))
PY
