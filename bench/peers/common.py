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
    as_float=False the file's uint8 [n, 28, 28], for to_float later), y uint8 [n]. Every call is
    a load of the data set: it is noted in the probe log (note())."""
    x = _read_idx(_find(data_dir, f"{split}-images-idx3-ubyte", prog))
    y = _read_idx(_find(data_dir, f"{split}-labels-idx1-ubyte", prog))
    note("load", split=split, prog=prog)
    return (to_float(x) if as_float else x), y


def count_examples(split, data_dir=DATA_DIR, prog="peers"):
    """The number of examples of a split, from its labels file's header alone (no numpy, no load:
    for a launcher that only checks its arguments)."""
    path = _find(data_dir, f"{split}-labels-idx1-ubyte", prog)
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        head = f.read(8)
    zero, dtype, ndim, n = struct.unpack(">HBBI", head)
    if zero != 0 or dtype != 0x08 or ndim != 1:
        die(prog, f"{path}: not an IDX file of unsigned bytes with one dimension")
    return n


def to_float(x_u8):
    """uint8 images [n, 28, 28] -> float32 [n, 1, 28, 28], pixel / 255 (data/idx.h's scaling)."""
    import numpy as np

    return (x_u8.astype(np.float32) / np.float32(255.0))[:, None, :, :]


def check_split(path, num_examples, prog="peers"):
    """The number of clients of a split file, each index checked against num_examples; pure Python
    (read_split's checks, without numpy), for a launcher that only checks its arguments."""
    if not os.path.exists(path):
        die(prog, f"split file {path} is missing: run.py writes it with starling-sim "
                  "--data.split_file (or pass the one you wrote)")
    clients = 0
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            idx = [int(v) for v in line.split()]
            if idx and (min(idx) < 0 or max(idx) >= num_examples):
                die(prog, f"split file {path}: client {clients} names an example outside 0..{num_examples - 1}")
            clients += 1
    if not clients:
        die(prog, f"split file {path} holds no client line")
    return clients


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


def _openblas():
    """Debian's PyTorch multiplies matrices with OpenBLAS (libopenblas0-pthread), whose own thread
    pool (one thread per core by default, or OPENBLAS_NUM_THREADS / OMP_NUM_THREADS when the library
    loads) torch.set_num_threads does not touch. The loaded library, or None without OpenBLAS."""
    import ctypes

    try:
        lib = ctypes.CDLL("libopenblas.so.0")  # the copy torch loaded: dlopen returns its handle
        lib.openblas_get_num_threads  # noqa: B018 (raises AttributeError when absent)
        return lib
    except (OSError, AttributeError):
        return None


def blas_threads():
    """OpenBLAS's thread count in this process, None without OpenBLAS."""
    lib = _openblas()
    return lib.openblas_get_num_threads() if lib else None


def set_threads(n):
    """torch.set_num_threads(n) and OpenBLAS's pool to n when n > 0, as Starling does for each of
    its processes (torch_trainer/threads.cc: setThreads); 0 leaves both at their defaults."""
    import torch

    if n > 0:
        torch.set_num_threads(n)
        lib = _openblas()
        if lib:
            lib.openblas_set_num_threads(n)


def note(event, **fields):
    """Appends one JSON line {event, pid, time, **fields} to the file named by STARLING_PEERS_PROBE_LOG
    (nothing when it is unset): the counters of bench/peers/ (data loads, threads per process),
    written by every process of every system and read back by the launchers (probe_summary). One
    write of a short line in append mode, so lines of concurrent processes do not interleave."""
    path = os.environ.get("STARLING_PEERS_PROBE_LOG")
    if not path:
        return
    import time

    line = json.dumps({"event": event, "pid": os.getpid(), "time": time.time(), **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def note_threads(role):
    """Notes this process's PyTorch and OpenBLAS thread counts under `role`."""
    import torch

    note("threads", role=role, torch=torch.get_num_threads(), blas=blas_threads())


def probe_summary(path):
    """What the probe log at `path` says, per process: its role(s), the loads of each split, its
    threads; and max_train_loads_per_process, the figure that must be 1 (the training set loaded
    once per worker process, never per client or per message)."""
    procs = {}
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                p = procs.setdefault(str(e.get("pid")), {"roles": [], "loads": {}})
                if e.get("event") == "load":
                    p["loads"][e["split"]] = p["loads"].get(e["split"], 0) + 1
                elif e.get("event") == "threads":
                    if e.get("role") not in p["roles"]:
                        p["roles"].append(e.get("role"))
                    p["torch_threads"], p["blas_threads"] = e.get("torch"), e.get("blas")
    train = [p["loads"].get("train", 0) for p in procs.values()]
    return {"processes": procs,
            "processes_loading_train": sum(1 for n in train if n),
            "train_loads_total": sum(train),
            "max_train_loads_per_process": max(train) if train else 0}


def make_cnn(classes=NUM_CLASSES):
    """McMahan et al. 2017's CNN with 'same' padding (torch_trainer/models.cc's Cnn): the one of
    bench/baselines/fedavg_loop.py, so every Python baseline trains the same module."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "baselines"))
    import fedavg_loop  # noqa: PLC0415 (torch is imported only now)

    fedavg_loop.import_torch()
    return fedavg_loop.make_cnn(classes)


def make_model(name):
    """The module of --model: "cnn" (make_cnn) or "mlp" (make_mlp)."""
    return make_mlp() if name == "mlp" else make_cnn()


def make_mlp(hidden=200, classes=NUM_CLASSES, features=28 * 28):
    """torch_trainer/models.cc's "mlp" (mlp:hidden=200): flatten, fc1 features->hidden, ReLU,
    fc2 hidden->classes (159,010 parameters at the defaults), PyTorch's default initialisation;
    the parameter names fc1.weight, fc1.bias, fc2.weight, fc2.bias as Starling's."""
    import torch.nn as nn

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(features, hidden)
            self.fc2 = nn.Linear(hidden, classes)

        def forward(self, x):
            return self.fc2(self.fc1(x.flatten(1)).relu())

    return Mlp()


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
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn",
                   help="the task's CNN, or Starling's mlp:hidden=200 (bench/peers/scale.py's cross-device runs)")
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


# ---- the two Flower Apps' shared steps (bench/peers/flower_app, bench/peers/flower_secagg_app)

def flower_client_shard(cache, pid, cfg, prog):
    """Client `pid`'s shard as float32 torch tensors, cut from this process's copy of the training
    set, which `cache` (a Ray actor's module-level dict) loads once, on the process's first
    message, with the run config's client-threads (0: as Ray and PyTorch set them)."""
    import numpy as np
    import torch

    if "train" not in cache:
        set_threads(int(cfg["client-threads"]))
        note_threads("flower-clientapp")
        x, y = load_fashion_mnist("train", str(cfg["data-dir"]), prog, as_float=False)
        cache["train"] = (x, y)
        cache["split"] = read_split(str(cfg["split"]), len(y), prog)
    x, y = cache["train"]
    idx = cache["split"][pid]
    return torch.from_numpy(to_float(x[idx])), torch.from_numpy(y[idx].astype(np.int64))


def flower_server_start(cfg, prog):
    """A Flower ServerApp's start: the central evaluation's threads (eval-threads), the seeded
    initial model, and the test set as torch tensors. Returns (model, x_test, y_test)."""
    import numpy as np
    import torch

    set_threads(int(cfg["eval-threads"]))
    note_threads("flower-serverapp")
    torch.manual_seed(int(cfg["seed"]))
    model = make_model(str(cfg["model"]))
    x_test, y_test = load_fashion_mnist("t10k", str(cfg["data-dir"]), prog)
    return model, torch.from_numpy(x_test), torch.from_numpy(y_test.astype(np.int64))
