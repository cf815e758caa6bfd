#!/usr/bin/python3
"""Converts FedScale's device traces into starling-sim's (docs/simulation.md, "Devices").

    tools/fedscale_traces.py --capacity client_device_capacity --behavior client_behave_trace \\
        --clients 100 --devices-out devices.csv --availability-out availability.csv

FedScale (Lai et al., ICML 2022) ships two pickled dictionaries keyed by its client ids:
  - client_device_capacity: {id: {'computation': ms per example (inference), 'communication': kbit/s}}
  - client_behave_trace:    {id: {'active': [t...], 'inactive': [t...], 'finish_time': P, ...}}
    a client is online at time t when active[i] <= t mod P <= inactive[i] for some i (seconds).
Starling's client c takes the profile of the c-th id in sorted order (modulo their number) from
each file (FedScale's own runs hand profiles out by their data set's client ids; Starling's
clients are numbered 0..N-1, so the mapping is this tool's, stated here). It writes:
  - DEVICES (devices.trace): client,speed,bandwidth,availability with speed such that a client's
    compute time equals FedScale's (augmentation x examples x ms / 1000: the backward pass counted
    as twice the forward), given sim.reference_seconds_per_example, and bandwidth in bytes/s
    (FedScale's kbit is 1024 bits);
  - AVAILABILITY (devices.availability_trace): client,period,start,end, one row per interval
    (intervals outside the period, reversed or of no length are left out: never online).
Standard library only (pickle); run it with any Python 3. A pickle can run code when loaded: only
convert files you trust (FedScale's own downloads).
"""
import argparse
import pickle
import sys


def load(path, what):
    try:
        with open(path, "rb") as f:
            data = pickle.load(f)
    except OSError as e:
        sys.exit(f"fedscale_traces: cannot read {what} {path}: {e.strerror}")
    except Exception as e:  # a corrupt or foreign pickle
        sys.exit(f"fedscale_traces: {path} is not a pickled {what}: {e}")
    if not isinstance(data, dict) or not data:
        sys.exit(f"fedscale_traces: {path}: expected a non-empty dictionary of clients, got {type(data).__name__}")
    return data


def number(value, where):
    try:
        v = float(value)
    except (TypeError, ValueError):
        sys.exit(f"fedscale_traces: {where}: '{value}' is not a number")
    if v != v or v in (float("inf"), float("-inf")):
        sys.exit(f"fedscale_traces: {where}: {v} is not finite")
    return v


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--capacity", required=True, help="FedScale's client_device_capacity pickle")
    p.add_argument("--behavior", help="FedScale's client_behave_trace pickle (optional)")
    p.add_argument("--clients", type=int, required=True, help="data.num_clients of the simulation")
    p.add_argument("--devices-out", required=True, help="the devices.trace CSV to write")
    p.add_argument("--availability-out", help="the devices.availability_trace CSV to write (needs --behavior)")
    p.add_argument("--reference-seconds-per-example", type=float, default=1e-3,
                   help="sim.reference_seconds_per_example of the simulation (default 1e-3)")
    p.add_argument("--augmentation", type=float, default=3.0,
                   help="FedScale's factor from inference to training time (default 3)")
    a = p.parse_args()
    if a.clients < 1:
        sys.exit("fedscale_traces: --clients must be at least 1")
    if not a.reference_seconds_per_example > 0 or not a.augmentation > 0:
        sys.exit("fedscale_traces: --reference-seconds-per-example and --augmentation must be positive")
    if bool(a.behavior) != bool(a.availability_out):
        sys.exit("fedscale_traces: --behavior and --availability-out go together")

    capacity = load(a.capacity, "device capacity")
    ids = sorted(capacity, key=str) if not all(isinstance(k, int) for k in capacity) else sorted(capacity)
    rows = []
    for c in range(a.clients):
        key = ids[c % len(ids)]
        prof = capacity[key]
        if not isinstance(prof, dict) or "computation" not in prof or "communication" not in prof:
            sys.exit(f"fedscale_traces: {a.capacity}: client {key}: no 'computation' and 'communication'")
        ms = number(prof["computation"], f"{a.capacity}: client {key}: computation")
        kbps = number(prof["communication"], f"{a.capacity}: client {key}: communication")
        if ms <= 0 or kbps <= 0:
            sys.exit(f"fedscale_traces: {a.capacity}: client {key}: computation and communication must be positive")
        speed = a.reference_seconds_per_example / (a.augmentation * ms / 1000.0)
        rows.append(f"{c},{speed:.9g},{kbps * 1024 / 8:.9g},1")
    out = []
    if a.behavior:
        behavior = load(a.behavior, "behaviour trace")
        bids = sorted(behavior, key=str) if not all(isinstance(k, int) for k in behavior) else sorted(behavior)
        for c in range(a.clients):
            key = bids[c % len(bids)]
            t = behavior[key]
            where = f"{a.behavior}: client {key}"
            if not isinstance(t, dict) or not all(k in t for k in ("active", "inactive", "finish_time")):
                sys.exit(f"fedscale_traces: {where}: no 'active', 'inactive' and 'finish_time'")
            period = number(t["finish_time"], f"{where}: finish_time")
            if period <= 0:
                sys.exit(f"fedscale_traces: {where}: finish_time must be positive")
            if not isinstance(t["active"], (list, tuple)) or not isinstance(t["inactive"], (list, tuple)):
                sys.exit(f"fedscale_traces: {where}: 'active' and 'inactive' must be lists of times")
            if len(t["active"]) != len(t["inactive"]):
                sys.exit(f"fedscale_traces: {where}: {len(t['active'])} 'active' times but {len(t['inactive'])} 'inactive'")
            kept = 0
            for s, e in zip(t["active"], t["inactive"]):
                s, e = number(s, f"{where}: active"), number(e, f"{where}: inactive")
                if s >= period or e <= max(s, 0.0):
                    continue  # outside the period (t mod P never reaches it), reversed, or empty
                s, e = max(s, 0.0), min(e, period)
                out.append(f"{c},{period:.9g},{s:.9g},{e:.9g}")
                kept += 1
            if kept == 0:
                sys.exit(f"fedscale_traces: {where}: no interval inside its period of {period:g} s")
    # Both files only once both were read whole.
    with open(a.devices_out, "w") as f:
        f.write(f"# FedScale's {a.capacity}, client c = the c-th id in sorted order, modulo {len(ids)}\n")
        f.write("client,speed,bandwidth,availability\n")
        f.write("\n".join(rows) + "\n")
    if a.behavior:
        with open(a.availability_out, "w") as f:
            f.write(f"# FedScale's {a.behavior}, client c = the c-th id in sorted order, modulo {len(bids)}\n")
            f.write("client,period,start,end\n")
            f.write("\n".join(out) + "\n")
    print(f"fedscale_traces: {a.clients} clients from {len(ids)} device profiles"
          + (f" and {len(bids)} behaviour traces" if a.behavior else ""))


if __name__ == "__main__":
    main()
