"""`make bench-peers-scale` ("Scale against the peers", docs/performance.md): Starling's simulator, Flower's
Simulation Runtime and pfl with 1,000 and 100,000 clients in the pool, stateless and stateful:
startup time, time per round, peak memory of the whole process tree, or where and how a system
fails.

The task is the demo's (bench/peers/common.py): Fashion-MNIST, McMahan's CNN, 10 clients per
round, 1 local epoch of SGD (lr 0.05, batch 32); --rounds rounds (5), no evaluation (identical in
all three). The cross-device regime (issue 42): --clients-per-round 1000, and --model mlp for
Starling's mlp:hidden=200 in all three (bench/peers/common.py's make_mlp). The pools:
  1000     --data.num_clients 1000 --data.partition dirichlet:alpha=0.5
  100000   --data.num_clients 100000 --data.partition sampled:size=60 (Fashion-MNIST has 60,000
           examples: each client draws 60 with replacement)
starling-sim writes each pool's split (--data.split_file) and the peers read it.

Modes:
  stateless  dense FedAvg in all three.
  stateful   a per-client residual: top-k 1% with error feedback.
             starling: --compression.compressor topk:density=0.01; client states in its bounded
                       store (state.memory_bytes, default 256 MiB) that spills to disk.
             flower:   flower_sim.py --stateful: the residual (model-sized float32) in each node's
                       Context.state, which Flower's simulation keeps per node; top-k and error
                       feedback are our code (Flower ships no compressor).
             pfl:      pfl_sim.py --stateful: the residual in pfl's InMemoryUserStateStorage (the
                       per-user state its SCAFFOLD uses), top-k and error feedback our code.
Peers run at their 'best' setting of docs/peers.md (two clients training at once, one thread each),
Starling at the demo's (sim.workers 2, sim.threads 1), or with --starling-args (the low-memory
setting: one worker, client states spilled past 64 MiB; docs/performance.md).

Measured per run: startup (process start to the first round's start: wall minus the rounds' own
time minus nothing else, so it includes the exit too), time per round (median of rounds 2..N: the
first round is left out), peak RSS summed over the process tree (run.py's TreeSampler), and failure:
the exit status, the log's last error line, whether the time limit (--timeout) or the memory limit
(--max-rss-gb, the tree is killed when it is passed) was hit, and how far the run got.

  $VENV/bin/python bench/peers/scale.py --starling-bin build/bin [--pools 1000,100000]
      [--modes stateless,stateful] [--systems starling,flower,pfl] [--rounds 5] [--timeout 1200]
      [--clients-per-round 10] [--model cnn] [--out build/peers-scale.json]
"""
import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
import common  # noqa: E402

PROG = "scale.py"
try:
    import psutil
except ImportError:
    common.die(PROG, "psutil is missing: run this with the peers' virtual environment "
                     "(bash scripts/peers-venv.sh, then ${STARLING_PEERS_VENV:-~/.cache/starling/peers-venv}/bin/python)")
import run as peers_run  # noqa: E402  (TreeSampler, starling_sim, check_peers_importable, versions)

CLIENTS_PER_ROUND = 10
DEMO = os.path.join(ROOT, "examples", "sim", "demo.toml")
PARTITION = {1000: "dirichlet:alpha=0.5", 100000: "sampled:size=60"}


def partition_for(n):
    return PARTITION.get(n, "dirichlet:alpha=0.5" if n <= 60000 else "sampled:size=60")


def kill_tree(pid):
    """SIGKILL to the process `pid`, its process group and every descendant, each by pid: Flower's
    local SuperLink runs in a session of its own (`flwr run` detaches it; flower_sim.py keeps it in
    its tree as a subreaper), so the process group alone would leave it and Ray running."""
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        procs = []
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def run_limited(cmd, log_path, period, timeout, max_rss, env=None):
    """Runs cmd (its own process group) with a time and memory limit: (rc, wall, sampler, killed_by)."""
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                start_new_session=True)
        sampler = peers_run.TreeSampler(proc.pid, period)
        killed = None
        while proc.poll() is None:
            if time.perf_counter() - t0 > timeout:
                killed = f"time limit {timeout:.0f} s"
            elif sampler.peak_rss > max_rss:
                killed = f"memory limit {max_rss / 2**30:.1f} GiB"
            if killed:
                kill_tree(proc.pid)
                break
            time.sleep(0.2)
        rc = proc.wait()
        wall = time.perf_counter() - t0
        sampler.stop()
    return rc, wall, sampler, killed


def last_error(log_path):
    try:
        with open(log_path, errors="replace") as f:
            lines = [l.strip() for l in f if l.strip()]
    except OSError:
        return None
    keys = ("Error", "error", "Exception", "Killed", "OutOfMemory", "what():")
    hits = [l for l in lines if any(k in l for k in keys)]
    return (hits[-1] if hits else (lines[-1] if lines else ""))[:300]


def write_split(sim, a, n, path, log_dir):
    cmd = peers_run.split_command(sim, a.data_dir, path, ["--data.num_clients", str(n), "--data.partition", partition_for(n)])
    log = os.path.join(log_dir, f"split-{n}.log")
    rc, _, _, _ = run_limited(cmd, log, 1.0, a.timeout, a.max_rss_gb * 2**30)
    peers_run.require_split(PROG, rc, path, log)


def starling_cmd(sim, a, n, mode, work):
    metrics = os.path.join(work, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [sim, "--config", DEMO, "--data.dir", a.data_dir, "--data.num_clients", str(n),
           "--data.partition", partition_for(n), "--train.rounds", str(a.rounds), "--eval.every", "0",
           "--state.metrics", metrics, "--sampling.clients_per_round", str(a.clients_per_round),
           "--model.spec", "cnn" if a.model == "cnn" else "mlp:hidden=200",
           "--compression.compressor", "none" if mode == "stateless" else "topk:density=0.01"]
    cmd += shlex.split(a.starling_args)

    def collect():
        rows = []
        if os.path.exists(metrics):
            with open(metrics) as f:
                rows = [json.loads(l) for l in f if l.strip()]
        return {"rounds": len(rows), "round_seconds": [r.get("wall_seconds") for r in rows],
                "loop_seconds": sum(r.get("wall_seconds", 0.0) for r in rows)}

    return cmd, collect


def peer_cmd(a, system, n, mode, split, work):
    out = os.path.join(work, "result.json")
    if os.path.exists(out):
        os.remove(out)
    cmd = [sys.executable, os.path.join(HERE, f"{system}_sim.py"), "--split", split, "--data-dir", a.data_dir,
           "--rounds", str(a.rounds), "--clients-per-round", str(a.clients_per_round), "--model", a.model,
           # no evaluation within the run (pfl's evaluation_frequency must be > 0: rounds + 1 never comes)
           "--eval-every", str(a.rounds + 1),
           "--setting", "best", "--out", out]
    if mode == "stateful":
        cmd.append("--stateful")

    def collect():
        if not os.path.exists(out):
            return {"rounds": 0, "round_seconds": [], "loop_seconds": None}
        with open(out) as f:
            r = json.load(f)
        return {"rounds": r.get("rounds", 0), "round_seconds": [x["seconds"] for x in r.get("per_round", [])],
                "loop_seconds": r.get("loop_seconds"), "compressor": r.get("compressor")}

    return cmd, collect


def what_stateful(system):
    return {"starling": "top-k 1% with error feedback, residuals in the bounded client-state store "
                        "(state.memory_bytes, spills to disk)",
            "flower": "model-sized float32 residual in each node's Context.state (our top-k 1% + error feedback)",
            "pfl": "residual in pfl's InMemoryUserStateStorage (our top-k 1% + error feedback)"}[system]


def fmt(v, spec, none="-"):
    return none if v is None else format(v, spec)


def table(runs, per_round):
    out = ["| pool | mode | system | status | startup s | s/round (median r2..) | clients/s | peak RSS GiB | rounds done |",
           "|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for r in runs:
        status = "ok" if r["ok"] else f"FAILED: {r['failure']}"
        rate = per_round / r["seconds_per_round"] if r["seconds_per_round"] else None
        out.append(f"| {r['pool']:,} | {r['mode']} | {r['system']} | {status} | {fmt(r['startup_seconds'], '.1f')} | "
                   f"{fmt(r['seconds_per_round'], '.2f')} | {fmt(rate, '.0f')} | {r['peak_rss_bytes'] / 2**30:.2f} | "
                   f"{r['rounds_done']} |")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--starling-bin", required=True)
    p.add_argument("--data-dir", default=common.DATA_DIR)
    p.add_argument("--pools", default="1000,100000")
    p.add_argument("--modes", default="stateless,stateful")
    p.add_argument("--systems", default="starling,flower,pfl")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clients-per-round", type=int, default=CLIENTS_PER_ROUND,
                   help="clients a round (the cross-device regime of issue 42: 1000)")
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn",
                   help="every system's model: the task's CNN, or Starling's mlp:hidden=200")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per run before it counts as failed")
    p.add_argument("--max-rss-gb", type=float, default=18.0,
                   help="the process tree is killed (and the run failed) past this summed RSS")
    p.add_argument("--sample-seconds", type=float, default=0.5)
    p.add_argument("--starling-args", default="",
                   help="more starling-sim options, e.g. the low-memory setting: "
                        "'--sim.workers 1 --state.memory_bytes 67108864' (one worker, client states past "
                        "64 MiB spilled to disk)")
    p.add_argument("--out", default=os.path.join(ROOT, "build", "peers-scale.json"))
    a = p.parse_args()
    pools = [int(x) for x in a.pools.split(",") if x]
    modes = [m for m in a.modes.split(",") if m]
    systems = [s for s in a.systems.split(",") if s]
    for m in modes:
        if m not in ("stateless", "stateful"):
            common.die(PROG, f"unknown mode {m} (stateless, stateful)")
    for s in systems:
        if s not in ("starling", "flower", "pfl"):
            common.die(PROG, f"unknown system {s} (starling, flower, pfl)")
    if a.rounds < 2:
        common.die(PROG, "--rounds must be at least 2 (the first round is left out of the time per round)")
    for split in ("train", "t10k"):
        for kind in ("images-idx3", "labels-idx1"):
            common._find(a.data_dir, f"{split}-{kind}-ubyte", PROG)
    if any(s != "starling" for s in systems):
        peers_run.check_peers_importable()
    sim = peers_run.starling_sim(os.path.abspath(a.starling_bin))
    out = os.path.abspath(a.out)
    base = os.path.splitext(out)[0]
    log_dir = base + "-logs"
    os.makedirs(log_dir, exist_ok=True)

    runs = []
    for n in pools:
        split = f"{base}-split-{n}.txt"
        if not os.path.exists(split):
            print(f"{PROG}: starling-sim writes the split of {n} clients: {split}", flush=True)
            write_split(sim, a, n, split, log_dir)
        for mode in modes:
            for system in systems:
                work = os.path.join(log_dir, f"{system}-{mode}-{n}")
                os.makedirs(work, exist_ok=True)
                if system == "starling":
                    cmd, collect = starling_cmd(sim, a, n, mode, work)
                else:
                    cmd, collect = peer_cmd(a, system, n, mode, split, work)
                log = os.path.join(work, "log.txt")
                print(f"{PROG}: {n} clients, {mode}, {system} ...", flush=True)
                rc, wall, sampler, killed = run_limited(cmd, log, a.sample_seconds, a.timeout,
                                                        a.max_rss_gb * 2**30)
                r = collect()
                secs = [s for s in r["round_seconds"] if s is not None]
                per_round = statistics.median(secs[1:]) if len(secs) >= 2 else None
                loop = r.get("loop_seconds")
                ok = rc == 0 and killed is None and r["rounds"] == a.rounds
                failure = None
                if not ok:
                    failure = (f"killed at the {killed}" if killed else f"exit {rc}") + \
                              f" after {r['rounds']} of {a.rounds} rounds ({wall:.0f} s): {last_error(log)}"
                row = {"pool": n, "mode": mode, "system": system, "partition": partition_for(n),
                       "stateful_means": what_stateful(system) if mode == "stateful" else "dense FedAvg",
                       "ok": ok, "failure": failure, "exit_status": rc, "killed_by": killed,
                       "wall_seconds": wall, "loop_seconds": loop,
                       "startup_seconds": (wall - loop) if (ok and loop is not None) else None,
                       "seconds_per_round": per_round, "round_seconds": secs, "rounds_done": r["rounds"],
                       "peak_rss_bytes": sampler.peak_rss, "peak_pss_bytes": sampler.peak_pss,
                       "peak_processes": sampler.peak_procs, "cmd": cmd, "log": log}
                if system == "starling":
                    row["starling_args"] = a.starling_args
                runs.append(row)
                print(f"{PROG}:   {'ok' if ok else 'FAILED ' + failure}; wall {wall:.1f} s, per round "
                      f"{fmt(per_round, '.2f')} s, peak RSS {sampler.peak_rss / 2**30:.2f} GiB", flush=True)
                common.write_result(out, {"runs": runs, "partial": True})

    ratios = {}
    for n in pools:
        for mode in modes:
            s = [r for r in runs if r["pool"] == n and r["mode"] == mode and r["system"] == "starling" and r["ok"]]
            f = [r for r in runs if r["pool"] == n and r["mode"] == mode and r["system"] == "flower"]
            if s and f:
                ratios[f"{n}-{mode}"] = {"flower_over_starling_peak_rss": f[0]["peak_rss_bytes"] / s[0]["peak_rss_bytes"],
                                         "flower_ok": f[0]["ok"]}
    md = table(runs, a.clients_per_round)
    result = {"runs": runs, "flower_over_starling_rss": ratios, "rounds": a.rounds,
              "clients_per_round": a.clients_per_round, "model": a.model, "timeout_seconds": a.timeout, "max_rss_gb": a.max_rss_gb,
              "machine": {"cpus": os.cpu_count(), "mem_total_bytes": psutil.virtual_memory().total,
                          "loadavg_at_end": os.getloadavg()},
              "versions": peers_run.versions(sim) if any(s != "starling" for s in systems) else {},
              "table_markdown": md,
              "notes": "startup: wall minus the rounds' own time (process start to first round, plus the exit); "
                       "s/round: median of rounds 2..N; peak RSS summed over the process tree (Ray's processes "
                       "included); peers at their 'best' setting, Starling at the demo's plus --starling-args; no evaluation"}
    common.write_result(out, result)
    with open(base + ".md", "w") as f:
        f.write(md + "\n")
    print(md)
    for k, v in ratios.items():
        print(f"Flower / Starling peak RSS, {k}: {v['flower_over_starling_peak_rss']:.1f}x"
              + ("" if v["flower_ok"] else " (Flower failed; its RSS at the failure)"))
    print(f"{PROG}: wrote {out} and {base}.md (logs in {log_dir})")


if __name__ == "__main__":
    main()
