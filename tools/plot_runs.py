#!/usr/bin/python3
"""Plots Starling runs: test accuracy against the round, and against the cumulative bytes.

    tools/plot_runs.py --out runs.png dense=runs/dense.jsonl topk=runs/topk.jsonl
    tools/plot_runs.py --bytes total --out runs.png ...   (uplink + downlink)
    tools/plot_runs.py --time --bytes total --out runs.png ...   (left: simulated time)

Each argument is a metrics file (JSON Lines, one object per round, as starling-sim and
starling-server write with state.metrics), optionally labelled LABEL=FILE. Rounds without
test_accuracy (not evaluated that round) are skipped for accuracy but their uplink still counts.
Uses Debian's python3-matplotlib: run it with /usr/bin/python3.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402


def load(path, with_downlink=False, by_time=False):
    rounds, acc, uplink = [], [], []
    total, clock = 0, 0.0
    try:
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"plot_runs: {path}:{lineno}: not JSON: {e}")
                if "round" not in rec:
                    sys.exit(f"plot_runs: {path}:{lineno}: no 'round' field")
                total += int(rec.get("uplink_bytes", 0))
                if with_downlink:
                    total += int(rec.get("downlink_bytes", 0))
                clock += float(rec.get("sim_seconds") or 0.0)
                if rec.get("test_accuracy") is not None:
                    rounds.append(clock if by_time else int(rec["round"]))
                    acc.append(100.0 * float(rec["test_accuracy"]))
                    uplink.append(total / 1e6)
    except OSError as e:
        sys.exit(f"plot_runs: cannot read {path}: {e.strerror}")
    if not acc:
        sys.exit(f"plot_runs: {path} has no round with test_accuracy (set eval.every)")
    return rounds, acc, uplink


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="metrics files, LABEL=FILE or FILE")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--title", default="", help="a title above both plots")
    p.add_argument("--bytes", choices=["uplink", "total"], default="uplink",
                   help="the right plot's x axis: cumulative uplink, or uplink + downlink")
    p.add_argument("--time", action="store_true",
                   help="the left plot's x axis: simulated seconds (the sum of sim_seconds) instead of the round")
    a = p.parse_args()
    fig, (by_round, by_bytes) = plt.subplots(1, 2, figsize=(11, 4.2))
    for run in a.runs:
        label, _, path = run.rpartition("=")
        label = label or path
        rounds, acc, uplink = load(path, a.bytes == "total", a.time)
        by_round.plot(rounds, acc, marker="o", markersize=3, label=label)
        by_bytes.plot(uplink, acc, marker="o", markersize=3, label=label)
    by_round.set_xlabel("simulated time (s)" if a.time else "round (server step)")
    by_bytes.set_xlabel("cumulative uplink (MB)" if a.bytes == "uplink" else "cumulative uplink + downlink (MB)")
    by_bytes.set_xscale("log")
    for ax in (by_round, by_bytes):
        ax.set_ylabel("test accuracy (%)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    try:
        fig.savefig(a.out, dpi=120)
    except OSError as e:
        sys.exit(f"plot_runs: cannot write {a.out}: {e.strerror}")
    print(f"plot_runs: wrote {a.out}")


if __name__ == "__main__":
    main()
