#!/usr/bin/env python3
"""Error feedback in federated rounds (docs/compression.md, "Compression in federated rounds").

Runs starling-demo (softmax regression on Fashion-MNIST) for every compressor of the study under
each error-feedback variant, over several seeds, and writes one JSON object per run plus a
markdown table of the mean final accuracy (and the spread across seeds) per compressor and
variant. Every run is a fresh process; nothing is cached.

Usage:
  bench/ef_study.py [--demo build/bin/starling-demo] [--out ef_study.json] [--rounds 30]
                    [--seeds 1,2,3] [--setting iid10|niid100] [--compressors A;B] [--variants X;Y]

Settings:
  iid10    10 clients, IID, all take part every round (docs/compression.md's table)
  niid100  100 clients, Dirichlet(0.5), 10% per round: every client is absent 9 rounds in 10 on
           average, so its residual is stale when it comes back
  rare1000 1,000 clients, Dirichlet(0.5), 1% per round: a client takes part once in 100 rounds
A variant is appended to the compressor spec ("ef=false", "ef_decay=0.5", ...); "-" is the
compressor's own default. Standard library only (no numpy).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

COMPRESSORS = [
    "none",
    "topk:density=0.01",
    "stc:density=0.01",
    "randk:density=0.05",
    "randblock:density=0.05",
    "randblock:density=0.5",
    "sign",
    "qsgd:levels=4,ef=true",
    "powersgd:rank=2",
    "acpsgd:rank=2",
    "acpsgd:rank=4",
]
VARIANTS = ["ef=false", "ef=true,ef_decay=1,ef_preview=0,ef_max_age=0", "ef_decay=0.5", "ef_preview=1",
            "ef_preview=1,ef_decay=0.9", "-"]
SETTINGS = {
    "iid10": ["--clients", "10", "--fraction", "1", "--partition", "iid"],
    "niid100": ["--clients", "100", "--fraction", "0.1", "--partition", "dirichlet:alpha=0.5"],
    "rare1000": ["--clients", "1000", "--fraction", "0.01", "--partition", "dirichlet:alpha=0.5"],
}
FINAL = re.compile(r"final test accuracy ([0-9.]+)%.*uplink ([0-9.]+) MB")


def spec_with(compressor, variant):
    if variant == "-":
        return compressor
    if compressor in ("none",):
        return None
    sep = "," if ":" in compressor else ":"
    # a variant's ef= overrides the compressor's own
    base = compressor
    if "ef=" in variant and ",ef=" in base:
        base = base.replace(",ef=true", "").replace(",ef=false", "")
    return base + sep + variant


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo", default="build/bin/starling-demo")
    ap.add_argument("--out", default="ef_study.json")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--setting", default="iid10", choices=sorted(SETTINGS))
    ap.add_argument("--compressors", default=";".join(COMPRESSORS))
    ap.add_argument("--variants", default=";".join(VARIANTS))
    ap.add_argument("--extra", default="", help="more starling-demo arguments, space-separated")
    a = ap.parse_args()
    if not os.access(a.demo, os.X_OK):
        sys.exit(f"ef_study: {a.demo} is not an executable (build it: cmake --build build --target starling-demo)")
    seeds = [int(s) for s in a.seeds.split(",") if s]
    runs = []
    table = {}
    t0 = time.time()
    todo = [(c, v) for c in a.compressors.split(";") for v in a.variants.split(";")]
    for i, (comp, var) in enumerate(todo):
        spec = spec_with(comp, var)
        if spec is None or (comp == "none" and var != "-"):
            continue
        accs = []
        for seed in seeds:
            cmd = [a.demo, "--compressor", spec, "--rounds", str(a.rounds), "--seed", str(seed)] + SETTINGS[a.setting]
            cmd += a.extra.split()
            p = subprocess.run(cmd, capture_output=True, text=True)
            m = FINAL.search(p.stdout)
            if p.returncode != 0 or not m:
                sys.exit(f"ef_study: {' '.join(cmd)} failed (rc {p.returncode}):\n{p.stderr[-2000:]}")
            acc, mb = float(m.group(1)), float(m.group(2))
            accs.append(acc)
            runs.append({"setting": a.setting, "compressor": comp, "variant": var, "spec": spec, "seed": seed,
                         "rounds": a.rounds, "final_accuracy": acc, "uplink_mb": mb, "command": " ".join(cmd)})
        table[(comp, var)] = (statistics.mean(accs), (max(accs) - min(accs)) / 2, runs[-1]["uplink_mb"])
        print(f"[{i + 1}/{len(todo)} {time.time() - t0:5.0f} s] {spec:60s} {statistics.mean(accs):5.1f}%", file=sys.stderr)
    with open(a.out, "w") as f:
        json.dump({"setting": a.setting, "rounds": a.rounds, "seeds": seeds, "runs": runs}, f, indent=1)
    variants = a.variants.split(";")
    print(f"| compressor | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    for comp in a.compressors.split(";"):
        cells = []
        for v in variants:
            if (comp, v) in table:
                m, h, _ = table[(comp, v)]
                cells.append(f"{m:.1f} ± {h:.1f}" if len(seeds) > 1 else f"{m:.1f}")
            else:
                cells.append("")
        print(f"| {comp} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
