"""The demo task (bench/peers/common.py) in Flower's Simulation Runtime, written the way Flower's
documentation for flwr 1.4x teaches it: a ClientApp whose @app.train() function trains the
received ArrayRecord and replies with the new one, a ServerApp whose @app.main() runs the FedAvg
strategy of flwr.serverapp.strategy (strategy.start with a central evaluate_fn), and
flwr.simulation.run_simulation on the default Ray backend, one virtual SuperNode per client.

(The older NumPyClient / client_fn / ServerAppComponents path still exists in flwr 1.4x under
flwr.client and flwr.compat, but the documentation now teaches the Message API used here; its
FedAvg takes fraction_train / min_train_nodes where the older one took fraction_fit /
min_fit_clients.)

Settings (--setting):
  default  Flower's defaults: no client_resources given, so every ClientApp asks Ray for
           client_resources = {num_cpus: 2, num_gpus: 0}: on this 2-core machine one client trains
           at a time. PyTorch's threads are left as Ray sets them for the actor (OMP_NUM_THREADS =
           the actor's num_cpus, so 2).
  best     client_resources = {num_cpus: 1, num_gpus: 0}, so Ray runs two actors and two clients
           train at once, each with torch.set_num_threads(1): the fastest on 2 cores
           (docs/peers.md says how it was chosen).

Both settings give Ray init_args {_node_ip_address: 127.0.0.1} and set
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, so that Ray's services listen on the loopback address only.

Compression: Flower has no built-in update compression (no top-k, no error feedback; its mods
are clipping, differential privacy, secure aggregation and size logging), so only dense FedAvg
runs here.

The ClientApps run in Ray worker processes that import this file anew: what they need travels in
environment variables (STARLING_PEERS_*), which Ray's workers inherit.

  python bench/peers/flower_sim.py --split FILE --out RESULT.json [--setting default|best]
"""
import argparse
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

PROG = "flower_sim.py"

# Ray's services listen on the loopback address only: this benchmark talks to nothing else. Ray
# maps a _node_ip_address of 127.0.0.1 to the machine's routable address unless this (documented
# for single-machine use on macOS and Windows) says the machine is no cluster node; read when ray
# is imported, inherited by Ray's processes. A network setting: it changes no performance knob.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

try:
    import numpy as np
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation
except ImportError as e:
    common.die(PROG, f"{e}: run it with the peers' virtual environment (bash scripts/peers-venv.sh; "
                     "then $STARLING_PEERS_VENV/bin/python, default ~/.cache/starling/peers-venv)")


# ---- the ClientApp (runs in Ray's actors) ----------------------------------------------------

_cache = {}


def _client_data(pid):
    """This actor's copy of the training set (uint8, loaded once per actor process) and the
    shard of client `pid` as float32 tensors."""
    if "train" not in _cache:
        x, y = common.load_fashion_mnist("train", os.environ["STARLING_PEERS_DATA"], PROG, as_float=False)
        _cache["train"] = (x, y)
        _cache["split"] = common.read_split(os.environ["STARLING_PEERS_SPLIT"], len(y), PROG)
        threads = int(os.environ.get("STARLING_PEERS_THREADS", "0"))
        common.set_threads(threads)
    x, y = _cache["train"]
    idx = _cache["split"][pid]
    return torch.from_numpy(common.to_float(x[idx])), torch.from_numpy(y[idx].astype(np.int64))


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context):
    pid = int(context.node_config["partition-id"])
    x, y = _client_data(pid)
    model = common.make_cnn()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    rnd = int(msg.content["config"]["server-round"])
    seed = int(os.environ.get("STARLING_PEERS_SEED", "1")) * 1_000_003 + rnd * 10_007 + pid
    n, loss = common.train_local(model, x, y, seed)
    if os.environ.get("STARLING_PEERS_STATEFUL") == "1":
        _error_feedback(msg.content["arrays"].to_torch_state_dict(), model, context)
    metrics = MetricRecord({"train_loss": loss, "num-examples": n, "threads": torch.get_num_threads()})
    return Message(content=RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}),
                   reply_to=msg)


def _error_feedback(initial, model, context, density=0.01):
    """--stateful (bench/peers/scale.py; our code, Flower has no compressor): the client keeps a
    model-sized float32 residual in its Context.state (a RecordDict Flower's simulation keeps per
    node), adds it to its update, sends the top-k `density` of that (as initial + sent, so FedAvg
    averages it unchanged) and keeps the rest as the new residual."""
    new = model.state_dict()
    keys = list(new.keys())
    if "residual" in context.state:
        residual = context.state["residual"].to_torch_state_dict()
    else:
        residual = {k: torch.zeros_like(new[k], dtype=torch.float32) for k in keys}
    full = {k: (new[k] - initial[k]).float() + residual[k] for k in keys}
    flat = torch.cat([full[k].reshape(-1) for k in keys])
    thresh = torch.topk(flat.abs(), max(1, int(flat.numel() * density)), sorted=False).values.min()
    sent = {k: torch.where(full[k].abs() >= thresh, full[k], torch.zeros_like(full[k])) for k in keys}
    context.state["residual"] = ArrayRecord({k: full[k] - sent[k] for k in keys})
    model.load_state_dict({k: initial[k] + sent[k] for k in keys})


# ---- the ServerApp (runs in this process) ---------------------------------------------------

_log = {"rounds": [], "evals": []}


def _array_bytes(arrays):
    """Serialized size of an ArrayRecord's tensors (Array.data: the bytes Flower ships)."""
    return sum(len(a.data) for a in arrays.values())


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context):
    a = _log["args"]
    torch.manual_seed(a.seed)
    model = common.make_cnn()
    initial = ArrayRecord(model.state_dict())
    _log["model_bytes"] = _array_bytes(initial)
    x_test, y_test = common.load_fashion_mnist("t10k", a.data_dir, PROG)
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test.astype(np.int64))
    num_clients = _log["num_clients"]

    def central_eval(server_round: int, arrays: ArrayRecord):
        # Called before round 1 (server_round 0) and after every round; a round ends after its
        # evaluation, as in starling-sim's metrics.
        if server_round == 0:
            _log["t_start"] = time.time()
            return None
        record = None
        if common.evaluated(server_round, a.eval_every):
            model.load_state_dict(arrays.to_torch_state_dict())
            acc, loss = common.accuracy(model, x_test, y_test)
            _log["evals"].append({"round": server_round, "accuracy": acc, "loss": loss})
            record = MetricRecord({"accuracy": acc, "loss": loss})
        _log["rounds"].append({"round": server_round, "t_end": time.time()})
        return record

    strategy = FedAvg(fraction_train=a.clients_per_round / num_clients, fraction_evaluate=0.0,
                      min_train_nodes=a.clients_per_round, min_available_nodes=num_clients)
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=a.rounds,
                            train_config=ConfigRecord({}), evaluate_fn=central_eval)
    _log["train_metrics"] = {int(r): dict(m) for r, m in result.train_metrics_clientapp.items()}


def main_cli():
    p = argparse.ArgumentParser(description="The demo task in Flower's simulation (bench/peers/)")
    common.add_common_args(p)
    p.add_argument("--client-cpus", type=float, default=None,
                   help="override the setting's client_resources num_cpus (for measuring which is best)")
    p.add_argument("--stateful", action="store_true",
                   help="per-node state (bench/peers/scale.py): each client keeps a model-sized float32 residual "
                        "in Context.state and sends top-k 1%% with error feedback (our code)")
    a = p.parse_args()
    x, y = common.load_fashion_mnist("train", a.data_dir, PROG, as_float=False)  # errors before Ray starts
    shards = common.read_split(a.split, len(y), PROG)
    del x, y
    num_clients = len(shards)
    os.environ["STARLING_PEERS_DATA"] = a.data_dir
    os.environ["STARLING_PEERS_SPLIT"] = os.path.abspath(a.split)
    os.environ["STARLING_PEERS_SEED"] = str(a.seed)
    os.environ["STARLING_PEERS_STATEFUL"] = "1" if a.stateful else "0"
    # Loopback only (see RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER above); both settings have it.
    backend_config = {"init_args": {"_node_ip_address": "127.0.0.1"}}
    if a.setting == "best":
        os.environ["STARLING_PEERS_THREADS"] = "1"
        backend_config["client_resources"] = {"num_cpus": a.client_cpus or 1, "num_gpus": 0.0}
    elif a.client_cpus:
        backend_config["client_resources"] = {"num_cpus": a.client_cpus, "num_gpus": 0.0}
    # else: Flower's default client_resources (run_simulation fills them in)
    if a.threads is not None:
        os.environ["STARLING_PEERS_THREADS"] = str(a.threads)
    _log.update(args=a, num_clients=num_clients)
    t0 = time.time()
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=num_clients,
                   backend_config=backend_config)
    t1 = time.time()
    import flwr
    import ray

    rounds = _log["rounds"]
    mb = _log.get("model_bytes", 0)
    tm = _log.get("train_metrics", {})
    result = {
        "system": "flower",
        "setting": a.setting,
        "compressor": ("topk 1% with error feedback, residual in Context.state (our code)"
                       if a.stateful else "none"),
        "versions": {"flwr": flwr.__version__, "ray": ray.__version__, "torch": torch.__version__,
                     "numpy": np.__version__},
        "backend_config": backend_config,
        "client_resources": backend_config.get("client_resources",
                                               "Flower's default: num_cpus 2, num_gpus 0"),
        "client_threads": tm[max(tm)].get("threads") if tm else None,
        "rounds": len(rounds),
        "clients_trained": len(rounds) * a.clients_per_round,
        "loop_seconds": (rounds[-1]["t_end"] - _log["t_start"]) if rounds else None,
        "run_seconds_inside": t1 - t0,
        "per_round": [{"round": r["round"],
                       "seconds": r["t_end"] - (rounds[i - 1]["t_end"] if i else _log["t_start"]),
                       "train_loss": tm.get(r["round"], {}).get("train_loss"),
                       # Array payloads: the model to each sampled client, a model back from each.
                       "downlink_bytes": mb * a.clients_per_round,
                       "uplink_bytes": mb * a.clients_per_round}
                      for i, r in enumerate(rounds)],
        "bytes_note": "serialized Array payloads (Array.data) of the ArrayRecords, without message framing",
        "evals": _log["evals"],
    }
    common.write_result(a.out, result)


if __name__ == "__main__":
    main_cli()
