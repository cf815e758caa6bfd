#!/usr/bin/env python3
"""Summarizes Starling runs over seeds as a markdown table (docs/results.md).

    tools/summarize_runs.py [--reference dense] [--traffic uplink|total] DIR

DIR holds NAME-sSEED.jsonl metrics files (bench/learning_per_byte.sh writes them). For each NAME,
over its seeds: the test accuracy at the last evaluated round (mean, and half the spread between
the best and the worst seed after the +-), the mean over the last five evaluations, the uplink and
downlink megabytes of the whole run (mean over seeds), and how many times less uplink (or, with
--traffic total, uplink + downlink: split fine-tuning, bench/split_results.sh) than the reference
run NAME. Only runs whose seeds all reached the same last round are compared; a run with
fewer rounds than the longest is listed with its round count. Standard library only.
"""
import argparse
import collections
import json
import os
import re
import statistics
import sys

NAME = re.compile(r"^(?P<name>.+)-s(?P<seed>\d+)\.jsonl$")


def load(path):
    acc, up, down, last = [], 0, 0, 0
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"summarize_runs: {path}:{lineno}: not JSON: {e}")
            up += int(rec.get("uplink_bytes", 0))
            down += int(rec.get("downlink_bytes", 0))
            last = max(last, int(rec.get("round", 0)))
            if rec.get("test_accuracy") is not None:
                acc.append(100.0 * float(rec["test_accuracy"]))
    return acc, up, down, last


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--reference", default="dense", help="the run the uplink reduction is against")
    p.add_argument("--traffic", choices=["uplink", "total"], default="uplink",
                   help="the reduction column compares uplink bytes or uplink + downlink bytes")
    a = p.parse_args()
    try:
        files = sorted(os.listdir(a.dir))
    except OSError as e:
        sys.exit(f"summarize_runs: cannot read {a.dir}: {e.strerror}")
    runs = collections.OrderedDict()
    for f in files:
        m = NAME.match(f)
        if m:
            runs.setdefault(m["name"], []).append((int(m["seed"]), load(os.path.join(a.dir, f))))
    if not runs:
        sys.exit(f"summarize_runs: no NAME-sSEED.jsonl file in {a.dir}")
    rows = {}
    for name, seeds in runs.items():
        seeds = [(s, r) for s, r in seeds if r[0]]
        if not seeds:
            continue
        finals = [r[0][-1] for _, r in seeds]
        tails = [statistics.mean(r[0][-5:]) for _, r in seeds]
        rows[name] = dict(seeds=sorted(s for s, _ in seeds), final=statistics.mean(finals),
                          spread=(max(finals) - min(finals)) / 2, tail=statistics.mean(tails),
                          up=statistics.mean(r[1] for _, r in seeds) / 1e6,
                          down=statistics.mean(r[2] for _, r in seeds) / 1e6,
                          rounds=min(r[3] for _, r in seeds))
    ref = rows.get(a.reference)
    def traffic(r):
        return r["up"] + (r["down"] if a.traffic == "total" else 0.0)

    what = "uplink" if a.traffic == "uplink" else "traffic"
    print("| run | seeds | rounds | final accuracy (%) | mean of last 5 evaluations | uplink (MB) | downlink (MB) "
          f"| {what} vs {a.reference} |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        ok = ref and traffic(r) > 0 and ref["rounds"] == r["rounds"]
        less = f"{traffic(ref) / traffic(r):.1f}x less" if ok else ""
        seeds = ",".join(str(s) for s in r["seeds"])
        print(f"| {name} | {seeds} | {r['rounds']} | {r['final']:.1f} ± {r['spread']:.1f} | {r['tail']:.1f} "
              f"| {r['up']:,.1f} | {r['down']:,.1f} | {less} |")


if __name__ == "__main__":
    main()
