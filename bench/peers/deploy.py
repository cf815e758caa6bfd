#!/usr/bin/env python3
"""Deployment against Flower: Flower's SuperLink with N SuperNodes against Starling's
root with N Python clients, on this machine, the same dense model update.

For each N of --clients (interleaved: Flower then Starling at each N), it starts
- Flower: `flower-superlink --insecure`, N `flower-supernode --insecure` (each its own runtime API
  port) and submits the Flower App in bench/peers/deploy_app/ with `flwr run` (the Deployment
  Runtime): FedAvg over all N nodes (fraction_fit=1.0, min_fit_clients = min_available_clients =
  N), no evaluation, a NumPyClient whose fit returns the received parameters plus a fixed delta;
- Starling: `starling-server` (root, insecure, the softmax layout, no compression, all N clients
  each round, no evaluation) and N Python processes running the same client logic through the
  `starling` package (docs/python.md),
all on 127.0.0.1. The model is Starling's `softmax` layout at rows x cols features and `classes`
classes (1 x 100000 x 10: fc.weight [10, 100000] + fc.bias [10] = 1,000,010 float32 values),
initialised at zero on both sides and sent dense both ways.

Measured per system and N: the wall time of the rounds from the server's own timing (Starling: the
metrics file's wall_seconds per round; Flower: the ServerApp's strategy stamps the end of each
round's aggregate_fit, see deploy_app/starling_deploy_app/server_app.py), updates ingested per
second = N x rounds / time over rounds 2..R (round 1 holds the first registration on Starling's
side, and the first FAB fetch and app start on Flower's) and over all R rounds, the peak RSS of
the server processes (SuperLink, Flower's SuperExec and ServerApp, apart and together; Starling's
root) and the total RSS of everything started (clients included), sampled with psutil every
--sample-interval seconds. Every process started is killed by pid at the end, on error and on
Ctrl-C. Output: JSON (--out) and a Markdown table (--md, default: --out with .md).

Run with the peers' virtual environment (scripts/peers-venv.sh; `make bench-peers-deploy`):
    ~/.cache/starling/peers-venv/bin/python bench/peers/deploy.py --clients 10,100 --rounds 5
"""
import argparse
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
APP_DIR = os.path.join(HERE, "deploy_app")
sys.path.insert(0, APP_DIR)


def die(msg):
    print(f"deploy.py: {msg}", file=sys.stderr)
    sys.exit(2)


# --- the Starling client process (deploy.py --starling-client ...) --------------------------------

def starling_client_main(a):
    import starling  # noqa: PLC0415 (PYTHONPATH=build/python, set by the parent)
    from starling_deploy_app import logic  # noqa: PLC0415

    class DeltaClient(starling.NumPyClient):
        def fit(self, parameters, config):
            return logic.fit(parameters), logic.NUM_EXAMPLES, {}

    layout = starling.model_layout("softmax", a.rows, a.cols, a.classes)
    shapes = [tuple(s) for _, s in layout]
    if shapes != [tuple(s) for s in logic.softmax_shapes(a.rows, a.cols, a.classes)]:
        die(f"starling.model_layout gives {shapes}, the Flower app assumes other shapes")
    starling.start_client(DeltaClient(), server=f"tcp://127.0.0.1:{a.port}", client_id=a.client_id,
                          layout=layout, num_examples=logic.NUM_EXAMPLES, insecure=True, log_level="warn")


# --- processes -------------------------------------------------------------------------------------

class Procs:
    """Every process this run starts, by role; kill() ends them and their descendants by pid."""

    def __init__(self):
        self.items = []  # (role, Popen)
        self.all = []  # every (role, Popen) ever started
        self.maxrss = {}  # pid -> ru_maxrss in bytes, once reaped
        self.lock = threading.Lock()

    def start(self, role, cmd, log_path, env=None):
        log = open(log_path, "ab")
        try:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, cwd=os.path.dirname(log_path))
        finally:
            log.close()
        with self.lock:
            self.items.append((role, p))
            self.all.append((role, p))
        return p

    def reap(self, p, block=False):
        """Reaps a started process with wait4, keeping the kernel's peak RSS of it (ru_maxrss,
        the process itself, not its descendants) in self.maxrss[pid]; its exit code, or None while
        it runs."""
        if p.returncode is not None:
            return p.returncode
        try:
            pid, status, ru = os.wait4(p.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return p.poll()
        if pid == 0:
            return None
        self.maxrss[p.pid] = ru.ru_maxrss * 1024
        p.returncode = os.waitstatus_to_exitcode(status)
        return p.returncode

    def peak_by_role(self):
        """role -> the largest ru_maxrss among that role's reaped processes."""
        out = {}
        for role, p in self.all:
            if p.pid in self.maxrss:
                out[role] = max(out.get(role, 0), self.maxrss[p.pid])
        return out

    def kill(self):
        """SIGTERM to every started process and its descendants (by pid), SIGKILL after 5 s; the
        started ones are reaped with wait4 (their ru_maxrss kept), the descendants by psutil."""
        import psutil  # noqa: PLC0415
        with self.lock:
            items, self.items = self.items, []
        descendants, tops = [], []
        for _, p in items:
            if p.returncode is not None:
                continue
            try:
                top = psutil.Process(p.pid)
                descendants.extend(top.children(recursive=True))
                tops.append((p, top))
            except psutil.NoSuchProcess:
                pass
        for q in descendants + [t for _, t in tops]:
            try:
                q.terminate()
            except psutil.NoSuchProcess:
                pass
        t_end = time.monotonic() + 5
        for p, _ in tops:
            while self.reap(p) is None and time.monotonic() < t_end:
                time.sleep(0.02)
        _, alive = psutil.wait_procs(descendants, timeout=max(0.1, t_end - time.monotonic()))
        for q in alive + [t for p, t in tops if p.returncode is None]:
            try:
                q.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        for p, _ in tops:
            if p.returncode is None:
                self.reap(p, block=True)


class Sampler(threading.Thread):
    """Every `interval` s: the RSS of each started process and its descendants, summed by role
    (role_of(top_role, process) names a descendant's role). Keeps the peak of each role's sum, the
    peak of given role groups' sums taken at the same instant, and the lowest MemAvailable."""

    def __init__(self, procs, role_of, groups, interval):
        super().__init__(daemon=True)
        self.procs, self.role_of, self.groups, self.interval = procs, role_of, groups, interval
        self.peak = {}
        self.peak_group = {g: 0 for g in groups}
        self.peak_count = {}
        self.min_available = None
        self.samples = 0
        self.stop_evt = threading.Event()
        self.cache = {}  # pid -> (psutil.Process, role)
        self.last_scan = 0.0
        self.last_started = 0

    def scan(self):
        import psutil  # noqa: PLC0415
        with self.procs.lock:
            tops = list(self.procs.items)
        seen = {}
        for role, p in tops:
            try:
                top = self.cache.get(p.pid, (None,))[0] or psutil.Process(p.pid)
                seen[p.pid] = (top, role)
                for c in top.children(recursive=True):
                    if c.pid in self.cache:
                        seen[c.pid] = self.cache[c.pid]
                    else:
                        try:
                            seen[c.pid] = (c, self.role_of(role, " ".join(c.cmdline())))
                        except psutil.Error:
                            pass
            except psutil.Error:
                pass
        self.cache = seen

    def run(self):
        import psutil  # noqa: PLC0415
        while not self.stop_evt.is_set():
            now = time.monotonic()
            with self.procs.lock:
                started = len(self.procs.items)
            if now - self.last_scan > 1.0 or started != self.last_started:  # new descendants: each second
                self.scan()
                self.last_scan, self.last_started = now, started
            sums, counts = {}, {}
            for proc, role in list(self.cache.values()):
                try:
                    rss = proc.memory_info().rss
                except psutil.Error:
                    continue
                sums[role] = sums.get(role, 0) + rss
                counts[role] = counts.get(role, 0) + 1
            for role, v in sums.items():
                self.peak[role] = max(self.peak.get(role, 0), v)
                self.peak_count[role] = max(self.peak_count.get(role, 0), counts[role])
            for g, roles in self.groups.items():
                self.peak_group[g] = max(self.peak_group[g], sum(sums.get(r, 0) for r in roles))
            avail = psutil.virtual_memory().available
            self.min_available = avail if self.min_available is None else min(self.min_available, avail)
            self.samples += 1
            self.stop_evt.wait(self.interval)

    def stop(self):
        self.stop_evt.set()
        self.join(timeout=5)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n):
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def wait_port(port, timeout, proc=None):
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def wait_logs(paths, text, timeout):
    t_end = time.monotonic() + timeout
    pending = list(paths)
    while pending and time.monotonic() < t_end:
        pending = [p for p in pending if text.encode() not in open(p, "rb").read()] if pending else []
        time.sleep(0.2)
    return not pending


class MemoryShort(RuntimeError):
    pass


def check_memory(floor_mb, what):
    import psutil  # noqa: PLC0415
    avail = psutil.virtual_memory().available / 2**20
    if avail < floor_mb:
        raise MemoryShort(f"{what}: only {avail:.0f} MiB of memory available (floor {floor_mb} MiB); stopped")


def mib(x):
    return round(x / 2**20, 1) if x is not None else None


def record_peaks(res, sampler, t0):
    """What every run records when it ends: its wall time and the sampler's peaks (per role, process
    counts, per group)."""
    res["wall_total_s"] = round(time.monotonic() - t0, 2)
    res["rss_peak_mib"] = {k: mib(v) for k, v in sorted(sampler.peak.items())}
    res["process_count_peak"] = dict(sorted(sampler.peak_count.items()))
    res["rss_peak_group_mib"] = {k: mib(v) for k, v in sampler.peak_group.items()}


def tail(path, n=5):
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
        return " | ".join(l.strip() for l in lines[-n:])
    except OSError:
        return ""


def rates(n, round_times):
    """round_times: per-round seconds, rounds 1..R. Updates/s over rounds 2..R and over all."""
    out = {"round_seconds": [round(t, 4) for t in round_times]}
    if round_times:
        tot = sum(round_times)
        out["seconds_all"] = round(tot, 4)
        out["updates_per_s_all"] = round(n * len(round_times) / tot, 3) if tot > 0 else None
    if len(round_times) > 1:
        steady = sum(round_times[1:])
        out["seconds_2_to_R"] = round(steady, 4)
        out["updates_per_s"] = round(n * (len(round_times) - 1) / steady, 3) if steady > 0 else None
    return out


# --- Flower ----------------------------------------------------------------------------------------

def flower_role(top_role, cmdline):
    if top_role == "superlink":
        return "serverapp" if "flwr-serverapp" in cmdline else "superlink_superexec"
    if top_role == "supernode":
        return "clientapp" if "flwr-clientapp" in cmdline else "supernode_superexec"
    return top_role


FLOWER_GROUPS = {"server": ("superlink", "superlink_superexec", "serverapp"),
                 "clients": ("supernode", "supernode_superexec", "clientapp"),
                 "total": ("superlink", "superlink_superexec", "serverapp", "supernode",
                           "supernode_superexec", "clientapp", "flwr_cli")}


def run_flower(a, n, work):
    venv_bin = os.path.dirname(a.flower_python)
    env = dict(os.environ)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")  # Flower starts flower-superexec by name
    env["FLWR_HOME"] = os.path.join(work, "flwr-home")  # the CLI's config.toml and Flower's files, not ~/.flwr
    env.pop("PYTHONPATH", None)
    os.makedirs(env["FLWR_HOME"], exist_ok=True)
    timing = os.path.join(work, "flower-timing.jsonl")
    procs = Procs()
    sampler = Sampler(procs, flower_role, FLOWER_GROUPS, a.sample_interval)
    res = {"system": "flower", "clients": n, "rounds": a.rounds}
    t0 = time.monotonic()
    sampler.start()
    try:
        port = free_port()
        sl = procs.start("superlink", [os.path.join(venv_bin, "flower-superlink"), "--insecure", "--host", "127.0.0.1",
                                       "--port", str(port), "--disable-runtime-dependency-installation"],
                         os.path.join(work, "superlink.log"), env)
        if not wait_port(port, 120, sl):
            raise RuntimeError(f"flower-superlink did not listen on {port}: {tail(os.path.join(work, 'superlink.log'))}")
        node_ports = free_ports(n)
        import psutil  # noqa: PLC0415
        avail0 = psutil.virtual_memory().available
        res["supernodes_started"] = 0
        for i, p in enumerate(node_ports):
            if i % 10 == 0 and i > 0:
                # Pace the start in tens: wait until the last ten have started their SuperExec, then
                # go on only if ten more (at --flower-node-mb each, clientapps included) leave
                # --mem-floor-mb free. 100 SuperNodes may not fit in this machine's memory.
                wait_logs([os.path.join(work, f"supernode-{j}.log") for j in range(i - 10, i)],
                          "Starting Flower SuperExec", 180)
                time.sleep(2)
                avail = psutil.virtual_memory().available
                res["mib_per_supernode"] = round((avail0 - avail) / i / 2**20, 1)
                need = min(10, n - i) * a.flower_node_mb
                if avail / 2**20 - need < a.mem_floor_mb:
                    raise MemoryShort(f"memory short: {i} of {n} SuperNodes started, {avail / 2**20:.0f} MiB available, "
                                      f"{(avail0 - avail) / i / 2**20:.0f} MiB taken per SuperNode (with its SuperExec); "
                                      f"{min(10, n - i)} more at {a.flower_node_mb} MiB each would leave less than "
                                      f"--mem-floor-mb {a.mem_floor_mb}; stopped")
            res["supernodes_started"] = i + 1
            procs.start("supernode", [os.path.join(venv_bin, "flower-supernode"), "--insecure",
                                      "--superlink", f"127.0.0.1:{port}", "--host", "127.0.0.1", "--port", str(p),
                                      "--node-config", f"partition-id={i} num-partitions={n}"],
                        os.path.join(work, f"supernode-{i}.log"), env)
        with open(os.path.join(env["FLWR_HOME"], "config.toml"), "w", encoding="utf-8") as f:
            f.write('[superlink]\ndefault = "bench"\n\n[superlink.bench]\n'
                    f'address = "127.0.0.1:{port}"\ninsecure = true\n')
        run_config = (f'num-server-rounds={a.rounds} num-clients={n} rows={a.rows} cols={a.cols} '
                      f'classes={a.classes} timing-file="{timing}"')
        t_submit = time.monotonic()
        cli = subprocess.run([os.path.join(venv_bin, "flwr"), "run", APP_DIR, "bench", "--run-config", run_config],
                             env=env, cwd=work, capture_output=True, text=True, timeout=300)
        if cli.returncode != 0:
            raise RuntimeError(f"flwr run failed ({cli.returncode}): {(cli.stdout + cli.stderr).strip()[-400:]}")
        # Wait for the R rounds' fit_end stamps.
        t_end = time.monotonic() + a.timeout
        events = []
        while time.monotonic() < t_end:
            check_memory(a.mem_floor_mb, f"Flower at N={n}")
            if procs.reap(sl) is not None:
                raise RuntimeError(f"flower-superlink exited: {tail(os.path.join(work, 'superlink.log'))}")
            events = []
            if os.path.exists(timing):
                with open(timing, encoding="utf-8") as f:
                    events = [json.loads(l) for l in f if l.strip()]
            if sum(e["event"] == "fit_end" for e in events) >= a.rounds:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"Flower did not finish {a.rounds} rounds in {a.timeout} s "
                               f"({sum(e['event'] == 'fit_end' for e in events)} done)")
        res["wall_from_submit_s"] = round(time.monotonic() - t_submit, 2)
        time.sleep(1.0)  # let the ServerApp end (sampled too)
        start = {e["round"]: e["t"] for e in events if e["event"] == "fit_start"}
        end = {e["round"]: e["t"] for e in events if e["event"] == "fit_end"}
        res["results_per_round"] = [e["results"] for e in events if e["event"] == "fit_end"]
        res["failures_per_round"] = [e["failures"] for e in events if e["event"] == "fit_end"]
        # Round 1: from its fit instructions (the N nodes sampled) to its aggregate; round r > 1: from
        # the end of round r-1's aggregate to the end of round r's (the whole gap between rounds).
        times = [end[1] - start[1]] + [end[r] - end[r - 1] for r in range(2, a.rounds + 1)]
        res.update(rates(n, times))
    except (RuntimeError, MemoryShort, subprocess.TimeoutExpired, OSError) as e:
        res["error"] = str(e)
        # How far it got: the rounds finished, and the replies the SuperLink took in (its log says
        # "Push replies" once a reply) since the last round began.
        try:
            with open(timing, encoding="utf-8") as f:
                ev = [json.loads(l) for l in f if l.strip()]
            with open(os.path.join(work, "superlink.log"), "rb") as f:
                pushed = f.read().count(b"[Fleet.PushMessages] Push replies")
            done = [e2 for e2 in ev if e2["event"] == "fit_end"]
            if ev:
                res["partial"] = {"rounds_done": len(done), "replies_pushed": pushed,
                                  "seconds_since_round_1_start": round(time.time() - ev[0]["t"], 1)}
        except (OSError, ValueError):
            pass
    finally:
        sampler.stop()
        procs.kill()
    record_peaks(res, sampler, t0)
    res["server_rss_mib"] = {"superlink": mib(sampler.peak.get("superlink")),
                             "serverapp": mib(sampler.peak.get("serverapp")),
                             "superexec": mib(sampler.peak.get("superlink_superexec")),
                             "together": mib(sampler.peak_group["server"])}
    res["total_rss_mib"] = mib(sampler.peak_group["total"])
    res["kernel_peak_rss_mib"] = {k: mib(v) for k, v in procs.peak_by_role().items()}  # ru_maxrss, largest process of a role
    res["min_mem_available_mib"] = mib(sampler.min_available)
    res["rss_samples"] = sampler.samples
    return res


# --- Starling ---------------------------------------------------------------------------------------

STARLING_GROUPS = {"server": ("root",), "clients": ("client",), "total": ("root", "client")}


def run_starling(a, n, work):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(a.build_dir, "python") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    metrics = os.path.join(work, "metrics.jsonl")
    procs = Procs()
    sampler = Sampler(procs, lambda top, _: top, STARLING_GROUPS, a.sample_interval)
    res = {"system": "starling", "clients": n, "rounds": a.rounds}
    t0 = time.monotonic()
    sampler.start()
    try:
        port = free_port()
        root_cmd = [os.path.join(a.build_dir, "bin", "starling-server"), "--server.bind", f"tcp://127.0.0.1:{port}",
                    "--security.insecure", "true", "--model.spec", "softmax", "--model.rows", str(a.rows),
                    "--model.cols", str(a.cols), "--model.classes", str(a.classes),
                    "--compression.compressor", "none", "--sampling.fraction", "1.0",
                    "--sampling.min_available", str(n), "--sampling.min_clients", str(n),
                    "--sampling.wait_ms", str(int(a.timeout * 1000)),  # N Python processes starting on 2 cores
                    "--eval.every", "0", "--train.rounds", str(a.rounds), "--state.metrics", metrics,
                    "--log.level", "warn"]
        res["command"] = " ".join(root_cmd)
        root = procs.start("root", root_cmd, os.path.join(work, "root.log"), env)
        time.sleep(0.5)
        if procs.reap(root) is not None:
            raise RuntimeError(f"starling-server exited ({root.returncode}): {tail(os.path.join(work, 'root.log'))}")
        for i in range(n):
            if i % 10 == 0:
                check_memory(a.mem_floor_mb, f"Starling, starting client {i} of {n}")
            procs.start("client", [sys.executable, os.path.abspath(__file__), "--starling-client", "--port", str(port),
                                   "--client-id", str(i + 1), "--rows", str(a.rows), "--cols", str(a.cols),
                                   "--classes", str(a.classes)],
                        os.path.join(work, f"client-{i + 1}.log"), env)
        t_end = time.monotonic() + a.timeout
        while procs.reap(root) is None:
            check_memory(a.mem_floor_mb, f"Starling at N={n}")
            if time.monotonic() > t_end:
                raise RuntimeError(f"starling-server did not finish {a.rounds} rounds in {a.timeout} s")
            time.sleep(0.1)
        if root.returncode != 0:
            raise RuntimeError(f"starling-server exited {root.returncode}: {tail(os.path.join(work, 'root.log'))}")
        with open(metrics, encoding="utf-8") as f:
            recs = [json.loads(l) for l in f if l.strip()]
        if len(recs) < a.rounds or not all(r.get("applied") for r in recs):
            raise RuntimeError(f"starling-server's metrics hold {len(recs)} rounds, not {a.rounds} applied: {recs[-1:]}")
        res["results_per_round"] = [r.get("clients_completed") for r in recs]
        res["failures_per_round"] = [r.get("clients_failed") for r in recs]
        res["uplink_bytes_per_round"] = [r.get("uplink_bytes") for r in recs]
        res.update(rates(n, [r["wall_seconds"] for r in recs[: a.rounds]]))
        time.sleep(0.5)
    except (RuntimeError, MemoryShort, subprocess.TimeoutExpired, OSError) as e:
        res["error"] = str(e)
    finally:
        sampler.stop()
        procs.kill()
    record_peaks(res, sampler, t0)
    kernel = procs.peak_by_role()
    # The root is one process: its own peak (ru_maxrss from wait4) is exact where 0.2 s samples of
    # a run of a few seconds may miss it.
    res["server_rss_mib"] = {"root": mib(sampler.peak.get("root")), "root_ru_maxrss": mib(kernel.get("root")),
                             "together": mib(max(sampler.peak_group["server"], kernel.get("root", 0)))}
    res["total_rss_mib"] = mib(sampler.peak_group["total"])
    # An upper bound of the total: every process's own peak, summed as if they were simultaneous.
    res["total_ru_maxrss_sum_mib"] = mib(sum(procs.maxrss.values()))
    res["kernel_peak_rss_mib"] = {k: mib(v) for k, v in procs.peak_by_role().items()}  # ru_maxrss, largest process of a role
    res["min_mem_available_mib"] = mib(sampler.min_available)
    res["rss_samples"] = sampler.samples
    return res


# --- report -----------------------------------------------------------------------------------------

def fmt(x, nd=1):
    return "n/a" if x is None else f"{x:,.{nd}f}"


def markdown(doc):
    lines = [f"Model: {doc['model']['values']:,} float32 values ({doc['model']['layout']}), dense both ways; "
             f"{doc['rounds']} rounds; updates/s = N x rounds 2..R / their wall time (all R rounds in brackets).",
             "",
             "| N | system | updates/s | round s (2..R mean) | server peak RSS MiB | server parts MiB | "
             "total peak RSS MiB (processes) | Starling/Flower updates/s |",
             "|---|---|---|---|---|---|---|---|"]
    by = {(r["system"], r["clients"]): r for r in doc["results"]}
    for n in doc["clients"]:
        for system in ("flower", "starling"):
            r = by.get((system, n))
            if r is None:
                continue
            if "error" in r:
                srv = r.get("server_rss_mib", {})
                part = r.get("partial")
                if part:
                    part = (f" ({part['rounds_done']} rounds done, {part['replies_pushed']} replies in "
                            f"{part['seconds_since_round_1_start']} s)")
                lines.append(f"| {n} | {system} | not measured: {r['error']}{part or ''} | | {fmt(srv.get('together'))} (until stopped) | | "
                             f"{fmt(r.get('total_rss_mib'))} (until stopped) | |")
                continue
            rt = r.get("round_seconds", [])
            mean = sum(rt[1:]) / (len(rt) - 1) if len(rt) > 1 else None
            srv = r["server_rss_mib"]
            kp = r.get("kernel_peak_rss_mib", {})
            parts = (f"SuperLink {fmt(srv['superlink'])} (ru_maxrss {fmt(kp.get('superlink'))}) + SuperExec "
                     f"{fmt(srv['superexec'])} + ServerApp {fmt(srv['serverapp'])}") if system == "flower" else \
                f"root {fmt(srv['root'])} (ru_maxrss {fmt(kp.get('root'))})"
            ratio = ""
            f = by.get(("flower", n))
            if system == "starling" and f and "error" not in f and f.get("updates_per_s") and r.get("updates_per_s"):
                ratio = (f"{r['updates_per_s'] / f['updates_per_s']:.1f}x "
                         f"({r['updates_per_s_all'] / f['updates_per_s_all']:.1f}x)")
            procs = sum(r["process_count_peak"].values())
            lines.append(f"| {n} | {system} | {fmt(r.get('updates_per_s'), 2)} ({fmt(r.get('updates_per_s_all'), 2)}) | "
                         f"{fmt(mean, 3)} | {fmt(srv['together'])} | {parts} | {fmt(r['total_rss_mib'])} ({procs}) | {ratio} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="10,100", help="comma-separated N (default 10,100)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per run (default 5; >= 2)")
    ap.add_argument("--systems", default="flower,starling", help="which to run, in this order at each N")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--cols", type=int, default=100000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=None, help="JSON result (default BUILD_DIR/peers-deploy.json)")
    ap.add_argument("--md", default=None, help="Markdown table (default: --out with .md)")
    ap.add_argument("--work-dir", default=None, help="logs and files of each run (default: a temporary folder, kept)")
    ap.add_argument("--sample-interval", type=float, default=0.2, help="RSS sampling period, s")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a run may take once started")
    ap.add_argument("--mem-floor-mb", type=int, default=3000,
                    help="stop a run rather than leave less memory available (MiB; the machine is shared)")
    ap.add_argument("--flower-node-mb", type=int, default=250,
                    help="memory one Flower SuperNode takes with its SuperExec and ClientApp (MiB; for pacing)")
    # the Starling client process
    ap.add_argument("--starling-client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--client-id", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.starling_client:
        return starling_client_main(a)

    if a.rounds < 2:
        die("--rounds must be at least 2 (updates/s is taken over rounds 2..R)")
    try:
        clients = [int(x) for x in a.clients.split(",") if x.strip()]
    except ValueError:
        die(f"--clients {a.clients!r}: a comma-separated list of integers")
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    if not clients or min(clients) < 1 or not systems or set(systems) - {"flower", "starling"}:
        die("--clients needs integers >= 1 and --systems a subset of flower,starling")
    a.build_dir = os.path.abspath(a.build_dir)
    a.out = os.path.abspath(a.out or os.path.join(a.build_dir, "peers-deploy.json"))
    a.md = os.path.abspath(a.md or os.path.splitext(a.out)[0] + ".md")

    # Preconditions, one line each.
    try:
        import numpy  # noqa: PLC0415
        import psutil  # noqa: F401,PLC0415
    except ImportError as e:
        die(f"{e}: run this with the peers' venv python (bash scripts/peers-venv.sh; "
            f"~/.cache/starling/peers-venv/bin/python bench/peers/deploy.py)")
    a.flower_python = sys.executable
    if "flower" in systems:
        try:
            import flwr  # noqa: PLC0415
        except ImportError:
            die(f"flwr is not importable by {sys.executable}: run this with the peers' venv python "
                "(bash scripts/peers-venv.sh creates ~/.cache/starling/peers-venv)")
        for exe in ("flower-superlink", "flower-supernode", "flower-superexec", "flwr"):
            if not os.access(os.path.join(os.path.dirname(sys.executable), exe), os.X_OK):
                die(f"{exe} is not beside {sys.executable}: run this with the peers' venv python (scripts/peers-venv.sh)")
    if "starling" in systems:
        server = os.path.join(a.build_dir, "bin", "starling-server")
        if not os.access(server, os.X_OK):
            die(f"{server} is missing: build Starling first (make build)")
        chk = subprocess.run([sys.executable, "-c", "import starling"], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=os.path.join(a.build_dir, "python")))
        if chk.returncode != 0:
            die(f"the starling package is not importable from {a.build_dir}/python by {sys.executable} "
                f"({chk.stderr.strip().splitlines()[-1] if chk.stderr.strip() else 'no error text'}): make build")

    from starling_deploy_app import logic  # noqa: PLC0415
    shapes = logic.softmax_shapes(a.rows, a.cols, a.classes)
    values = sum(math.prod(s) for s in shapes)
    work_root = a.work_dir or tempfile.mkdtemp(prefix="starling-peers-deploy-")
    os.makedirs(work_root, exist_ok=True)

    versions = {"python": platform.python_version(), "numpy": numpy.__version__}
    if "flower" in systems:
        versions["flwr"] = flwr.__version__
    doc = {"issue": 21, "clients": clients, "rounds": a.rounds, "systems": systems,
           "model": {"layout": f"softmax rows={a.rows} cols={a.cols} classes={a.classes}: "
                               + " + ".join("x".join(map(str, s)) for s in shapes), "values": values,
                     "bytes": values * 4},
           "delta": float(logic.DELTA), "versions": versions, "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "work_dir": work_root,
           "command": " ".join([sys.executable] + sys.argv), "results": []}

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    interrupted = False
    try:
        for n in clients:
            for system in systems:
                work = os.path.join(work_root, f"{system}-{n}")
                shutil.rmtree(work, ignore_errors=True)
                os.makedirs(work)
                print(f"deploy.py: {system} with N={n}, {a.rounds} rounds (logs in {work}) ...", flush=True)
                try:
                    r = (run_flower if system == "flower" else run_starling)(a, n, work)
                except (RuntimeError, MemoryShort, subprocess.TimeoutExpired) as e:
                    r = {"system": system, "clients": n, "rounds": a.rounds, "error": str(e)}
                    print(f"deploy.py: {system} N={n} failed: {e}", file=sys.stderr, flush=True)
                doc["results"].append(r)
                if "error" in r:
                    print(f"deploy.py: {system} N={n} failed: {r['error']}", file=sys.stderr, flush=True)
                else:
                    print(f"deploy.py:   {r.get('updates_per_s')} updates/s (rounds 2..R), rounds {r['round_seconds']} s, "
                          f"server RSS {r['server_rss_mib']['together']} MiB, total RSS {r['total_rss_mib']} MiB", flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("deploy.py: interrupted; every started process was killed", file=sys.stderr)
    doc["interrupted"] = interrupted
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    md = markdown(doc)
    with open(a.md, "w", encoding="utf-8") as f:
        f.write(md)
    print(md)
    print(f"deploy.py: wrote {a.out} and {a.md}")
    return 1 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
