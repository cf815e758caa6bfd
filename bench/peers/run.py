"""`make bench-peers`: the same federated task run by Starling, Flower and pfl, interleaved, with
the same measurements for each (docs/peers.md).

The task is examples/sim/demo.toml: Fashion-MNIST, McMahan et al.'s CNN, 100 clients with
Dirichlet(0.5) label skew, 10 per round, 1 local epoch of SGD (lr 0.05, batch 32), central
evaluation of the test set every --eval-every rounds. starling-sim writes the split once
(--data.split_file) and every system trains those shards.

Cases (--cases, in this order within a pass; a pass is one seed of --seeds, repeated --repeats
times, and the order rotates by one each pass so a drift of the machine's load hits every case
alike):
  starling-dense   starling-sim --config examples/sim/demo.toml --compression.compressor none
  flower-default   bench/peers/flower_sim.py --setting default (`flwr run` of bench/peers/flower_app)
  pfl-default      bench/peers/pfl_sim.py --setting default
  starling-topk    starling-sim --config examples/sim/demo.toml (top-k 1% with error feedback)
  flower-best      bench/peers/flower_sim.py --setting best
  pfl-best         bench/peers/pfl_sim.py --setting best

Measured per run: the wall time of the whole command (process start to exit: start-up, data
loading, Ray's or Gloo's start, every round and evaluation), the rounds' own time (first round's
start to last round's end, as each system reports it), rounds/s and clients/s over both, the peak
of the memory of the whole process tree (RSS summed over every process: Flower's `flwr`, local
SuperLink, SuperExec and flwr-simulation, Ray's GCS, raylet and workers included, sampled every
--sample-seconds; PSS summed too, sampled every 5th time, which counts shared pages once), the
test accuracy at every evaluated round, and the bytes: exact for Starling (its metrics'
uplink_bytes / downlink_bytes), the serialized arrays for Flower, a dense float32 model per client
and direction for pfl (it simulates no transport). The peers also report their counters
(data_loads: the training set's loads and the threads of each process); a worker process that
loads the training set more than once is warned about (the peer would be handicapped).

Run it with the peers' virtual environment (scripts/peers-venv.sh):
  $VENV/bin/python bench/peers/run.py --starling-bin build/bin [--rounds 30] [--seeds 1,2,3] [--repeats 1]
      [--out build/peers.json] [--cases starling-dense,flower-best,...]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import common  # noqa: E402

PROG = "run.py"
CASES = ["starling-dense", "flower-default", "pfl-default", "starling-topk", "flower-best", "pfl-best"]
CLIENTS_PER_ROUND = 10  # examples/sim/demo.toml's sampling.clients_per_round
DEMO = os.path.join(ROOT, "examples", "sim", "demo.toml")

try:
    import psutil
except ImportError:
    common.die(PROG, "psutil is missing: run this with the peers' virtual environment "
                     "(bash scripts/peers-venv.sh, then ${STARLING_PEERS_VENV:-~/.cache/starling/peers-venv}/bin/python)")


def check_peers_importable():
    r = subprocess.run([sys.executable, "-c", "import flwr, pfl, ray, torch"], capture_output=True, text=True)
    if r.returncode != 0:
        last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "no error text"
        common.die(PROG, f"{sys.executable} cannot import flwr, pfl, ray and torch ({last}): run "
                         "bash scripts/peers-venv.sh and use its python")


def starling_sim(bin_dir):
    """The starling-sim binary; waits up to a minute when it is missing (a relink in progress)."""
    path = os.path.join(bin_dir, "starling-sim")
    for _ in range(60):
        if os.access(path, os.X_OK):
            return path
        time.sleep(1)
    common.die(PROG, f"{path} is missing: build it first (make build)")


class TreeSampler:
    """Samples the summed memory of a process and all its descendants in a thread."""

    def __init__(self, pid, period):
        self.root = psutil.Process(pid)
        self.period = period
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_procs = 0
        self.names = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self):
        try:
            return [self.root] + self.root.children(recursive=True)
        except psutil.Error:
            return []

    def _run(self):
        tick = 0
        while not self._stop.is_set():
            procs = self._tree()
            rss = pss = 0
            with_pss = tick % 5 == 0
            for pr in procs:
                try:
                    if with_pss:
                        m = pr.memory_full_info()
                        rss += m.rss
                        pss += m.pss
                    else:
                        rss += pr.memory_info().rss
                    self.names.add(pr.name())
                except psutil.Error:
                    pass
            self.peak_rss = max(self.peak_rss, rss)
            if with_pss:
                self.peak_pss = max(self.peak_pss, pss)
            self.peak_procs = max(self.peak_procs, len(procs))
            tick += 1
            self._stop.wait(self.period)

    def stop(self):
        self._stop.set()
        self._thread.join()


def run_measured(cmd, log_path, period, env=None):
    """Runs cmd with stdout and stderr into log_path; returns (exit status, wall seconds, sampler)."""
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        sampler = TreeSampler(proc.pid, period)
        rc = proc.wait()
        wall = time.perf_counter() - t0
        sampler.stop()
    return rc, wall, sampler


def split_command(sim, data_dir, split_path, pool=(), seed=1):
    """One short starling-sim run (1 dense round, no evaluation) that writes the split file of run
    seed `seed`; `pool`: the --data.* options of another pool than the demo's."""
    return [sim, "--config", DEMO, "--data.dir", data_dir, *pool, "--model.seed", str(seed), "--train.rounds", "1",
            "--eval.every", "0", "--compression.compressor", "none", "--data.split_file", split_path]


def require_split(prog, rc, split_path, log):
    if rc != 0 or not os.path.exists(split_path):
        common.die(prog, f"starling-sim could not write the split file {split_path} (exit {rc}; see {log})")


def write_split(sim, a, split_path, log_dir, seed):
    log = os.path.join(log_dir, f"split-seed{seed}.log")
    rc, _, _ = run_measured(split_command(sim, a.data_dir, split_path, seed=seed), log, 1.0)
    require_split(PROG, rc, split_path, log)


def starling_case(sim, a, case, split_path, work, seed):
    metrics = os.path.join(work, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [sim, "--config", DEMO, "--data.dir", a.data_dir, "--train.rounds", str(a.rounds),
           "--eval.every", str(a.eval_every), "--state.metrics", metrics, "--model.seed", str(seed),
           "--data.split_file", os.path.join(work, "split-check.txt")]
    if case == "starling-dense":
        cmd += ["--compression.compressor", "none"]

    def collect():
        rows = []
        if os.path.exists(metrics):
            with open(metrics) as f:
                rows = [json.loads(line) for line in f if line.strip()]
        same = _same_split(split_path, os.path.join(work, "split-check.txt"))
        return {
            "system": "starling",
            "setting": "demo (sim.workers 2, sim.threads 1)",
            "compressor": "none" if case == "starling-dense" else "topk:density=0.01 (error feedback)",
            "rounds": len(rows),
            "clients_trained": sum(r.get("clients_completed", 0) for r in rows),
            "loop_seconds": sum(r.get("wall_seconds", 0.0) for r in rows),
            "per_round": [{"round": r["round"], "seconds": r.get("wall_seconds"),
                           "train_loss": r.get("train_loss"),
                           "uplink_bytes": r.get("uplink_bytes"), "downlink_bytes": r.get("downlink_bytes")}
                          for r in rows],
            "bytes_note": "exact: starling-sim's metrics (uplink_bytes, downlink_bytes: encoded messages)",
            "evals": [{"round": r["round"], "accuracy": r["test_accuracy"], "loss": r.get("test_loss")}
                      for r in rows if "test_accuracy" in r],
            "split_identical": same,
        }

    return cmd, None, collect


def _same_split(a, b):
    def body(p):
        if not os.path.exists(p):
            return None
        with open(p) as f:
            return [line for line in f if not line.startswith("#")]

    x, y = body(a), body(b)
    return None if x is None or y is None else x == y


def peer_case(a, case, split_path, work, seed):
    system, setting = case.split("-")
    script = os.path.join(HERE, f"{system}_sim.py")
    out = os.path.join(work, "result.json")
    if os.path.exists(out):
        os.remove(out)
    cmd = [sys.executable, script, "--split", split_path, "--data-dir", a.data_dir, "--rounds", str(a.rounds),
           "--clients-per-round", str(CLIENTS_PER_ROUND), "--eval-every", str(a.eval_every),
           "--setting", setting, "--seed", str(seed), "--out", out]

    def collect():
        if not os.path.exists(out):
            return {"system": system, "setting": setting, "error": "no result file"}
        with open(out) as f:
            return json.load(f)

    return cmd, None, collect


def summarise(r, wall):
    rounds = r.get("rounds") or 0
    loop = r.get("loop_seconds") or 0
    clients = r.get("clients_trained") or 0
    evals = r.get("evals") or []
    pr = r.get("per_round") or []
    up = [x.get("uplink_bytes") for x in pr]
    down = [x.get("downlink_bytes") for x in pr]
    return {
        "wall_seconds": wall,
        "rounds_per_s_wall": rounds / wall if wall else None,
        "clients_per_s_wall": clients / wall if wall else None,
        "rounds_per_s_loop": rounds / loop if loop else None,
        "clients_per_s_loop": clients / loop if loop else None,
        "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "final_accuracy_round": evals[-1]["round"] if evals else None,
        "uplink_bytes_total": sum(up) if up and None not in up else None,
        "downlink_bytes_total": sum(down) if down and None not in down else None,
    }


def versions(sim):
    out = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    r = subprocess.run([sys.executable, "-m", "pip", "freeze", "--local"], capture_output=True, text=True)
    out["venv_pip_freeze"] = r.stdout.split()
    probe = ("import torch, numpy, flwr, ray, pfl.version as v; "
             "print(torch.__version__, numpy.__version__, flwr.__version__, ray.__version__, v.__version__, "
             "torch.__file__)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if r.returncode == 0:
        t, n, f, ray, p, tf = r.stdout.split()
        out.update(torch=t, torch_from=tf, numpy=n, flwr=f, ray=ray, pfl=p)
    for pkg in ("python3-torch", "python3-scipy"):
        d = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True)
        out[f"debian_{pkg}"] = d.stdout.strip() or None
    g = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True)
    out["starling_git"] = g.stdout.strip() or None
    out["starling_sim"] = sim
    return out


def fmt(v, spec):
    return "–" if v is None else format(v, spec)


def acc_summary(rs):
    vals = [100 * r["final_accuracy"] for r in rs if r.get("final_accuracy") is not None]
    if not vals:
        return "–"
    if len(vals) == 1:
        return f"{vals[0]:.2f}"
    return f"{statistics.mean(vals):.2f} ± {statistics.stdev(vals):.2f}"


TAIL = 3  # evaluations averaged for the steadier accuracy figure


def tail_accuracy(run, n=TAIL):
    """The mean test accuracy (%) of a run's last n evaluations: one evaluation of a curve that swings
    by several points between evaluations says less than the last few together. None without any."""
    evals = [e["accuracy"] for e in run.get("evals") or [] if e.get("accuracy") is not None]
    return 100 * statistics.mean(evals[-n:]) if evals else None


def accuracy_gaps(by_case):
    """Per peer case (the peers train dense): its accuracy minus starling-dense's, seed by seed,
    averaged over the seeds; the final evaluation's, and the mean of the last TAIL evaluations'."""
    def per_seed(case, value):
        out = {}
        for r in by_case.get(case, []):
            v = value(r) if r["exit_status"] == 0 else None
            if v is not None:
                out.setdefault(r.get("seed", 1), []).append(v)
        return {k: statistics.mean(v) for k, v in out.items()}

    def final(r):
        return None if r.get("final_accuracy") is None else 100 * r["final_accuracy"]

    lines = []
    for case in CASES:
        if case.startswith("starling"):
            continue
        parts = []
        for what, value in (("final", final), (f"last {TAIL} evaluations", tail_accuracy)):
            ref, mine = per_seed("starling-dense", value), per_seed(case, value)
            common_seeds = sorted(set(ref) & set(mine))
            if not common_seeds:
                continue
            d = [mine[k] - ref[k] for k in common_seeds]
            spread = f" (min {min(d):+.2f}, max {max(d):+.2f})" if len(d) > 1 else ""
            parts.append(f"{what} {statistics.mean(d):+.2f} over seeds {','.join(map(str, common_seeds))}{spread}")
        if parts:
            lines.append(f"- {case} - starling-dense: " + "; ".join(parts))
    return lines


def table(runs):
    """Markdown: one row per case, medians over its repetitions."""
    by_case = {}
    for run in runs:
        by_case.setdefault(run["case"], []).append(run)

    def med(rs, key, scale=1.0):
        vals = [r[key] for r in rs if r.get(key) is not None]
        return statistics.median(vals) * scale if vals else None

    lines = ["| case | runs | wall s | rounds s | rounds/s | clients/s | peak RSS MiB (all procs) | "
             f"peak PSS MiB | procs | accuracy by round | final acc | last {TAIL} evals | uplink MB | downlink MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case in CASES:
        rs = by_case.get(case)
        if not rs:
            continue
        ok = [r for r in rs if r["exit_status"] == 0]
        last = (ok or rs)[-1]
        accs = " ".join(f"{e['round']}:{100 * e['accuracy']:.1f}" for e in last.get("evals") or [])
        tails = [t for t in (tail_accuracy(r) for r in ok) if t is not None]
        lines.append("| {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            case, len(ok), "" if len(ok) == len(rs) else f" ({len(rs) - len(ok)} failed)",
            fmt(med(ok, "wall_seconds"), ".1f"), fmt(med(ok, "loop_seconds"), ".1f"),
            fmt(med(ok, "rounds_per_s_loop"), ".3f"), fmt(med(ok, "clients_per_s_loop"), ".2f"),
            fmt(med(ok, "peak_rss_bytes", 1 / 2**20), ".0f"), fmt(med(ok, "peak_pss_bytes", 1 / 2**20), ".0f"),
            fmt(med(ok, "peak_processes"), ".0f"), accs or "–",
            acc_summary(ok), fmt(statistics.mean(tails) if tails else None, ".2f"),
            fmt(med(ok, "uplink_bytes_total", 1e-6), ".1f"),
            fmt(med(ok, "downlink_bytes_total", 1e-6), ".1f")))
    lines.append("")
    lines.append("rounds s: the rounds' own time (first round's start to last round's end); rounds/s and "
                 "clients/s over it; wall s: the whole command. Medians over the runs; final acc: the mean "
                 "over the runs, ± the sample standard deviation when there are several; last "
                 f"{TAIL} evals: the mean of each run's last {TAIL} evaluations, over the runs.")
    gaps = accuracy_gaps(by_case)
    if gaps:
        lines.append("")
        lines.append("Accuracy against Starling's on the same seeds (points, mean over seeds; a seed "
                     f"counts where both runs ended): the final evaluation, and the mean of the last {TAIL}:")
        lines += gaps
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--starling-bin", default=os.path.join(ROOT, "build", "bin"),
                   help="folder holding starling-sim")
    p.add_argument("--out", default=os.path.join(ROOT, "build", "peers.json"))
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--eval-every", type=int, default=5,
                   help="central test-set evaluation every N rounds, every system (lowered to --rounds "
                        "when that is smaller, so a short run still has one)")
    p.add_argument("--repeats", type=int, default=1, help="runs of every case per seed")
    p.add_argument("--seeds", default="1",
                   help="comma-separated run seeds: each seed is its own split (starling-sim writes it), initial "
                        "model, client sampling and local shuffling, the same seed for every system")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
    p.add_argument("--data-dir", default=common.DATA_DIR)
    p.add_argument("--split", default=None,
                   help="an existing split file to use (default: starling-sim writes one next to --out)")
    p.add_argument("--sample-seconds", type=float, default=0.2, help="memory sampling period")
    a = p.parse_args()
    cases = [c for c in a.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        common.die(PROG, f"unknown case {bad[0]!r}; the cases are {', '.join(CASES)}")
    if a.rounds < 1 or a.repeats < 1 or a.eval_every < 1:
        common.die(PROG, "--rounds, --repeats and --eval-every must be at least 1")
    try:
        seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    except ValueError:
        common.die(PROG, f"--seeds {a.seeds!r}: expected comma-separated integers, e.g. 1,2,3")
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        common.die(PROG, f"--seeds {a.seeds!r}: expected distinct integers >= 0")
    if a.split and seeds != [1]:
        common.die(PROG, "--split names one split, of run seed 1; leave it out to use --seeds (each seed "
                         "writes its own split)")
    a.eval_every = min(a.eval_every, a.rounds)
    a.data_dir = os.path.abspath(a.data_dir)
    for split in ("train", "t10k"):
        for kind in ("images-idx3", "labels-idx1"):
            common._find(a.data_dir, f"{split}-{kind}-ubyte", PROG)
    check_peers_importable()
    # starling-sim runs the starling cases and writes the splits; peers alone on a given --split
    # do without it.
    need_sim = any(c.startswith("starling") for c in cases) or not a.split
    sim = starling_sim(os.path.abspath(a.starling_bin)) if need_sim else None

    out = os.path.abspath(a.out)
    base = os.path.splitext(out)[0]
    log_dir = base + "-logs"
    os.makedirs(log_dir, exist_ok=True)
    splits = {}
    if a.split:
        splits[1] = os.path.abspath(a.split)
        if not os.path.exists(splits[1]):
            common.die(PROG, f"split file {splits[1]} is missing (leave --split out and starling-sim writes one)")
    else:
        for seed in seeds:
            splits[seed] = base + ("-split.txt" if seed == 1 else f"-split-seed{seed}.txt")
            print(f"{PROG}: starling-sim writes the split of seed {seed}: {splits[seed]}", flush=True)
            write_split(sim, a, splits[seed], log_dir, seed)

    runs = []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    passes = [(seed, rep) for rep in range(a.repeats) for seed in seeds]
    for i, (seed, rep) in enumerate(passes):
        order = cases[i % len(cases):] + cases[:i % len(cases)]
        split_path = splits[seed]
        for case in order:
            work = os.path.join(log_dir, f"{case}-seed{seed}-{rep + 1}")
            os.makedirs(work, exist_ok=True)
            if case.startswith("starling"):
                cmd, env, collect = starling_case(sim, a, case, split_path, work, seed)
            else:
                cmd, env, collect = peer_case(a, case, split_path, work, seed)
            print(f"{PROG}: [{i + 1}/{len(passes)}] seed {seed} {case} ...", end=" ", flush=True)
            log = os.path.join(work, "log.txt")
            rc, wall, sampler = run_measured(cmd, log, a.sample_seconds, env)
            r = collect()
            run = {"case": case, "seed": seed, "repeat": rep + 1, "split_file": split_path, "command": cmd, "log": log, "exit_status": rc,
                   "peak_rss_bytes": sampler.peak_rss, "peak_pss_bytes": sampler.peak_pss or None,
                   "peak_processes": sampler.peak_procs, "process_names": sorted(sampler.names)}
            run.update(r)
            run.update(summarise(r, wall))
            runs.append(run)
            acc = run.get("final_accuracy")
            loads = run.get("max_train_loads_per_process")
            print(f"exit {rc}, {wall:.1f} s, peak RSS {sampler.peak_rss / 2**20:.0f} MiB"
                  + (f", accuracy {100 * acc:.2f}%" if acc is not None else "")
                  + (f", training-set loads per process {loads}" if loads is not None else "")
                  + ("" if rc == 0 else f" (see {log})"), flush=True)
            if loads is not None and loads > 1:
                print(f"{PROG}: WARNING: {case}: a worker process loaded the training set {loads} times "
                      "(data_loads in the JSON): the peer is handicapped, its figures do not count", flush=True)

    md = table(runs)
    doc = {
        "what": "bench/peers/run.py: examples/sim/demo.toml's task run by Starling, Flower and pfl",
        "started_utc": started,
        "rounds": a.rounds, "eval_every": a.eval_every, "repeats": a.repeats, "seeds": seeds,
        "clients": 100, "clients_per_round": CLIENTS_PER_ROUND,
        "split_files": {str(k): v for k, v in splits.items()},
        "versions": versions(sim),
        "runs": runs,
        "table_markdown": md,
    }
    common.write_result(out, doc)
    print()
    print(md)
    print(f"\n{PROG}: wrote {out} (logs in {log_dir})")
    if any(r["exit_status"] != 0 for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
