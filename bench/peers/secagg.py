"""Secure aggregation beside Flower's (issue 40, docs/peers.md "Secure aggregation"): the demo task
(examples/sim/demo.toml's 100 clients, Dirichlet 0.5, one local epoch of SGD) with every client in
every round (100 a round), dense updates, run four ways, interleaved:

  starling-plain    starling-sim --config examples/sim/demo.toml --compression.compressor none
                    --sampling.clients_per_round 100 (examples-weighted FedAvg)
  starling-secagg   the same with --secagg.enabled true --secagg.clip CLIP (SecAgg+: k = 14
                    neighbours, t = 8, a 32-bit ring; uniform weights, as SecAgg+ sums them)
  flower-plain      bench/peers/flower_sim.py --setting best --clients-per-round 100 (Flower's
                    Message-API FedAvg, two Ray actors of one thread each: Flower's best here)
  flower-secagg     bench/peers/flower_sim.py --setting best --secagg: Flower's SecAgg+
                    (SecAggPlusWorkflow, secaggplus_mod; 15 shares, k + 1, and threshold 8 as
                    Starling's k and t; its weights the examples, max_weight the largest shard)

Each system's rounds' own time (its first round's start to its last round's end, every round
evaluated on the 10,000 test images, as each reports it; the first round included) and the wall
time of the whole command; rounds per second over the rounds' time; SecAgg+'s cost against the same
system's plain rounds; Starling's rounds per second against Flower's. The same split file for all
(starling-sim writes it; each run checks it).

  $VENV/bin/python bench/peers/secagg.py --starling-bin build/bin --out DIR [--rounds 5]
      [--models mlp,cnn] [--cases starling-plain,...] [--repeats 1] [--clip 10]
"""
import argparse
import json
import os
import statistics
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import run  # noqa: E402  (bench/peers/run.py: the measured run, the split, the summaries)

PROG = "secagg.py"
CASES = ["starling-plain", "starling-secagg", "flower-plain", "flower-secagg"]
PER_ROUND = 100
MODELS = {"mlp": "mlp:hidden=200", "cnn": "cnn"}


def starling_command(sim, a, model, secure, split, work):
    metrics = os.path.join(work, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [sim, "--config", run.DEMO, "--data.dir", a.data_dir, "--model.spec", MODELS[model],
           "--compression.compressor", "none", "--sampling.clients_per_round", str(PER_ROUND),
           "--train.rounds", str(a.rounds), "--eval.every", "1", "--state.metrics", metrics,
           "--data.split_file", os.path.join(work, "split-check.txt")]
    if secure:
        cmd += ["--secagg.enabled", "true", "--secagg.clip", str(a.clip)]

    def collect():
        rows = []
        if os.path.exists(metrics):
            with open(metrics) as f:
                rows = [json.loads(line) for line in f if line.strip()]
        return {"rounds": len(rows), "clients_trained": sum(r.get("clients_completed", 0) for r in rows),
                "loop_seconds": sum(r.get("wall_seconds", 0.0) for r in rows),
                "evals": [{"round": r["round"], "accuracy": r["test_accuracy"]} for r in rows
                          if "test_accuracy" in r],
                "uplink_bytes": sum(r.get("uplink_bytes", 0) for r in rows),
                "split_identical": run._same_split(split, os.path.join(work, "split-check.txt"))}

    return cmd, collect


def flower_command(a, model, secure, split, work):
    out = os.path.join(work, "result.json")
    if os.path.exists(out):
        os.remove(out)
    cmd = [sys.executable, os.path.join(HERE, "flower_sim.py"), "--split", split, "--data-dir", a.data_dir,
           "--rounds", str(a.rounds), "--clients-per-round", str(PER_ROUND), "--eval-every", "1",
           "--setting", "best", "--model", model, "--out", out]
    if secure:
        cmd.append("--secagg")

    def collect():
        if not os.path.exists(out):
            return {"error": "no result file"}
        with open(out) as f:
            return json.load(f)

    return cmd, collect


def main():
    p = argparse.ArgumentParser(description="SecAgg+ in Starling and in Flower, the demo task at 100 clients a round")
    p.add_argument("--starling-bin", default=os.path.join(run.ROOT, "build", "bin"))
    p.add_argument("--out", required=True, help="folder for the runs' logs and results.json")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--clip", type=float, default=10.0, help="Starling's secagg.clip (L2 norm of an update)")
    p.add_argument("--data-dir", default=common.DATA_DIR)
    a = p.parse_args()
    models = [m for m in a.models.split(",") if m]
    cases = [c for c in a.cases.split(",") if c]
    for m in models:
        if m not in MODELS:
            common.die(PROG, f"--models: {m} is not one of {', '.join(MODELS)}")
    for c in cases:
        if c not in CASES:
            common.die(PROG, f"--cases: {c} is not one of {', '.join(CASES)}")
    if a.rounds < 1 or a.repeats < 1 or not a.clip > 0:
        common.die(PROG, "--rounds and --repeats must be at least 1, --clip positive")
    run.check_peers_importable()
    sim = run.starling_sim(a.starling_bin)
    os.makedirs(a.out, exist_ok=True)
    split = os.path.join(a.out, "split.txt")
    run.write_split(sim, a, split, a.out, 1)

    results = []
    for rep in range(a.repeats):
        for model in models:
            order = cases[rep % len(cases):] + cases[:rep % len(cases)]  # rotate: drifts hit all alike
            for case in order:
                system, kind = case.split("-")
                work = os.path.join(a.out, f"{model}-{case}-{rep}")
                os.makedirs(work, exist_ok=True)
                secure = kind == "secagg"
                cmd, collect = (starling_command(sim, a, model, secure, split, work) if system == "starling"
                                else flower_command(a, model, secure, split, work))
                log = os.path.join(work, "log.txt")
                print(f"[{PROG}] {model} {case} (repeat {rep + 1})", flush=True)
                rc, wall, sampler = run.run_measured(cmd, log, 0.5)
                r = collect()
                r.update({"model": model, "case": case, "repeat": rep, "exit": rc, "wall_seconds": wall,
                          "peak_rss_mb": sampler.peak_rss / 2**20, "log": log})
                if rc != 0 or not r.get("rounds"):
                    print(f"[{PROG}] {case} failed (exit {rc}): see {log}", flush=True)
                results.append(r)
                with open(os.path.join(a.out, "results.json"), "w") as f:
                    json.dump(results, f, indent=1)

    def rps(model, case):
        rs = [r["rounds"] / r["loop_seconds"] for r in results
              if r["model"] == model and r["case"] == case and r.get("rounds") and r.get("loop_seconds")]
        return statistics.median(rs) if rs else None

    print("| model | system | plain: rounds/s | SecAgg+: rounds/s | SecAgg+ round / plain round | "
          "last accuracy, plain / SecAgg+ |")
    print("|---|---|---|---|---|---|")
    for model in models:
        for system in ("starling", "flower"):
            plain, secure = rps(model, f"{system}-plain"), rps(model, f"{system}-secagg")

            def acc(case):
                rs = [r for r in results if r["model"] == model and r["case"] == case and r.get("evals")]
                return f"{100 * rs[-1]['evals'][-1]['accuracy']:.2f}" if rs else "-"

            ratio = f"{plain / secure:.2f}x" if plain and secure else "-"
            print(f"| {model} | {system} | {plain or 0:.4f} | {secure or 0:.4f} | {ratio} | "
                  f"{acc(system + '-plain')} / {acc(system + '-secagg')} |")
        s, f = rps(model, "starling-secagg"), rps(model, "flower-secagg")
        if s and f:
            print(f"| {model} | Starling / Flower under SecAgg+ | | | **{s / f:.2f}x** rounds/s | |")


if __name__ == "__main__":
    main()
