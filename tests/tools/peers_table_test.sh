#!/usr/bin/env bash
# bench/peers/run.py's table: per case the final accuracy and the mean of each run's last
# three evaluations, and each peer's gap to starling-dense seed by seed for both. The benchmark
# itself needs the peers' virtual environment; the table does not (psutil is stubbed here).
set -euo pipefail
script=$1
/usr/bin/python3 - "$script" <<'PY'
import importlib.util, os, sys, types
sys.modules["psutil"] = types.ModuleType("psutil")
path = sys.argv[1]
sys.path.insert(0, os.path.dirname(path))
spec = importlib.util.spec_from_file_location("peers_run", path)
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)

def r(case, seed, accs):
    evals = [{"round": 5 * (i + 1), "accuracy": a} for i, a in enumerate(accs)]
    return {"case": case, "seed": seed, "exit_status": 0, "evals": evals, "final_accuracy": accs[-1]}

runs = [r("starling-dense", 1, [0.50, 0.70, 0.80, 0.75]), r("starling-dense", 2, [0.5, 0.6, 0.7, 0.8]),
        r("flower-default", 1, [0.50, 0.60, 0.78, 0.79]), r("flower-default", 2, [0.5, 0.7, 0.6, 0.8]),
        {"case": "pfl-default", "seed": 1, "exit_status": 1, "evals": [], "final_accuracy": None}]
# Last three: starling 75.0 (seed 1) and 70.0 (seed 2); flower 72.33 and 70.0.
assert abs(run.tail_accuracy(runs[0]) - 75.0) < 1e-9, run.tail_accuracy(runs[0])
assert run.tail_accuracy({"evals": []}) is None
out = run.table(runs)
print(out)
rows = {l.split(" | ")[0][2:]: l.split(" | ") for l in out.splitlines() if l.startswith("| ") and "---" not in l}
assert rows["starling-dense"][10] == "77.50 ± 3.54", rows["starling-dense"][10]   # finals 75, 80
assert rows["starling-dense"][11] == "72.50", rows["starling-dense"][11]          # tails 75, 70
assert rows["flower-default"][11] == "71.17", rows["flower-default"][11]
# Gaps: final +4.00 and +0.00 (mean +2.00); tail -2.67 and +0.00 (mean -1.33).
gap = [l for l in out.splitlines() if l.startswith("- flower-default")]
assert gap == ["- flower-default - starling-dense: final +2.00 over seeds 1,2 (min +0.00, max +4.00); "
               "last 3 evaluations -1.33 over seeds 1,2 (min -2.67, max +0.00)"], gap
assert not [l for l in out.splitlines() if l.startswith("- pfl-default")]  # it failed: no gap
print("peers_table: ok")
PY
