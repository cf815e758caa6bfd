"""The ClientApp of bench/peers/flower_sim.py --secagg: a NumPyClient whose fit() trains the
client's shard (partition-id = client) exactly as bench/peers/flower_app's @app.train() does, behind
Flower's secaggplus_mod, which runs SecAgg+'s client side (keys, shares, the masked vector of the
quantised, weighted parameters, the unmask answers) around it. Data, model and threads are cached per
Ray actor as in flower_app (one load of the training set a process).
"""
import numpy as np
import torch
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp

import common  # bench/peers/common.py: flower_sim.py puts bench/peers/ on PYTHONPATH

PROG = "flower SecAgg+ ClientApp"

_cache = {}


class Trainer(NumPyClient):
    def __init__(self, pid, cfg):
        self.pid, self.cfg = pid, cfg

    def fit(self, parameters, config):
        x, y = common.flower_client_shard(_cache, self.pid, self.cfg, PROG)
        if "model" not in _cache:
            _cache["model"] = common.make_model(str(self.cfg["model"]))
        model = _cache["model"]
        keys = list(model.state_dict().keys())
        model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in zip(keys, parameters)})
        rnd = int(config.get("server-round", 0))
        seed = int(self.cfg["seed"]) * 1_000_003 + rnd * 10_007 + self.pid
        n, loss = common.train_local(model, x, y, seed)
        out = [v.detach().numpy().copy() for v in model.state_dict().values()]
        return out, n, {"train_loss": loss, "threads": torch.get_num_threads()}


def client_fn(context):
    return Trainer(int(context.node_config["partition-id"]), context.run_config).to_client()


app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod])
