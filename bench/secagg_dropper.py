"""bench/secagg_deploy.sh's secagg-drop configuration: clients lost after their masked input, in
every round. It polls the root's /status.json (status.listen; the root refreshes it every 250 ms)
every 50 ms; when a victim's count of accepted answers ("updates": one a phase, its masked input in
a secure round) grows during a round's "fit" step (the step that collects the masked inputs), it
kills that victim's starling-client (SIGKILL) and starts it again with the same options and its
id, as a device that crashes and comes back, once a round. The root sees it register again while
the round's steps go on and drops it from the round; its masked input is already in the sum, and
its neighbours' shares unmask it. It exits when the root's process is gone, leaving the restarted
clients to end on the root's Shutdown. Meant for rounds whose masked-input step lasts seconds (the
CNN's training), so that the kill lands before the unmask step.

  python3 bench/secagg_dropper.py --status HOST:PORT --root-pid PID --log FILE
      --victims ID:PID[,ID:PID...] -- STARLING-CLIENT [OPTIONS...]

A victim's PID may be a wrapper's (bench/secagg_deploy.sh starts each client under /usr/bin/time):
its starling-client child is the one killed. Only the processes named, their children and the
ones it started are ever signalled.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--status", required=True)
    p.add_argument("--root-pid", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--victims", required=True, help="ID:PID pairs, comma-separated")
    p.add_argument("client", nargs=argparse.REMAINDER, help="-- then starling-client and its options")
    a = p.parse_args()
    cmd = a.client[1:] if a.client[:1] == ["--"] else a.client
    if not cmd:
        sys.exit("secagg_dropper: no client command after --")
    victims = {}
    for item in a.victims.split(","):
        cid, pid = item.split(":")
        victims[int(cid)] = int(pid)
    log = open(a.log, "w")
    started = []
    updates = {}  # victim id -> its count of accepted answers when last seen
    dropped = {}  # victim id -> the last round it was dropped in
    kills = 0
    url = f"http://{a.status}/status.json"
    while alive(a.root_pid):
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                page = json.load(r)
        except (OSError, ValueError):
            time.sleep(0.05)
            continue
        rnd = page.get("round", {}).get("step_round", 0)
        step = page.get("round", {}).get("step", "idle")
        for peer in page.get("peers", []):
            cid = int(peer.get("id", -1))
            if cid not in victims:
                continue
            n = int(peer.get("updates", 0))
            grew = n > updates.get(cid, n)
            updates[cid] = n
            if not grew or step != "fit" or dropped.get(cid) == rnd:
                continue
            dropped[cid] = rnd
            for t in children(victims[cid]) or [victims[cid]]:  # the client under its wrapper
                try:
                    os.kill(t, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out = open(f"{a.log}.client-{cid}-round-{rnd}.log", "w")
            proc = subprocess.Popen(cmd + ["--client.id", str(cid)], stdout=out, stderr=subprocess.STDOUT)
            started.append(proc)
            victims[cid] = proc.pid
            kills += 1
            acc, want = page["round"].get("accepted", 0), page["round"].get("target", 0)
            # Still open (fewer answers than wanted): the kill lands before the unmask step.
            print(f"round {rnd}: client {cid} killed after its masked input, started again "
                  f"({acc} of {want} masked inputs in: {'step open' if acc < want else 'step may have closed'})",
                  file=log, flush=True)
        time.sleep(0.05)
    print(f"the root ended; {kills} kills", file=log, flush=True)
    for proc in started:  # they end on the root's Shutdown; a minute at most
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
