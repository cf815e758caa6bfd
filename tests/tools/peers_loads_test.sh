#!/usr/bin/env bash
# bench/peers/: no peer is handicapped by how the benchmark runs it. A 2-round run of
# Flower (flower_sim.py: `flwr run` of bench/peers/flower_app, 2 Ray actors) and of pfl
# (pfl_sim.py: 2 workers), both at --setting best, on a small split of 10 clients, 4 per round;
# the counters of their probe logs (bench/peers/common.py: note) must show:
#   - every process that loads the training set loads it once (Flower: once per Ray actor, not per
#     client message: 8 messages reach 2 actors; pfl: once per worker), and at most 2 such processes;
#   - the training processes on 1 PyTorch and 1 OpenBLAS thread each (as Starling bounds its
#     workers), Flower's central evaluation on 2 of each (its actors are idle then);
#   - the result JSON with every field run.py reads, and nothing left running afterwards.
# The same for Flower under its SecAgg+ (flower_sim.py --secagg: bench/peers/flower_secagg_app), the
# app bench/peers/secagg.py compares with starling-sim's secure aggregation.
# Needs the peers' virtual environment (bash scripts/peers-venv.sh) and the Fashion-MNIST data set;
# without either it exits 77, which ctest reports as skipped (SKIP_RETURN_CODE 77).
set -euo pipefail
peers=$(cd "$1" && pwd)  # bench/peers
venv=${STARLING_PEERS_VENV:-$HOME/.cache/starling/peers-venv}
data=${STARLING_PEERS_DATA:-/usr/share/datasets/fashion-mnist}
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import flwr, pfl, ray, psutil, torch' 2>/dev/null; then
  echo "peers_loads: skipped: no peers venv at $venv (bash scripts/peers-venv.sh makes it)"
  exit 77
fi
if [[ ! -e $data/train-labels-idx1-ubyte.gz && ! -e $data/train-labels-idx1-ubyte ]]; then
  echo "peers_loads: skipped: no Fashion-MNIST in $data (apt-get install dataset-fashion-mnist)"
  exit 77
fi
tmp=$(mktemp -d /tmp/peers_loads.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# 10 clients of 64 examples each (the first 640 of the training set).
"$venv/bin/python" -c '
import sys
with open(sys.argv[1], "w") as f:
    f.write("# peers_loads_test: 10 clients x 64 examples\n")
    for k in range(10):
        f.write(" ".join(str(64 * k + i) for i in range(64)) + "\n")
' "$tmp/split.txt"

common=(--split "$tmp/split.txt" --data-dir "$data" --rounds 2 --clients-per-round 4 --eval-every 2 --setting best)
status=0
"$venv/bin/python" "$peers/flower_sim.py" "${common[@]}" --out "$tmp/flower.json" > "$tmp/flower.log" 2>&1 || status=$?
if [[ $status -ne 0 ]]; then tail -30 "$tmp/flower.log"; echo "peers_loads: flower_sim.py exited with $status"; exit 1; fi
"$venv/bin/python" "$peers/flower_sim.py" "${common[@]}" --secagg --num-shares 3 --threshold 2 \
  --out "$tmp/flower-secagg.json" > "$tmp/flower-secagg.log" 2>&1 || status=$?
if [[ $status -ne 0 ]]; then tail -30 "$tmp/flower-secagg.log"; echo "peers_loads: flower_sim.py --secagg exited with $status"; exit 1; fi
"$venv/bin/python" "$peers/pfl_sim.py" "${common[@]}" --out "$tmp/pfl.json" > "$tmp/pfl.log" 2>&1 || status=$?
if [[ $status -ne 0 ]]; then tail -30 "$tmp/pfl.log"; echo "peers_loads: pfl_sim.py exited with $status"; exit 1; fi

"$venv/bin/python" - "$tmp" <<'PY'
import json, os, sys
tmp = sys.argv[1]
failed = []

def check(ok, what):
    print(("ok:   " if ok else "FAIL: ") + what)
    if not ok:
        failed.append(what)

for system, train_role in (("flower", "flower-clientapp"), ("flower-secagg", "flower-clientapp"),
                           ("pfl", "pfl-worker")):
    with open(os.path.join(tmp, f"{system}.json")) as f:
        r = json.load(f)
    loads = r["data_loads"]
    procs = loads["processes"]
    print(f"{system}: {json.dumps(procs)}")
    train = {pid: p["loads"].get("train", 0) for pid, p in procs.items() if p["loads"].get("train")}
    check(r["max_train_loads_per_process"] == 1 and all(n == 1 for n in train.values()),
          f"{system}: every process loads the training set once ({train})")
    check(1 <= len(train) <= 2, f"{system}: 1 or 2 processes load the training set ({len(train)})")
    trainers = [p for p in procs.values() if train_role in p["roles"]]
    check(len(trainers) == len(train) and all(p["torch_threads"] == 1 and p["blas_threads"] in (1, None)
                                              for p in trainers),
          f"{system}: training processes on 1 PyTorch and 1 OpenBLAS thread")
    for key in ("rounds", "clients_trained", "loop_seconds", "per_round", "evals", "bytes_note"):
        check(key in r, f"{system}: result has {key}")
    check(r["rounds"] == 2 and r["clients_trained"] == 8, f"{system}: 2 rounds of 4 clients")
    check(r["loop_seconds"] and r["loop_seconds"] > 0, f"{system}: loop_seconds measured")
    check(all(x.get("uplink_bytes") and x.get("downlink_bytes") for x in r["per_round"]), f"{system}: bytes per round")
    check([e["round"] for e in r["evals"]] == [2] and 0 <= r["evals"][0]["accuracy"] <= 1,
          f"{system}: one evaluation, after round 2")

for system in ("flower", "flower-secagg"):
    with open(os.path.join(tmp, f"{system}.json")) as f:
        r = json.load(f)
    server = [p for p in r["data_loads"]["processes"].values() if "flower-serverapp" in p["roles"]]
    check(len(server) == 1 and server[0]["torch_threads"] == 2 and server[0]["blas_threads"] in (2, None),
          f"{system}: central evaluation on 2 PyTorch and 2 OpenBLAS threads")
    check(os.path.basename(r["command"][0]) == "flwr" and r["command"][1] == "run",
          f"{system}: launched with flwr run")
    check(r["secagg"] == (system == "flower-secagg") and
          r["command"][2].endswith("flower_secagg_app" if r["secagg"] else "flower_app"),
          f"{system}: the app of its kind")
# Nothing that flower_sim.py started is still running (the SuperLink, Ray): no live process names
# the work folder (the SuperLink's log file and FLWR_HOME are in it).
left = []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        continue
    if tmp in cmd and state != "Z" and int(pid) != os.getpid():
        left.append(f"{pid}: {cmd[:120]}")
check(not left, f"nothing left running ({left})")
if failed:
    sys.exit(f"peers_loads: {len(failed)} check(s) failed")
print("peers_loads: ok")
PY
