"""The demo task (bench/peers/common.py) in Flower's Simulation Runtime, run the way Flower's
documentation for flwr 1.4x runs a simulation: a Flower App (bench/peers/flower_app/: a ClientApp
whose @app.train() function trains the received ArrayRecord, a ServerApp whose @app.main() runs
flwr.serverapp.strategy.FedAvg with a central evaluate_fn, both in an importable package named in
its pyproject.toml), submitted with `flwr run <app> local --stream` to the local SuperLink that
`flwr run` starts itself (simulation mode), with one virtual SuperNode per client on the default
Ray backend.

This script is only the launcher: it checks its arguments, writes a fresh Flower configuration
(FLWR_HOME in a work folder: `[superlink.local] address = ":local:"`, the default of `flwr`), runs
`flwr run` with the run config (--run-config, a TOML file) and the federation config
(--federation-config: num-supernodes, client resources), waits for the run, stops the SuperLink
`flwr run` left running, and writes --out from what the ServerApp wrote plus the counters of the
probe log (bench/peers/common.py: note): the training set's loads and the threads of every process.

Settings (--setting):
  default  Flower's defaults: no client resources given, so every ClientApp gets Flower's
           {num_cpus: 2, num_gpus: 0}: on this 2-core machine one Ray actor, one client trains at
           a time, with the threads Ray gives an actor of 2 CPUs (OMP_NUM_THREADS=2: PyTorch and
           OpenBLAS both read it).
  best     client-resources-num-cpus = 1, so Ray runs two actors and two clients train at once,
           each with 1 PyTorch thread and 1 OpenBLAS thread (common.set_threads, as Starling bounds
           each of its processes): the fastest on 2 cores (docs/peers.md says how it was chosen).
Both: the ServerApp's central evaluation runs on 2 PyTorch and 2 OpenBLAS threads (eval-threads;
every actor is idle while it runs), as Starling's evaluation runs on both of its workers.

Process tree: `flwr run` starts the local SuperLink detached (its own session) and exits when the
run ends; the SuperLink starts flower-superexec, which starts flwr-simulation (the ServerApp, Ray's
driver), which starts Ray's GCS server, raylet and actors. This launcher makes itself the child
subreaper of everything it starts (prctl PR_SET_CHILD_SUBREAPER), so the SuperLink and its
descendants stay in its process tree (bench/peers/run.py measures that tree's memory), and it ends
them, by pid, when the run is over or when it is stopped.

Environment given to Flower: FLWR_HOME (the work folder), fresh ports for the local SuperLink
(FLWR_LOCAL_SUPERLINK_HTTP_API_PORT, FLWR_LOCAL_CONTROL_API_PORT), PATH with the venv's bin/ first
(Flower starts flower-superlink, flower-superexec and flwr-simulation by name),
FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 (otherwise the SuperLink runs `uv sync` for the
app's dependencies into a fresh environment: another PyTorch than Debian's, from the network),
FLWR_DISABLE_UPDATE_CHECK=1 and FLWR_TELEMETRY_ENABLED=0 (both would call out to the network),
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (Ray's services on 127.0.0.1 only: Ray then takes the loopback
address as the node's; a network setting, no performance knob), PYTHONPATH=bench/peers (the app
imports common.py; Flower passes PYTHONPATH on to Ray's workers), PYTHONDONTWRITEBYTECODE=1.

Secure aggregation (--secagg): bench/peers/flower_secagg_app instead, the same training under
Flower's SecAgg+ (SecAggPlusWorkflow around the legacy FedAvg, secaggplus_mod around a NumPyClient:
the only form flwr 1.42 runs it in), --num-shares (k + 1) and --threshold (t) in its run config;
bench/peers/secagg.py compares it with starling-sim's SecAgg+ (docs/peers.md).

Compression: Flower has no built-in update compression (no top-k, no error feedback; its mods are
clipping, differential privacy, secure aggregation and size logging), so only dense FedAvg runs
here; --stateful (bench/peers/scale.py) is our top-k with error feedback, kept in Context.state.

  python bench/peers/flower_sim.py --split FILE --out RESULT.json [--setting default|best]
"""
import argparse
import ctypes
import importlib.metadata
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import common  # noqa: E402

PROG = "flower_sim.py"
APP_DIR = os.path.join(HERE, "flower_app")
SECAGG_APP_DIR = os.path.join(HERE, "flower_secagg_app")
FLOWER_CONFIG = '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n'
PR_SET_CHILD_SUBREAPER = 36


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _descendants():
    import psutil

    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _reap():
    """Collects the exit status of every child that has ended (orphans re-parented to this
    subreaper included), so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _cmdline(p):
    import psutil

    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _alive(p):
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_gone(match, timeout):
    """Waits until no descendant's command line contains `match`; False on timeout."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        _reap()
        if not [p for p in _descendants() if match in _cmdline(p) and _alive(p)]:
            return True
        time.sleep(0.2)
    return False


def stop_tree(grace=15.0):
    """Ends every process this launcher started, by pid: SIGTERM to the SuperLink and SuperExec
    (they stop their children), then SIGKILL to whatever is left after `grace` seconds."""
    import psutil

    for p in _descendants():
        if "flower-superlink" in _cmdline(p) or "flower-superexec" in _cmdline(p):
            try:
                p.terminate()
            except psutil.Error:
                pass
    deadline = time.time() + grace
    while time.time() < deadline:
        _reap()
        if not [p for p in _descendants() if _alive(p)]:
            return
        time.sleep(0.2)
    for p in _descendants():
        try:
            p.kill()
        except psutil.Error:
            pass
    time.sleep(0.2)
    _reap()


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))  # a TOML basic string


def main_cli():
    p = argparse.ArgumentParser(description="The demo task in Flower's simulation, run with flwr run (bench/peers/)")
    common.add_common_args(p)
    p.add_argument("--client-cpus", type=int, default=None,
                   help="override the setting's client-resources-num-cpus (for measuring which is best; a whole "
                        "number: flwr 1.42's federation config holds it as an unsigned integer)")
    p.add_argument("--eval-threads", type=int, default=2,
                   help="PyTorch and OpenBLAS threads of the ServerApp's central evaluation (the actors are idle "
                        "while it runs; 2 = this machine's cores)")
    p.add_argument("--stateful", action="store_true",
                   help="per-node state (bench/peers/scale.py): each client keeps a model-sized float32 residual "
                        "in Context.state and sends top-k 1%% with error feedback (our code)")
    p.add_argument("--secagg", action="store_true",
                   help="Flower's SecAgg+ (bench/peers/flower_secagg_app): SecAggPlusWorkflow and secaggplus_mod")
    p.add_argument("--num-shares", type=int, default=15,
                   help="--secagg: SecAgg+'s shares of each client's secrets, its own included (k + 1)")
    p.add_argument("--threshold", type=int, default=8, help="--secagg: the shares that rebuild a secret (t)")
    p.add_argument("--work", default=None,
                   help="work folder (FLWR_HOME, run config, probe log), emptied first; default: OUT.flwr "
                        "next to --out")
    a = p.parse_args()
    if a.secagg and a.stateful:
        common.die(PROG, "--secagg takes no --stateful: SecAgg+ sums whole models, not top-k updates")
    if a.secagg and not (1 <= a.threshold <= a.num_shares):
        common.die(PROG, f"--threshold must be in [1, --num-shares = {a.num_shares}], got {a.threshold}")
    # Errors before anything starts, without loading the data set here (this process stays small:
    # its memory counts in the measured tree).
    num_examples = common.count_examples("train", a.data_dir, PROG)
    common.count_examples("t10k", a.data_dir, PROG)
    common._find(a.data_dir, "train-images-idx3-ubyte", PROG)
    common._find(a.data_dir, "t10k-images-idx3-ubyte", PROG)
    num_clients = common.check_split(a.split, num_examples, PROG)
    bin_dir = os.path.dirname(sys.executable)
    flwr = os.path.join(bin_dir, "flwr")
    if not os.access(flwr, os.X_OK):
        common.die(PROG, f"{flwr} is missing: run it with the peers' virtual environment (bash "
                         "scripts/peers-venv.sh; then $STARLING_PEERS_VENV/bin/python, default "
                         "~/.cache/starling/peers-venv)")
    try:
        import psutil  # noqa: F401
    except ImportError:
        common.die(PROG, "psutil is missing: run it with the peers' virtual environment (bash scripts/peers-venv.sh)")

    out = os.path.abspath(a.out)
    work = os.path.abspath(a.work or out + ".flwr")
    if os.path.exists(work):
        shutil.rmtree(work)
    flwr_home = os.path.join(work, "flwr-home")
    os.makedirs(flwr_home)
    with open(os.path.join(flwr_home, "config.toml"), "w") as f:
        f.write(FLOWER_CONFIG)
    probe = os.path.join(work, "probe.jsonl")
    inside = os.path.join(work, "serverapp-result.json")

    client_threads = 0  # as Ray and PyTorch set them
    federation = {"num-supernodes": num_clients}
    if a.setting == "best":
        client_threads = 1
        federation["client-resources-num-cpus"] = a.client_cpus or 1
        federation["client-resources-num-gpus"] = 0.0
    elif a.client_cpus:
        federation["client-resources-num-cpus"] = a.client_cpus
        federation["client-resources-num-gpus"] = 0.0
    # else: Flower's default client resources ({num_cpus: 2, num_gpus: 0})
    if a.threads is not None:
        client_threads = a.threads
    run_config = {"split": os.path.abspath(a.split), "data-dir": os.path.abspath(a.data_dir),
                  "num-clients": num_clients, "rounds": a.rounds, "clients-per-round": a.clients_per_round,
                  "eval-every": a.eval_every, "seed": a.seed, "client-threads": client_threads,
                  "eval-threads": a.eval_threads, "stateful": a.stateful, "model": a.model,
                  "result-file": inside}
    if a.secagg:
        # SecAgg+ masks each update weighted by its examples: max-weight (Flower's default 1000
        # warns of overflow past it) is the largest shard's.
        largest = max(len(s) for s in common.read_split(a.split, num_examples, PROG))
        run_config.update({"num-shares": a.num_shares, "reconstruction-threshold": a.threshold,
                           "max-weight": float(largest)})
    app_dir = SECAGG_APP_DIR if a.secagg else APP_DIR
    run_config_file = os.path.join(work, "run-config.toml")
    with open(run_config_file, "w") as f:
        f.writelines(f"{k} = {_toml_value(v)}\n" for k, v in run_config.items())
    fed = " ".join(f"{k}={_toml_value(v)}" for k, v in federation.items())

    env = dict(os.environ)
    env.update({
        "FLWR_HOME": flwr_home,
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(_free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(_free_port()),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
        "PYTHONPATH": HERE + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        "PYTHONDONTWRITEBYTECODE": "1",
        "STARLING_PEERS_PROBE_LOG": probe,
    })
    cmd = [flwr, "run", app_dir, "local", "--stream", "--federation-config", fed, "--run-config", run_config_file]

    # Orphans (the SuperLink `flwr run` detaches) re-parent to this process: they stay in the tree.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        common.die(PROG, f"prctl(PR_SET_CHILD_SUBREAPER) failed (errno {ctypes.get_errno()})")

    def stopped(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.time()
    rc = None
    try:
        rc = subprocess.call(cmd, env=env, cwd=work)
        t1 = time.time()
        # `flwr run --stream` returns when the run's logs end; flwr-simulation may still be
        # shutting Ray down. Let it finish, then stop the SuperLink.
        _wait_gone("flwr-simulation", 60.0)
        t2 = time.time()
    finally:
        stop_tree()
    t3 = time.time()
    if rc != 0 or not os.path.exists(inside):
        common.die(PROG, f"`flwr run` exited with {rc}" + ("" if os.path.exists(inside) else
                                                           " and the ServerApp wrote no result")
                   + f" (Flower's logs: above, and {os.path.join(flwr_home, 'local-superlink', 'superlink.log')})")
    with open(inside) as f:
        r = json.load(f)
    probes = common.probe_summary(probe)

    def version(pkg):
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return None

    backend = {"client_resources": {"num_cpus": federation["client-resources-num-cpus"],
                                    "num_gpus": federation["client-resources-num-gpus"]}
               if "client-resources-num-cpus" in federation else "Flower's default: num_cpus 2, num_gpus 0"}
    result = {
        "system": "flower",
        "setting": a.setting,
        "launcher": "flwr run (local SuperLink, simulation mode, Ray backend) of " + os.path.relpath(app_dir, ROOT),
        "secagg": a.secagg,
        "command": cmd,
        "federation_config": federation,
        "run_config": run_config,
        "compressor": ("topk 1% with error feedback, residual in Context.state (our code)"
                       if a.stateful else "none"),
        "versions": {"flwr": version("flwr"), "ray": version("ray"), **r.pop("versions_inside", {})},
        "client_resources": backend["client_resources"],
        "run_seconds_inside": t1 - t0,  # `flwr run`: SuperLink start, run, log stream's end
        "simulation_exit_seconds": t2 - t1,
        "stop_seconds": t3 - t2,
        "data_loads": probes,
        "max_train_loads_per_process": probes["max_train_loads_per_process"],
        "bytes_note": ("not measured under SecAgg+ (its messages are records of several kinds): the dense "
                       "model each way, for scale" if a.secagg else
                       "serialized Array payloads (Array.data) of the ArrayRecords, without message framing"),
        **r,
    }
    common.write_result(out, result)
    if probes["max_train_loads_per_process"] > 1:
        print(f"{PROG}: WARNING: a process loaded the training set "
              f"{probes['max_train_loads_per_process']} times (see data_loads in {out})", flush=True)


if __name__ == "__main__":
    main_cli()
