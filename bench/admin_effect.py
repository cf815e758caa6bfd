#!/usr/bin/env python3
"""Admitting and revoking a client in a running federation: how long until each takes effect, and
whether the rounds around it are disturbed (issue 41, "What to measure").

A root (starling-server, CURVE, synchronous rounds of every registered client, an admin socket)
and Python clients (starling.Client) whose fit takes FIT_MS of work. Two clients run; then, TRIALS
times: a new client's key is copied into the allow-list folder,
`starling-admin reload` is run, and the client is started once the command returned (a client
whose key was refused stops: libzmq does not try a refused key again); then the oldest client still
running is revoked with `starling-admin revoke ID`. Times come from the root's own log (one clock,
millisecond stamps): the command's line, the admitted client's "registered" line, the end of the
first round with its update, the revoked client's first refused message; and from this process
(the same machine's clock): when each command was sent and answered, when the new client started,
and when the revoked client's run() ended (UpstreamRefused). The rounds' own durations (the root's
round lines) before the first trial and during the trials say whether the rounds were disturbed.

    /usr/bin/python3 bench/admin_effect.py [--bin build/bin] [--trials 5] [--fit-ms 100] [--out F]
"""

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))


def stamp(line):
    """The root's log stamp [HH:MM:SS.mmm] as seconds of the day."""
    m = re.match(r"\[(\d\d):(\d\d):(\d\d)\.(\d{3})\]", line)
    return None if not m else (int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) + int(m[4]) / 1000)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--fit-ms", type=int, default=100)
    ap.add_argument("--out")
    a = ap.parse_args()
    os.environ["STARLING_BIN_DIR"] = os.path.abspath(a.bin)
    sys.path.insert(0, os.path.join(os.path.abspath(a.bin), "..", "python"))
    import numpy as np
    import starling
    import test_client as tc

    class Worker(starling.NumPyClient):
        def fit(self, parameters, config):
            time.sleep(a.fit_ms / 1000)  # the device's work
            return [p + np.float32(0.01) for p in parameters], 10, {"train_loss": 1.0}

    fed = tc.Federation()
    n_keys = 2 + a.trials
    if n_keys > 4:  # the Federation made client-0 .. client-3
        fed.keygen("--clients", str(n_keys - 4), "--first-id", "4")
    sock = os.path.join(fed.dir, "admin.sock")
    allow = fed.allow("allow-root", ["client-0", "client-1"])
    port = tc.free_port()
    fed.start("root", [
        "starling-server", "--server.bind", f"tcp://127.0.0.1:{port}",
        "--security.key", os.path.join(fed.keys, "server.key_secret"),
        "--security.clients", allow, *tc.SHAPE, "--train.rounds", "1000000",
        "--sampling.fraction", "1.0", "--sampling.min_available", "2", "--eval.every", "0",
        "--compression.compressor", "none", "--net.heartbeat_ms", "200",
        "--admin.socket", sock])
    clients, runs, ended = {}, {}, {}

    def start(i):
        clients[i] = starling.Client(Worker(), num_examples=10, **fed.client_kwargs(port, i))
        runs[i] = tc.run_in_thread(clients[i])

        def watch():
            runs[i]["thread"].join()
            ended[i] = time.time()
        threading.Thread(target=watch, daemon=True).start()

    def admin(*cmd):
        return subprocess.run([os.path.join(a.bin, "starling-admin"), "--socket", sock, *cmd],
                              capture_output=True, text=True, timeout=30)

    def log():
        return fed.log("root").splitlines()

    def wait_line(pattern, after, timeout=30):
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            for line in log():
                t = stamp(line)
                if t is not None and t >= after and re.search(pattern, line):
                    return t, line
            time.sleep(0.02)
        raise TimeoutError(pattern)

    def rounds_lines():
        out = []
        for line in log():
            m = re.search(r"round +(\d+)/\d+ +(\d+) updates.* ([\d.]+) s$", line)
            if m:
                out.append((stamp(line), int(m[1]), int(m[2]), float(m[3])))
        return out

    def day_seconds(t):
        d = datetime.datetime.fromtimestamp(t)
        return d.hour * 3600 + d.minute * 60 + d.second + d.microsecond / 1e6

    trials = []
    try:
        while not os.path.exists(sock):
            time.sleep(0.05)
        start(0)
        start(1)
        live = [0, 1]
        wait_line(r"round +20/", 0, 120)  # a baseline of rounds
        first_trial_at = rounds_lines()[-1][0]
        for k in range(a.trials):
            new = 2 + k
            # Its key listed, then reload; the client starts once starling-admin returned (a key
            # refused is final for a client: libzmq does not try it again).
            shutil.copy(os.path.join(fed.keys, f"client-{new}.key"), allow)
            t_sent = day_seconds(time.time())
            r = admin("reload")
            assert r.returncode == 0, r.stdout + r.stderr
            t_answered = day_seconds(time.time())
            t_cmd = max(stamp(l) for l in log() if "allow-list reloaded" in l)
            t_started = day_seconds(time.time())
            start(new)
            t_reg, _ = wait_line(rf"client {new} registered", t_cmd)
            t_part, _ = wait_line(r"round +\d+/\d+ +3 updates", t_reg)
            old = live.pop(0)
            live.append(new)
            t_rev_sent = day_seconds(time.time())
            r = admin("revoke", str(old))
            assert r.returncode == 0, r.stdout + r.stderr
            t_rev = max(stamp(l) for l in log() if f"client {old} revoked by" in l)
            t_refused, _ = wait_line(rf"client {old} was revoked by an operator", t_rev)
            until = time.monotonic() + 30
            while old not in ended and time.monotonic() < until:
                time.sleep(0.01)
            trials.append({
                "admitted": new, "revoked": old,
                "reload_sent_to_applied_ms": round(1000 * (t_cmd - t_sent)),
                "reload_sent_to_answered_ms": round(1000 * (t_answered - t_sent)),
                "client_start_to_registered_ms": round(1000 * (t_reg - t_started)),
                "reload_sent_to_first_round_with_it_ms": round(1000 * (t_part - t_sent)),
                "revoke_sent_to_applied_ms": round(1000 * (t_rev - t_rev_sent)),
                "revoke_to_first_refusal_ms": round(1000 * (t_refused - t_rev)),
                "revoke_to_client_stopped_ms": (round(1000 * (day_seconds(ended[old]) - t_rev))
                                                if old in ended else None),
            })
            print(json.dumps(trials[-1]), file=sys.stderr)
            wait_line(r"round +\d+/\d+ +2 updates", t_refused)  # the federation settles at two
            time.sleep(1.0)
        lines = rounds_lines()
        log_lines = log()
    finally:
        for c in clients.values():
            c.stop()
        fed.close()
    before = [d for t, _, _, d in lines if t < first_trial_at]
    during = [d for t, _, _, d in lines if t >= first_trial_at]
    result = {
        "trials": trials,
        "fit_ms": a.fit_ms,
        "median_ms": {k: statistics.median(t[k] for t in trials if t[k] is not None)
                      for k in trials[0] if k.endswith("_ms")},
        "rounds_before": len(before), "round_s_median_before": statistics.median(before),
        "rounds_during": len(during), "round_s_median_during": statistics.median(during),
        "round_s_max_during": max(during),
        # Updates per round during the trials: 2, 3 after an admission, 1 where a revocation
        # failed a task of the round in progress.
        "updates_per_round_during": {str(u): sum(1 for t, _, n, _ in lines
                                                 if t >= first_trial_at and n == u)
                                     for u in sorted({n for _, _, n, _ in lines})},
        "rounds_not_applied": sum(1 for l in log_lines if "not applied" in l),
    }
    print(json.dumps(result, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
