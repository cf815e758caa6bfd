#!/usr/bin/python3
"""Speed: clients trained per second by starling-sim against a plain PyTorch FedAvg loop,
measured side by side in one run (docs/performance.md, "Speed against a Python FedAvg loop").

One repetition runs every case once; the order of the cases rotates from one repetition to the
next, so that a drift of the machine's load hits all of them alike. Figures are medians over the
repetitions.

Threads: Debian's LibTorch and PyTorch multiply matrices with OpenBLAS (libopenblas0-pthread),
whose own thread pool (one thread per core unless OPENBLAS_NUM_THREADS says otherwise) is not
bounded by at::set_num_threads / torch.set_num_threads. A case named *_blas1 runs with
OPENBLAS_NUM_THREADS=1 in its environment; the others leave the environment as it is.

  python_default        bench/baselines/fedavg_loop.py, nothing set: PyTorch's default threads
  python_tN[_blas1]     the same with torch.set_num_threads(N), N = 1 .. nproc (best of all taken)
  bare_single[_blas1]   starling-torch-loop-bench's cnn_fit/bare_loop: a bare LibTorch loop of the
                        same CNN, at::set_num_threads(1), alone (epochs of 600 examples, batch 32,
                        lr 0.05); with _blas1 it really runs on one core
  bare_pair[_blas1]     two of those processes started together, their rates summed; bare_pair_blas1
                        is the compute limit of W = 2 one-thread workers on this machine
  starling_sim[_blas1]  starling-sim --config bench/baselines/speed.toml (W = 2 workers,
                        sim.threads = 1); time = the sum of the metrics' wall_seconds over the rounds
                        without a test-set evaluation (process start, data loading, the Gloo
                        rendezvous and the evaluation round are left out). starling_sim is the
                        program as shipped, the subject of the goals; starling_sim_blas1 shows what
                        bounding OpenBLAS's pool would give.

Python's time is likewise only its rounds (sampling, local training, averaging), data loading and
its final evaluation left out. A client is 600 examples x 1 epoch; bare loop samples/s are turned
into clients/s by dividing by 600.

Ratios against the speed goals (from the medians), for starling_sim and for starling_sim_blas1:
  / python_default                  >= 2.0
  / the best Python case            >= 1.3
  / compute limit                   >= 0.9, the limit being bare_pair_blas1 (measured: two
                                    concurrent one-core loops, the true limit on 2 cores) and,
                                    reported too, W x bare_single_blas1

For each case the JSON also records the CPU seconds of our own processes and the CPU seconds
used by everything else on the machine meanwhile (from /proc/stat): the latter is the noise of
other people's work on the shared cores.

  /usr/bin/python3 bench/speed_vs_python.py [--build-dir build-speed] [--reps 3] [--out FILE]

Needs Debian's python3-torch for the baseline: apt-get install python3-torch.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"  # Debian's interpreter, the one python3-torch installs into
BASELINE = os.path.join(ROOT, "bench", "baselines", "fedavg_loop.py")
CONFIG = os.path.join(ROOT, "bench", "baselines", "speed.toml")
SAMPLES_PER_CLIENT = 600  # 60,000 training examples / 100 clients, 1 epoch
WORKERS = 2
GOALS = {"vs_python_default": 2.0, "vs_python_best": 1.3, "vs_compute_limit": 0.9}


def die(msg):
    sys.exit("speed_vs_python: " + msg)


def check_prerequisites(build_dir):
    r = subprocess.run([PYTHON, "-c", "import torch"], capture_output=True, text=True)
    if r.returncode != 0:
        die(f"{PYTHON} cannot import torch: Debian's python3-torch is missing.\n"
            "  Install it with: apt-get install python3-torch\n"
            f"  ({r.stderr.strip().splitlines()[-1] if r.stderr.strip() else 'no error text'})")
    bins = {}
    for name in ("starling-sim", "starling-torch-loop-bench"):
        path = os.path.join(build_dir, "bin", name)
        if not os.access(path, os.X_OK):
            die(f"{path} is missing; build it first:\n"
                f"  cmake -S . -B {build_dir} -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTARLING_CUDA=OFF\n"
                f"  cmake --build {build_dir} -j2 --target starling-sim starling-torch-loop-bench")
        bins[name] = path
    return bins


def busy_ticks():
    """CPU time (ticks) spent by everything on the machine since boot, idle and iowait excluded."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest is counted inside user)
    return v[0] + v[1] + v[2] + v[5] + v[6]


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def measured(fn):
    """Runs fn() -> dict and adds wall time, own CPU seconds, others' CPU seconds, load average."""
    tick = os.sysconf("SC_CLK_TCK")
    c0, b0, t0 = children_cpu(), busy_ticks(), time.monotonic()
    out = fn()
    c1, b1, t1 = children_cpu(), busy_ticks(), time.monotonic()
    own = c1 - c0
    out["process_wall_s"] = t1 - t0
    out["own_cpu_s"] = own
    out["others_cpu_s"] = max(0.0, (b1 - b0) / tick - own)
    out["loadavg_after"] = loadavg()
    return out


def blas_env(blas1):
    env = dict(os.environ)
    if blas1:
        env["OPENBLAS_NUM_THREADS"] = "1"
    return env


def run_checked(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        die(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


def python_case(threads, blas1, rounds):
    def fn():
        cmd = [PYTHON, BASELINE, "--rounds", str(rounds)]
        if threads:
            cmd += ["--threads", str(threads)]
        if blas1:
            cmd += ["--blas-threads", "1"]
        res = json.loads(run_checked(cmd).strip().splitlines()[-1])
        return {"clients_per_s": res["clients_per_s"], "samples_per_s": res["samples_per_s"],
                "wall_seconds": res["wall_seconds"], "threads": res["threads"],
                "openblas_num_threads": res["openblas_num_threads"],
                "test_accuracy": res.get("test_accuracy"), "round_seconds": res["round_seconds"],
                "steady_clients_per_s": res.get("steady_clients_per_s")}
    return measured(fn)


def bare_cmd(bench, min_time):
    return [bench, "--benchmark_filter=^cnn_fit/bare_loop/", f"--benchmark_min_time={min_time}",
            "--benchmark_format=json", "--threads=1"]


def bare_rate(stdout):
    for b in json.loads(stdout)["benchmarks"]:
        if b["name"].startswith("cnn_fit/bare_loop"):
            return b["samples_per_s"]
    die("starling-torch-loop-bench printed no cnn_fit/bare_loop result")


def bare_case(bench, copies, blas1, min_time):
    def fn():
        procs = [subprocess.Popen(bare_cmd(bench, min_time), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=blas_env(blas1))
                 for _ in range(copies)]
        rates = []
        for p in procs:
            out, err = p.communicate()
            if p.returncode != 0:
                die(f"starling-torch-loop-bench failed (exit {p.returncode}):\n{err[-3000:]}")
            rates.append(bare_rate(out))
        total = sum(rates)
        return {"samples_per_s": total, "clients_per_s": total / SAMPLES_PER_CLIENT,
                "per_process_samples_per_s": rates}
    return measured(fn)


def sim_case(sim, blas1):
    def fn():
        with tempfile.TemporaryDirectory(prefix="starling-speed-") as tmp:
            metrics = os.path.join(tmp, "metrics.jsonl")
            run_checked([sim, "--config", CONFIG, "--state.metrics", metrics], cwd=tmp, env=blas_env(blas1))
            with open(metrics) as f:
                rounds = [json.loads(line) for line in f if line.strip()]
        timed = [r for r in rounds if "test_accuracy" not in r]
        if not timed:
            die("starling-sim wrote no round without an evaluation")
        secs = sum(r["wall_seconds"] for r in timed)
        clients = sum(r["clients_completed"] for r in timed)
        evals = [r["test_accuracy"] for r in rounds if "test_accuracy" in r]
        out = {"clients_per_s": clients / secs, "samples_per_s": clients * SAMPLES_PER_CLIENT / secs,
               "wall_seconds": secs, "timed_rounds": len(timed), "clients_trained": clients,
               "round_seconds": [r["wall_seconds"] for r in timed],
               "makespan_seconds": [r.get("makespan_seconds") for r in timed],
               "test_accuracy": evals[-1] if evals else None,
               "train_loss_last": rounds[-1].get("train_loss")}
        if len(timed) > 1:
            out["steady_clients_per_s"] = sum(r["clients_completed"] for r in timed[1:]) / sum(
                r["wall_seconds"] for r in timed[1:])
        return out
    return measured(fn)


def cpu_idle_fraction(seconds=2.0):
    with open("/proc/stat") as f:
        a = [int(x) for x in f.readline().split()[1:]]
    time.sleep(seconds)
    with open("/proc/stat") as f:
        b = [int(x) for x in f.readline().split()[1:]]
    d = [y - x for x, y in zip(a, b)]
    return (d[3] + d[4]) / max(1, sum(d[:8]))


def wait_quiet(max_wait):
    """Waits (up to max_wait seconds) until the machine is at least 90% idle for 2 s."""
    deadline = time.monotonic() + max_wait
    while True:
        idle = cpu_idle_fraction()
        if idle >= 0.9 or time.monotonic() >= deadline:
            return idle
        print(f"  machine busy (idle {idle:.0%}), waiting...", file=sys.stderr)
        time.sleep(10)


def median(xs):
    return statistics.median(xs) if xs else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build-speed"))
    p.add_argument("--reps", type=int, default=3, help="repetitions of every case (medians reported)")
    p.add_argument("--python-rounds", type=int, default=5,
                   help="rounds of the Python loop (starling-sim times 5 rounds: speed.toml's 6 less the evaluation round)")
    p.add_argument("--bare-min-time", type=float, default=5.0, help="seconds per bare-loop measurement")
    p.add_argument("--wait-quiet", type=float, default=0.0,
                   help="before each case wait up to this many seconds for a quiet machine (>= 90%% idle for 2 s)")
    p.add_argument("--out", default=None, help="JSON file (default: BUILD_DIR/speed_vs_python.json)")
    a = p.parse_args()
    if a.reps < 1:
        die("--reps must be at least 1")
    build_dir = os.path.abspath(a.build_dir)
    bins = check_prerequisites(build_dir)
    out_path = a.out or os.path.join(build_dir, "speed_vs_python.json")
    nproc = os.cpu_count() or 1

    bench = bins["starling-torch-loop-bench"]
    cases = {"python_default": lambda: python_case(0, False, a.python_rounds)}
    for t in range(1, nproc + 1):
        cases[f"python_t{t}"] = (lambda t=t: python_case(t, False, a.python_rounds))
        cases[f"python_t{t}_blas1"] = (lambda t=t: python_case(t, True, a.python_rounds))
    for blas1 in (False, True):
        sfx = "_blas1" if blas1 else ""
        cases["bare_single" + sfx] = (lambda b=blas1: bare_case(bench, 1, b, a.bare_min_time))
        cases["bare_pair" + sfx] = (lambda b=blas1: bare_case(bench, 2, b, a.bare_min_time))
        cases["starling_sim" + sfx] = (lambda b=blas1: sim_case(bins["starling-sim"], b))
    names = list(cases)

    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"speed_vs_python: {uptime_before}", file=sys.stderr)
    runs = {n: [] for n in names}
    reps = []
    for rep in range(a.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        reps.append({"order": order, "loadavg_before": loadavg()})
        for n in order:
            idle = wait_quiet(a.wait_quiet) if a.wait_quiet > 0 else None
            r = cases[n]()
            r["rep"] = rep
            r["idle_before"] = idle
            runs[n].append(r)
            print(f"  rep {rep + 1}/{a.reps} {n:18s} {r['clients_per_s']:6.3f} clients/s"
                  f"  ({r['samples_per_s']:7.1f} samples/s; others' CPU {r['others_cpu_s']:5.1f} s"
                  f" in {r['process_wall_s']:5.1f} s)", file=sys.stderr)
    uptime_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"speed_vs_python: {uptime_after}", file=sys.stderr)

    med = {n: median([r["clients_per_s"] for r in runs[n]]) for n in names}
    python_names = [n for n in names if n.startswith("python_")]
    best_name = max(python_names, key=med.get)
    limit_pair = med["bare_pair_blas1"]
    limit_single = WORKERS * med["bare_single_blas1"]

    def ratio(sim_name, den_value, den_per_rep, goal, **extra):
        sims = runs[sim_name]
        value = med[sim_name] / den_value
        return dict(value=value, goal=goal, met=value >= goal,
                    per_rep=[sims[i]["clients_per_s"] / den_per_rep(i) for i in range(a.reps)], **extra)

    ratios = {}
    for sim_name in ("starling_sim", "starling_sim_blas1"):
        ratios[sim_name] = {
            "vs_python_default": ratio(sim_name, med["python_default"],
                                       lambda i: runs["python_default"][i]["clients_per_s"],
                                       GOALS["vs_python_default"]),
            "vs_python_best": ratio(sim_name, med[best_name],
                                    lambda i: max(runs[n][i]["clients_per_s"] for n in python_names),
                                    GOALS["vs_python_best"], best=best_name),
            "vs_compute_limit": ratio(sim_name, limit_pair, lambda i: runs["bare_pair_blas1"][i]["clients_per_s"],
                                      GOALS["vs_compute_limit"],
                                      limit="bare_pair_blas1: two concurrent one-core bare loops, rates summed"),
            "vs_w_times_bare_single": ratio(sim_name, limit_single,
                                            lambda i: WORKERS * runs["bare_single_blas1"][i]["clients_per_s"],
                                            GOALS["vs_compute_limit"], limit="W x bare_single_blas1 (W = 2)"),
        }

    result = {
        "what": "speed: starling-sim W=2 vs a plain PyTorch FedAvg loop, same run",
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "machine": {"nproc": nproc, "uname": " ".join(os.uname())},
        "uptime_before": uptime_before,
        "uptime_after": uptime_after,
        "settings": {"reps": a.reps, "python_rounds": a.python_rounds, "bare_min_time": a.bare_min_time,
                     "config": os.path.relpath(CONFIG, ROOT), "workers": WORKERS,
                     "samples_per_client": SAMPLES_PER_CLIENT},
        "medians_clients_per_s": med,
        "medians_samples_per_s": {n: median([r["samples_per_s"] for r in runs[n]]) for n in names},
        "python_default_threads": runs["python_default"][0]["threads"],
        "python_default_openblas_num_threads": runs["python_default"][0]["openblas_num_threads"],
        "python_best": best_name,
        "compute_limit_clients_per_s": {"bare_pair": limit_pair, "w_times_bare_single": limit_single},
        "ratios": ratios,
        "repetitions": reps,
        "runs": runs,
    }
    # How much of the machine other people's work took while each case ran (CPU seconds of others
    # per second of wall time; 0 = quiet, 2 = both cores busy the whole time).
    result["others_cpu_per_wall_s"] = {n: [round(r["others_cpu_s"] / r["process_wall_s"], 3) for r in runs[n]]
                                       for n in names}
    with open(out_path, "w") as f:
        json.dump(result, f, indent=2)

    print(f"\nmedians of {a.reps} repetitions (clients/s; 1 client = {SAMPLES_PER_CLIENT} samples):", file=sys.stderr)
    for n in names:
        print(f"  {n:18s} {med[n]:7.3f}", file=sys.stderr)
    print(f"ratios (best Python case: {best_name}; compute limit: bare_pair_blas1):", file=sys.stderr)
    for sim_name, rs in ratios.items():
        for k, r in rs.items():
            print(f"  {sim_name:18s} {k:24s} {r['value']:5.2f}  (goal >= {r['goal']}: "
                  f"{'met' if r['met'] else 'NOT met'})", file=sys.stderr)
    worst = max(max(v) for v in result["others_cpu_per_wall_s"].values())
    print(f"others' CPU per wall second, worst case: {worst:.2f} (0 = quiet machine)", file=sys.stderr)
    print(f"written: {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
