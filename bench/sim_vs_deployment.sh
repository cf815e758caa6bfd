#!/usr/bin/env bash
# A figure of docs/performance.md: one configuration run unchanged by starling-sim and as a real
# federation on this machine (examples/edge/run.sh: a root, two edge aggregators and ten clients,
# CURVE on), then both runs side by side as JSON:
#   - per round and at the end: test accuracy and training loss (the simulation evaluates on the
#     test set, the deployment on the clients' IID shares of it, which together are the test set);
#   - uplink bytes of the updates: the simulator's per-round uplink_bytes summed, against the bytes
#     of the updates the deployed clients made (each update once; their logs' "update bytes").
#
#   bench/sim_vs_deployment.sh [BUILD_DIR] [CONFIG] [OUT]
#     BUILD_DIR  default build;  CONFIG  default examples/edge/federation.toml (ten clients)
#     OUT        default BUILD_DIR/sim_vs_deployment.json
# The CNN configuration takes about 25 minutes on two cores (the two runs one after the other).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
config=${2:-$here/examples/edge/federation.toml}
out=${3:-$build/sim_vs_deployment.json}
work=$(mktemp -d /tmp/starling-svd.XXXXXX)
echo "sim_vs_deployment: $config; working folder $work" >&2

t0=$(date +%s.%N)
"$build/bin/starling-sim" --config "$config" --state.metrics "$work/sim.jsonl" >"$work/sim.log" 2>&1
t1=$(date +%s.%N)
STARLING_EDGE_CLEAN=0 "$here/examples/edge/run.sh" "$build" "$config" >"$work/deploy.out" 2>&1
t2=$(date +%s.%N)
edge=$(sed -n 's/^examples\/edge: working folder //p' "$work/deploy.out")

python3 - "$work/sim.jsonl" "$edge" "$config" "$out" "$t0" "$t1" "$t2" <<'EOF'
import glob, json, re, sys
sim_path, edge, config, out, t0, t1, t2 = sys.argv[1:]
def rounds(path):
    return [json.loads(l) for l in open(path) if l.strip()]
sim, dep = rounds(sim_path), rounds(edge + "/metrics.jsonl")
update_bytes = 0
for log in sorted(glob.glob(edge + "/client-*.log")):
    m = re.findall(r"(\d+) update bytes", open(log).read())
    if not m:
        sys.exit("no final 'update bytes' line in " + log)
    update_bytes += int(m[-1])
def last(rs, key):
    vals = [r[key] for r in rs if r.get(key) is not None]
    return vals[-1] if vals else None
res = {
    "config": config,
    "rounds": len(sim),
    "sim": {"final_test_accuracy": last(sim, "test_accuracy"), "final_train_loss": last(sim, "train_loss"),
            "uplink_update_bytes": sum(r["uplink_bytes"] for r in sim),
            "wall_seconds": float(t1) - float(t0)},
    "deployment": {"final_test_accuracy": last(dep, "test_accuracy"), "final_train_loss": last(dep, "train_loss"),
                   "uplink_update_bytes": update_bytes,
                   "root_uplink_bytes": sum(r["uplink_bytes"] for r in dep),
                   "wall_seconds": float(t2) - float(t1), "folder": edge},
    "per_round": [{"round": s["round"], "sim_accuracy": s.get("test_accuracy"), "deployment_accuracy": d.get("test_accuracy"),
                   "sim_loss": s.get("train_loss"), "deployment_loss": d.get("train_loss")} for s, d in zip(sim, dep)],
}
a, b = res["sim"]["final_test_accuracy"], res["deployment"]["final_test_accuracy"]
res["accuracy_gap_points"] = None if a is None or b is None else abs(a - b) * 100
res["uplink_equal"] = res["sim"]["uplink_update_bytes"] == update_bytes
json.dump(res, open(out, "w"), indent=1)
print(json.dumps({k: res[k] for k in ("rounds", "accuracy_gap_points", "uplink_equal")} |
                 {"sim": res["sim"], "deployment": res["deployment"]}, indent=1))
EOF
