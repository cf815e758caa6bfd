"""The ClientApp of the demo task (bench/peers/flower_sim.py): its @app.train() function loads the
received ArrayRecord into the CNN, trains the client's shard (partition-id = client) and replies
with the new ArrayRecord and a MetricRecord (num-examples, train_loss).

It runs in Ray's actors. Flower loads it by reference (pyproject.toml's clientapp =
"starling_flower_app.client_app:app"), so Ray ships this module's functions to an actor by name and
the actor imports the module once: _cache below lives as long as the actor, and each actor loads the
training set once, on its first message (bench/peers/common.py notes every load in the probe log;
flower_sim.py reports them per process, and tests/tools/peers_loads_test.sh fails when a process
loads it twice).
"""
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

import common  # bench/peers/common.py: flower_sim.py puts bench/peers/ on PYTHONPATH

PROG = "flower ClientApp"

_cache = {}  # this process's (Ray actor's) training set (uint8), split and CNN, from its first message on


app = ClientApp()


@app.train()
def train(msg: Message, context: Context):
    cfg = context.run_config
    pid = int(context.node_config["partition-id"])
    x, y = common.flower_client_shard(_cache, pid, cfg, PROG)
    if "model" not in _cache:  # one module per actor, loaded with each message's arrays (as Starling's workers)
        _cache["model"] = common.make_model(str(cfg["model"]))
    model = _cache["model"]
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    rnd = int(msg.content["config"]["server-round"])
    seed = int(cfg["seed"]) * 1_000_003 + rnd * 10_007 + pid
    n, loss = common.train_local(model, x, y, seed)
    if bool(cfg["stateful"]):
        _error_feedback(msg.content["arrays"].to_torch_state_dict(), model, context)
    metrics = MetricRecord({"train_loss": loss, "num-examples": n, "threads": torch.get_num_threads()})
    return Message(content=RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}),
                   reply_to=msg)


def _error_feedback(initial, model, context, density=0.01):
    """stateful (bench/peers/scale.py; our code, Flower has no compressor): the client keeps a
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
