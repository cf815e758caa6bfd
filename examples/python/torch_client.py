#!/usr/bin/python3
"""A Starling client that trains a PyTorch model in Python (docs/python.md).

McMahan et al.'s CNN on this client's shard of Fashion-MNIST, written in PyTorch with the names
and shapes of Starling's `cnn` (the model a root with model.spec = "cnn" holds), as one member of
a real federation: the root, edge aggregators and C++ starling-client processes see a client like
any other. The shard is the one a C++ client with the same id trains on (starling.shard), read
from the same configuration file (model.seed, data.num_clients, data.partition).

    PYTHONPATH=build/python /usr/bin/python3 examples/python/torch_client.py \
        --config examples/edge/federation.toml --client-id 3 --server tcp://127.0.0.1:7701 \
        --key keys/client-3.key_secret --server-key keys/agg-100.key

examples/edge/run.sh runs some of its ten clients with this file (STARLING_EDGE_PYTHON="3 7").
Needs Debian's python3-torch and python3-numpy (/usr/bin/python3).
"""

import argparse
import gzip
import os
import sys
import tomllib

import numpy as np
import torch
from torch import nn

import starling

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path, header):
    """An IDX file of unsigned bytes (gzip or not): the bytes after its header."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=header)


def load_split(data_dir, images, labels):
    x = read_idx(os.path.join(data_dir, images), 16).reshape(-1, 1, 28, 28).astype(np.float32) / 255.0
    y = read_idx(os.path.join(data_dir, labels), 8)
    if len(x) != len(y):
        sys.exit(f"torch_client: {images} has {len(x)} images but {labels} {len(y)} labels")
    return x, y


class CNN(nn.Module):
    """McMahan et al. 2017's CNN, as Starling's `cnn`: 5x5 convolutions (32, 64 channels, padding
    2), each followed by ReLU and 2x2 max pooling, then 512 ReLU units and 10 outputs."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class TorchClient(starling.NumPyClient):
    def __init__(self, net, train, test):
        self.net, self.train, self.test = net, train, test

    def _load(self, parameters):
        state = {name: torch.from_numpy(p) for name, p in zip(self.net.state_dict(), parameters)}
        self.net.load_state_dict(state, strict=True)

    def fit(self, parameters, config):
        self._load(parameters)
        x, y = self.train
        opt = torch.optim.SGD(self.net.parameters(), lr=config["lr"])
        gen = torch.Generator().manual_seed(config["seed"] & 0x7FFFFFFFFFFFFFFF)
        anchor = [p.detach().clone() for p in self.net.parameters()] if config["prox_mu"] > 0 else None
        total, correct, count = 0.0, 0, 0
        self.net.train()
        for _ in range(config["epochs"]):
            order = torch.randperm(len(y), generator=gen)
            for start in range(0, len(y), config["batch_size"]):
                idx = order[start:start + config["batch_size"]]
                xb, yb = torch.from_numpy(x[idx.numpy()]), torch.from_numpy(y[idx.numpy()].astype(np.int64))
                out = self.net(xb)
                loss = nn.functional.cross_entropy(out, yb)
                total += loss.item() * len(yb)
                correct += int((out.argmax(1) == yb).sum())
                count += len(yb)
                if anchor is not None:  # FedProx: mu/2 ||w - w_global||^2
                    loss = loss + config["prox_mu"] / 2 * sum(((p - a) ** 2).sum()
                                                             for p, a in zip(self.net.parameters(), anchor))
                opt.zero_grad()
                loss.backward()
                opt.step()
        params = [v.detach().numpy().astype(np.float32) for v in self.net.state_dict().values()]
        return params, len(y), {"train_loss": total / count, "train_accuracy": correct / count}

    def evaluate(self, parameters, config):
        self._load(parameters)
        x, y = self.test
        self.net.eval()
        with torch.no_grad():
            out = self.net(torch.from_numpy(x))
            yt = torch.from_numpy(y.astype(np.int64))
            loss = float(nn.functional.cross_entropy(out, yt))
            accuracy = float((out.argmax(1) == yt).float().mean())
        return loss, len(y), {"accuracy": accuracy}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="the federation's TOML file (model.seed, data.num_clients, data.partition); "
                    "Starling's defaults without it")
    ap.add_argument("--client-id", type=int, required=True, help="this client's id: it trains shard client-id")
    ap.add_argument("--server", required=True, help="the root's or an edge aggregator's endpoint, tcp://host:port")
    ap.add_argument("--key", help="this client's NAME.key_secret file (starling-keygen)")
    ap.add_argument("--server-key", help="the public key file of the server it connects to")
    ap.add_argument("--insecure", action="store_true", help="plain TCP without CURVE (tests, trusted networks)")
    ap.add_argument("--state-file", help="keeps the error-feedback state and the last update across restarts")
    ap.add_argument("--data-dir", default=DATA_DIR, help="the Fashion-MNIST IDX files (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="PyTorch threads (default: %(default)s)")
    ap.add_argument("--log-level", default="info")
    a = ap.parse_args()

    cfg = {}
    if a.config:
        with open(a.config, "rb") as f:
            cfg = tomllib.load(f)
    spec = cfg.get("model", {}).get("spec", "cnn")
    if spec != "cnn":
        sys.exit(f"torch_client: this example trains the cnn; {a.config} has model.spec = '{spec}'")
    seed = cfg.get("model", {}).get("seed", 1)
    num_clients = cfg.get("data", {}).get("num_clients", 100)
    partition = cfg.get("data", {}).get("partition", "dirichlet:alpha=0.5")
    if not 0 <= a.client_id < num_clients:
        sys.exit(f"torch_client: --client-id {a.client_id} is not below data.num_clients = {num_clients}")

    torch.set_num_threads(a.threads)
    try:
        x, y = load_split(a.data_dir, "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
        xt, yt = load_split(a.data_dir, "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
    except FileNotFoundError as e:
        sys.exit(f"torch_client: {e.filename}: no such file (Debian: apt-get install dataset-fashion-mnist)")
    mine = starling.shard(y, num_clients=num_clients, client_id=a.client_id, partition=partition, seed=seed)
    held_out = starling.shard(yt, num_clients=num_clients, client_id=a.client_id, partition="iid", seed=seed)
    # Only this client's examples are kept (a copy); the rest of the data set is let go.
    train, test = (x[mine].copy(), y[mine].copy()), (xt[held_out].copy(), yt[held_out].copy())
    del x, y, xt, yt

    net = CNN()
    layout = [(name, tuple(t.shape)) for name, t in net.state_dict().items()]
    if layout != starling.model_layout("cnn"):
        sys.exit(f"torch_client: the PyTorch model's layout {layout} is not Starling's cnn")
    print(f"torch_client {a.client_id}: {len(train[1])} training and {len(test[1])} test examples, "
          f"server {a.server}", flush=True)
    client = starling.Client(TorchClient(net, train, test), server=a.server, client_id=a.client_id,
                             layout=layout, num_examples=len(train[1]), eval_examples=len(test[1]), key=a.key,
                             server_key=a.server_key, insecure=a.insecure, state_file=a.state_file,
                             log_level=a.log_level)
    try:
        finished = client.run()
    except KeyboardInterrupt:
        finished = False
    s = client.stats
    print(f"torch_client {a.client_id}: {'done' if finished else 'stopped'}: {s['tasks']} tasks, "
          f"{s['updates_sent']} updates ({s['update_bytes']} update bytes), "
          f"{s['evaluations_sent']} evaluations", flush=True)


if __name__ == "__main__":
    main()
