"""What every peer script of bench/peers/ shares: the data, the split, the model, the local step.

The task is starling-sim's examples/sim/demo.toml, reproduced exactly where the systems allow:
  - Fashion-MNIST from the Debian package (IDX, gzip), pixels as float32 / 255 and nothing else
    (data/idx.h does the same), labels as integers;
  - the split starling-sim wrote with --data.split_file (line k: client k's example indices), so
    every system trains the same shards;
  - McMahan et al.'s CNN as torch_trainer/models.cc's "cnn": conv 5x5 1->32 padding 2 ('same'),
    ReLU, max-pool 2, conv 5x5 32->64 padding 2, ReLU, max-pool 2, fc 3136->512, ReLU, fc 512->10
    (1,663,370 parameters), PyTorch's default initialisation;
  - plain SGD (no momentum, no weight decay), lr 0.05, batch 32, 1 local epoch, cross-entropy.

Imports torch lazily where it can, so that a missing virtual environment or data set is reported
in one line before anything heavy loads.
"""
import gzip
import json
import os
import struct
import sys

DATA_DIR = "/usr/share/datasets/fashion-mnist"
NUM_CLASSES = 10
LR = 0.05
BATCH_SIZE = 32
EPOCHS = 1


def die(prog, msg):
    """One-line error for the user, exit status 2."""
    sys.exit(f"{prog}: {msg}")


def _read_idx(path):
    import numpy as np

    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    shape = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find(folder, stem, prog):
    for name in (stem + ".gz", stem):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    die(prog, f"{os.path.join(folder, stem)}[.gz] is missing: install the Fashion-MNIST data set "
              "(apt-get install dataset-fashion-mnist) or pass --data-dir")


def load_fashion_mnist(split, data_dir=DATA_DIR, prog="peers", as_float=True):
    """(x, y) of the 'train' or 't10k' split: x float32 [n, 1, 28, 28] in [0, 1] (with
    as_float=False the file's uint8 [n, 28, 28], for to_float later), y uint8 [n]."""
    x = _read_idx(_find(data_dir, f"{split}-images-idx3-ubyte", prog))
    y = _read_idx(_find(data_dir, f"{split}-labels-idx1-ubyte", prog))
    return (to_float(x) if as_float else x), y


def to_float(x_u8):
    """uint8 images [n, 28, 28] -> float32 [n, 1, 28, 28], pixel / 255 (data/idx.h's scaling)."""
    import numpy as np

    return (x_u8.astype(np.float32) / np.float32(255.0))[:, None, :, :]


def read_split(path, num_examples=None, prog="peers"):
    """The clients' shards from starling-sim's --data.split_file: a list, client k's example
    indices (numpy int64) at position k."""
    import numpy as np

    if not os.path.exists(path):
        die(prog, f"split file {path} is missing: run.py writes it with starling-sim "
                  "--data.split_file (or pass the one you wrote)")
    shards = []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            shards.append(np.array(line.split(), dtype=np.int64))
    if not shards:
        die(prog, f"split file {path} holds no client line")
    if num_examples is not None:
        for k, s in enumerate(shards):
            if s.size and (s.min() < 0 or s.max() >= num_examples):
                die(prog, f"split file {path}: client {k} names an example outside 0..{num_examples - 1}")
    return shards


def set_threads(n):
    """torch.set_num_threads(n) when n > 0 (0 leaves PyTorch's default)."""
    import torch

    if n > 0:
        torch.set_num_threads(n)


def make_cnn(classes=NUM_CLASSES):
    """McMahan et al. 2017's CNN with 'same' padding (torch_trainer/models.cc's Cnn): the one of
    bench/baselines/fedavg_loop.py, so every Python baseline trains the same module."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "baselines"))
    import fedavg_loop  # noqa: PLC0415 (torch is imported only now)

    fedavg_loop.import_torch()
    return fedavg_loop.make_cnn(classes)


def train_local(model, x, y, seed):
    """One client's local training: EPOCHS epochs of plain SGD over (x, y) (torch tensors) in a
    fresh seeded order each epoch, the last batch partial. Returns (examples, mean train loss)."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    n = x.shape[0]
    loss_sum = 0.0
    for _ in range(EPOCHS):
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, BATCH_SIZE):
            idx = order[start:start + BATCH_SIZE]
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            loss_sum += loss.item() * idx.numel()
    return n, loss_sum / max(1, n * EPOCHS)


def accuracy(model, x, y, batch=1000):
    """Test-set accuracy and mean loss of a torch model on (x, y) torch tensors."""
    import torch
    import torch.nn.functional as F

    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for s in range(0, x.shape[0], batch):
            out = model(x[s:s + batch])
            correct += (out.argmax(1) == y[s:s + batch]).sum().item()
            loss += F.cross_entropy(out, y[s:s + batch], reduction="sum").item()
    return correct / x.shape[0], loss / x.shape[0]


def evaluated(rnd, every):
    """Whether round rnd (1-based) gets a central evaluation: every `every` rounds, as
    starling-sim's eval.every."""
    return every > 0 and rnd % every == 0


def add_common_args(p):
    p.add_argument("--split", required=True, help="split file written by starling-sim --data.split_file")
    p.add_argument("--data-dir", default=DATA_DIR)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--clients-per-round", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--setting", choices=["default", "best"], default="default")
    p.add_argument("--threads", type=int, default=None,
                   help="override the setting's torch.set_num_threads per training process (0: PyTorch's default); "
                        "for measuring which setting is best")
    p.add_argument("--out", required=True, help="result JSON written at the end")


def write_result(path, result):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)
