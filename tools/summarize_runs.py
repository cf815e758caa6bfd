#!/usr/bin/env python3
"""Summarizes Starling runs over seeds as a markdown table (docs/results.md).

    tools/summarize_runs.py [--reference dense] [--traffic uplink|total] DIR

DIR holds NAME-sSEED.jsonl metrics files (bench/learning_per_byte.sh writes them). For each NAME,
over its seeds: the test accuracy at the last evaluated round (mean, and half the spread between
the best and the worst seed after the +-), the mean over the last five evaluations, the uplink and
downlink megabytes of the whole run (mean over seeds), and how many times less uplink (or, with
--traffic total, uplink + downlink: split fine-tuning, bench/split_results.sh) than the reference
run NAME. Only runs whose seeds all reached the same last round are compared; a run with
fewer rounds than the longest is listed with its round count.

With --target ACC (a test accuracy in %), each run also gets the simulated time (the sum of its
records' sim_seconds up to its first evaluation at or above ACC) and the traffic (uplink +
downlink MB) it took to get there, as the mean over the seeds that got there ("n/m" seeds when
not all did), and how many times faster than the reference run it got there: the time-to-accuracy
of a synchronous and an asynchronous run (docs/results.md). Standard library only.
"""
import argparse
import collections
import json
import os
import re
import statistics
import sys

NAME = re.compile(r"^(?P<name>.+)-s(?P<seed>\d+)\.jsonl$")


def load(path, target=None):
    acc, up, down, last, sim, reached = [], 0, 0, 0, 0.0, None
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
            sim += float(rec.get("sim_seconds") or 0.0)
            if rec.get("test_accuracy") is not None:
                acc.append(100.0 * float(rec["test_accuracy"]))
                if target is not None and reached is None and acc[-1] >= target:
                    reached = (sim, (up + down) / 1e6)
    return acc, up, down, last, reached


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--reference", default="dense", help="the run the uplink reduction is against")
    p.add_argument("--traffic", choices=["uplink", "total"], default="uplink",
                   help="the reduction column compares uplink bytes or uplink + downlink bytes")
    p.add_argument("--target", type=float, help="test accuracy (%%) whose simulated time and traffic to report")
    a = p.parse_args()
    try:
        files = sorted(os.listdir(a.dir))
    except OSError as e:
        sys.exit(f"summarize_runs: cannot read {a.dir}: {e.strerror}")
    runs = collections.OrderedDict()
    for f in files:
        m = NAME.match(f)
        if m:
            runs.setdefault(m["name"], []).append((int(m["seed"]), load(os.path.join(a.dir, f), a.target)))
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
        got = [r[4] for _, r in seeds if r[4] is not None]
        rows[name]["to_target"] = (statistics.mean(t for t, _ in got), statistics.mean(b for _, b in got),
                                   len(got), len(seeds)) if got else (None, None, 0, len(seeds))
    ref = rows.get(a.reference)
    def traffic(r):
        return r["up"] + (r["down"] if a.traffic == "total" else 0.0)

    what = "uplink" if a.traffic == "uplink" else "traffic"
    extra = ""
    if a.target is not None:
        extra = (f" simulated s to {a.target:g}% | traffic MB to {a.target:g}% | faster to {a.target:g}% than"
                 f" {a.reference} |")
    print("| run | seeds | rounds | final accuracy (%) | mean of last 5 evaluations | uplink (MB) | downlink (MB) "
          f"| {what} vs {a.reference} |" + extra)
    print("|---|---|---|---|---|---|---|---|" + ("---|---|---|" if extra else ""))
    for name, r in rows.items():
        ok = ref and traffic(r) > 0 and ref["rounds"] == r["rounds"]
        less = f"{traffic(ref) / traffic(r):.1f}x less" if ok else ""
        seeds = ",".join(str(s) for s in r["seeds"])
        cols = ""
        if a.target is not None:
            t, b, n, m = r["to_target"]
            if t is None:
                cols = f" not reached (0/{m}) | | |"
            else:
                part = "" if n == m else f" ({n}/{m} seeds)"
                rt = ref["to_target"][0] if ref else None
                faster = f"{rt / t:.2f}x" if rt is not None and t > 0 and n == m and ref["to_target"][2] == ref["to_target"][3] else ""
                cols = f" {t:,.0f}{part} | {b:,.1f}{part} | {faster} |"
        print(f"| {name} | {seeds} | {r['rounds']} | {r['final']:.1f} ± {r['spread']:.1f} | {r['tail']:.1f} "
              f"| {r['up']:,.1f} | {r['down']:,.1f} | {less} |" + cols)


if __name__ == "__main__":
    main()
