#!/usr/bin/python3
"""A plain PyTorch FedAvg loop: the reference starling-sim is measured against for speed.

What it runs, chosen to match starling-sim on bench/baselines/speed.toml:
  - McMahan et al.'s CNN, as torch_trainer's "cnn": conv 5x5 1->32 (padding 2), ReLU, max-pool 2,
    conv 5x5 32->64 (padding 2), ReLU, max-pool 2, linear 3136->512, ReLU, linear 512->10
    (1,663,370 parameters), PyTorch's default initialisation.
  - Fashion-MNIST's training split from the Debian package (IDX .gz), pixels scaled to [0, 1],
    split IID into --clients equal shards (a seeded shuffle, then consecutive slices).
  - Each round: --clients-per-round clients sampled without replacement; each trains the global
    model for --epochs local epochs of SGD (lr --lr, no momentum, batch --batch-size, a fresh
    permutation per epoch, the last batch partial); the new global model is the average of the
    client models weighted by their number of examples (plain FedAvg).
  - The clients of a round are trained one after another in this process, on one model object
    that is reloaded from the global state for each client.

Threads: --threads N calls torch.set_num_threads(N). Debian's PyTorch multiplies matrices with
OpenBLAS (libopenblas0-pthread), whose own thread pool (one thread per core by default) is not
bounded by torch.set_num_threads; --blas-threads N sets OPENBLAS_NUM_THREADS=N before torch loads.

Timing: each round is timed from sampling to the new global model; data loading, model creation
and the final test-set evaluation are outside the timed part. Prints one JSON object on stdout.

Needs Debian's python3-torch (run with /usr/bin/python3): apt-get install python3-torch
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

# torch is imported in main(), after --blas-threads has set OPENBLAS_NUM_THREADS (OpenBLAS reads it
# once, when the library is loaded).
torch = nn = F = None


def import_torch():
    global torch, nn, F
    try:
        import torch as t
        import torch.nn.functional as f
    except ImportError:
        sys.exit("fedavg_loop.py: PyTorch is missing; install Debian's package: apt-get install python3-torch "
                 "(and run this script with /usr/bin/python3)")
    torch, nn, F = t, t.nn, f

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """Reads an IDX file (optionally .gz) into a uint8 tensor of its declared shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    shape = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    body = bytearray(raw[4 + 4 * ndim:])
    return torch.frombuffer(body, dtype=torch.uint8).reshape(shape)


def find_file(folder, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    sys.exit(f"fedavg_loop.py: {stem}[.gz] not found in {folder} (Debian package dataset-fashion-mnist)")


def load_split(folder, split):
    x = read_idx(find_file(folder, f"{split}-images-idx3-ubyte"))
    y = read_idx(find_file(folder, f"{split}-labels-idx1-ubyte"))
    return x.float().div_(255.0).unsqueeze(1), y.long()


def make_cnn(classes=10):
    """McMahan et al. 2017's CNN with 'same' padding, as torch_trainer/models.cc's Cnn."""

    class Cnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
            self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
            self.fc1 = nn.Linear(64 * 7 * 7, 512)
            self.fc2 = nn.Linear(512, classes)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            return self.fc2(F.relu(self.fc1(x.flatten(1))))

    return Cnn()


def train_client(model, x, y, epochs, batch_size, lr, gen):
    """Local SGD on one client's examples (on the model's device); returns the number of
    examples."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    n = x.shape[0]
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen).to(x.device)
        for start in range(0, n, batch_size):
            idx = perm[start:start + batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
    return n


def evaluate(model, x, y, batch=1000):
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, x.shape[0], batch):
            correct += (model(x[start:start + batch]).argmax(1) == y[start:start + batch]).sum().item()
    return correct / x.shape[0]


def main():
    p = argparse.ArgumentParser(description="Plain PyTorch FedAvg loop (baseline for starling-sim)")
    p.add_argument("--data-dir", default=DEFAULT_DATA)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    p.add_argument("--blas-threads", type=int, default=0,
                   help="OPENBLAS_NUM_THREADS for Debian's OpenBLAS, whose own thread pool torch.set_num_threads "
                        "does not bound (0: leave the environment as it is)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clients", type=int, default=100, help="clients in the pool (IID split)")
    p.add_argument("--clients-per-round", type=int, default=10)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-eval", action="store_true", help="skip the test-set accuracy at the end")
    p.add_argument("--device", default="cpu",
                   help="cpu or cuda: where the models, the clients' data and the training live "
                        "(the data is moved there before timing; a round's time ends with a device "
                        "synchronisation)")
    a = p.parse_args()
    if a.blas_threads > 0:
        os.environ["OPENBLAS_NUM_THREADS"] = str(a.blas_threads)
    import_torch()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    x_train, y_train = load_split(a.data_dir, "train")
    if a.clients < 1 or a.clients > x_train.shape[0]:
        sys.exit(f"fedavg_loop.py: --clients must be in [1, {x_train.shape[0]}]")
    if not 1 <= a.clients_per_round <= a.clients:
        sys.exit("fedavg_loop.py: --clients-per-round must be in [1, --clients]")
    order = torch.randperm(x_train.shape[0])
    per = x_train.shape[0] // a.clients
    shards = [order[c * per:(c + 1) * per] for c in range(a.clients)]
    # Each client's examples as contiguous tensors, made before timing (as a simulator keeps them).
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("fedavg_loop.py: --device cuda, but PyTorch sees no GPU")
    client_data = [(x_train[s].contiguous().to(device), y_train[s].contiguous().to(device))
                   for s in shards]

    global_model = make_cnn().to(device)
    local = make_cnn().to(device)
    gen = torch.Generator().manual_seed(a.seed)
    round_seconds = []
    samples = 0
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        chosen = torch.randperm(a.clients, generator=gen)[:a.clients_per_round].tolist()
        global_state = {k: v.clone() for k, v in global_model.state_dict().items()}
        total = 0
        acc = {k: torch.zeros_like(v) for k, v in global_state.items()}
        for c in chosen:
            local.load_state_dict(global_state)
            x, y = client_data[c]
            n = train_client(local, x, y, a.epochs, a.batch_size, a.lr, gen)
            with torch.no_grad():
                for k, v in local.state_dict().items():
                    acc[k].add_(v, alpha=float(n))
            total += n
            samples += n * a.epochs
        with torch.no_grad():
            global_model.load_state_dict({k: v / total for k, v in acc.items()})
        if device.type == "cuda":
            torch.cuda.synchronize()
        round_seconds.append(time.perf_counter() - t0)

    wall = sum(round_seconds)
    clients = a.rounds * a.clients_per_round
    out = {
        "impl": "pytorch_fedavg_loop",
        "device": str(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "threads_requested": a.threads,
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "params": sum(t.numel() for t in global_model.parameters()),
        "rounds": a.rounds,
        "clients_per_round": a.clients_per_round,
        "samples_per_client": per,
        "clients_trained": clients,
        "samples_trained": samples,
        "wall_seconds": wall,
        "round_seconds": round_seconds,
        "samples_per_s": samples / wall,
        "clients_per_s": clients / wall,
    }
    # Without the first round (one-off costs: allocator warm-up, first use of each kernel).
    if a.rounds > 1:
        steady = sum(round_seconds[1:])
        out["steady_clients_per_s"] = (a.rounds - 1) * a.clients_per_round / steady
    if not a.no_eval:
        x_test, y_test = load_split(a.data_dir, "t10k")
        out["test_accuracy"] = evaluate(global_model, x_test.to(device), y_test.to(device))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
