#!/usr/bin/env bash
# A figure of docs/privacy.md: the cost of secure aggregation (SecAgg+) in a real deployment on
# this machine, against the same federation without it, measured in the same run: a root
# (starling-server) and N client processes (starling-client) on 127.0.0.1, CURVE off (the same for
# both), dense updates with uniform weights, R rounds each way. Per configuration: the median round
# wall time (the root's records), uplink and downlink bytes per client per round, the root's CPU
# seconds and the clients' CPU seconds (from /proc), and the final test accuracy. A third
# configuration, secagg-drop, runs SecAgg+ with DROP clients (default 5% of N, at least 1) lost
# after their masked input in every round: bench/secagg_dropper.py reads the root's /status.json
# every 50 ms and, as soon as a victim's masked input has been accepted (its count of answers grew
# during the round's "fit" step, which collects the masked inputs), kills that client (SIGKILL) and
# starts it again, as a device that crashes and restarts; the restarted client declines the steps
# of a round it has no side of (a Reject), the root drops it from them, and its input, already in
# the sum, is unmasked by its neighbours' shares. The rounds wait for N - DROP registered. The CPU
# of a killed client's process up to its kill is counted, not that of its restarts; the JSON's
# kills lists each kill and whether the masked-input step was still open (so the kill came before
# the unmask). Meant for the CNN, whose masked-input step lasts the clients' training.
#
# Only processes this script started are ended (by pid).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
n=${2:-50}
rounds=${3:-5}
model=${4:-mlp}
out=${5:-$build/secagg_deploy.json}
drop=${DROP:-$(( n / 20 > 0 ? n / 20 : 1 ))}
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
  local watcher=
  if [ -n "${status_port:-}" ]; then  # secagg-drop: clients 0 .. drop-1 lost in every round
    python3 "$here/bench/secagg_dropper.py" --status "127.0.0.1:$status_port" --root-pid "$root" \
      --log "$work/$tag-dropper.log" --victims "$(for ((i = 0; i < drop; i++)); do printf '%s%d:%d' "${i:+,}" "$i" "${pids[$i]}"; done | sed 's/^,//')" -- \
      "$build/bin/starling-client" "${common[@]}" --client.server "tcp://127.0.0.1:$port" &
    watcher=$!
  fi
  wait "$root" || { echo "the root of $tag failed: $work/$tag-root.log" >&2; exit 1; }
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "$watcher" ] && { wait "$watcher" || { echo "the dropper of $tag failed: $work/$tag-dropper.log" >&2; exit 1; }; }
  echo "$tag $(awk '{print $1 + $2}' "$work/$tag-root.cpu") $(cat "$work/$tag"-client-*.cpu | awk '{s += $1 + $2} END {print s}')" >>"$work/cpu.txt"
}

tick=1
run plain 7811 --aggregation.rule fedavg:weight=uniform
run secagg 7812 --secagg.enabled true --secagg.clip 5
status_port=7814
# Rounds go on with N - DROP registered while the lost clients restart: wait for that many.
run secagg-drop 7813 --secagg.enabled true --secagg.clip 5 --status.listen "127.0.0.1:$status_port" \
  --sampling.min_available $(( n - drop ))
unset status_port

python3 - "$work" "$n" "$rounds" "$model" "$out" "$tick" "$drop" <<'PY'
import json, statistics, sys
work, n, rounds, model, out, tick, drop = sys.argv[1:]
n, tick = int(n), float(tick)
cpu = {l.split()[0]: (float(l.split()[1]) / tick, float(l.split()[2]) / tick) for l in open(work + "/cpu.txt")}
res = {"clients": n, "rounds": int(rounds), "model": model, "folder": work, "dropped_each_round": int(drop)}
for tag in ("plain", "secagg", "secagg-drop"):
    recs = [json.loads(l) for l in open(f"{work}/{tag}.jsonl") if l.strip()]
    res[tag] = {
        "applied": sum(1 for r in recs if r["applied"]),
        "median_round_seconds": statistics.median(r["wall_seconds"] for r in recs),
        "uplink_bytes_per_client_round": statistics.median(r["uplink_bytes"] / max(r["clients_selected"], 1) for r in recs if "test_accuracy" not in r) if len(recs) > 1 else None,
        "downlink_bytes_per_client_round": statistics.median(r["downlink_bytes"] / max(r["clients_selected"], 1) for r in recs if "test_accuracy" not in r) if len(recs) > 1 else None,
        "root_cpu_seconds": cpu[tag][0],
        "clients_cpu_seconds": cpu[tag][1],
        "final_test_accuracy": [r.get("test_accuracy") for r in recs][-1],
        "clients_completed": [r["clients_completed"] for r in recs],
        "clients_failed": [r["clients_failed"] for r in recs],
    }
p, s = res["plain"], res["secagg"]
res["round_time_ratio"] = s["median_round_seconds"] / p["median_round_seconds"]
res["uplink_ratio"] = s["uplink_bytes_per_client_round"] / p["uplink_bytes_per_client_round"]
res["downlink_ratio"] = s["downlink_bytes_per_client_round"] / p["downlink_bytes_per_client_round"]
res["root_cpu_ratio"] = s["root_cpu_seconds"] / max(p["root_cpu_seconds"], 1e-9)
res["clients_cpu_ratio"] = s["clients_cpu_seconds"] / max(p["clients_cpu_seconds"], 1e-9)
d = res["secagg-drop"]
res["drop_round_time_ratio"] = d["median_round_seconds"] / p["median_round_seconds"]
res["drop_root_cpu_ratio"] = d["root_cpu_seconds"] / max(p["root_cpu_seconds"], 1e-9)
kills = [l.strip() for l in open(f"{work}/secagg-drop-dropper.log") if "killed" in l]
res["kills"] = kills
res["kills_with_step_open"] = sum(1 for l in kills if "step open" in l)
json.dump(res, open(out, "w"), indent=1)
print(json.dumps(res, indent=1))
PY
