"""The demo task (bench/peers/common.py) in pfl (Apple's pfl-research), set up the way its
documentation teaches a PyTorch simulation: a FederatedDataset whose make_dataset_fn builds a
user's Dataset, a PyTorchModel around a torch module with loss() and metrics(), the
FederatedAveraging algorithm with NNAlgorithmParams / NNTrainHyperParams, a SimulatedBackend
(with WeightByDatapoints, so the average is weighted by examples as FedAvg's and Starling's), and
a central evaluation callback.

Settings (--setting):
  default  one process, PyTorch's and OpenBLAS's default threads (torch.get_num_threads() is 1 on
           this 2-core machine, OpenBLAS's pool 2): pfl's simulation as it runs when started with
           plain `python`; it trains and evaluates in that one process.
  best     pfl's own multi-worker mode: two worker processes (torch.distributed, Gloo on CPU),
           each training its part of every cohort with 1 PyTorch thread and 1 OpenBLAS thread
           (common.set_threads, as Starling bounds each of its processes); pfl splits the cohort
           between them (balanced by user_id_to_weight), all-reduces the summed statistics and
           splits the central evaluation between them too (as Starling's two workers). This script
           starts the two workers itself, the way pfl's GenericPlatform documents it:
           PFL_WORKER_ADDRESSES=127.0.0.1:P0,127.0.0.1:P1 and PFL_WORKER_RANK=r in each one's
           environment. (torchrun, pfl's other launch, fails in Debian's PyTorch 1.13 under Python
           3.11: torch/distributed/elastic's to_map gets None for its redirects.)

Counters: every process notes its loads of the data set and its threads in a probe log
(bench/peers/common.py: note; STARLING_PEERS_PROBE_LOG, OUT.probe.jsonl unless set), and the result
holds their summary (data_loads; max_train_loads_per_process must be 1).

pfl's FedAvg sends the model difference as dense float32 (no compression is built in: its
Postprocessor interface names sparsification as a use, but pfl ships no top-k or error-feedback
postprocessor), so only dense FedAvg runs here. pfl simulates no transport: the bytes reported
are the float32 model per client and direction, computed.

What differs from Starling by pfl's design: a user's Dataset is iterated in its stored order
(pfl shuffles no local batches); the central evaluation follows our cadence (after round k,
k % eval_every == 0). At --setting default pfl also evaluates each trained user's data before and
after local training on the iterations where its evaluation_frequency fires (0-based 0, 5, 10,
...), as it does by default; best keeps only iteration 0's (pfl always evaluates there), work the
task does not ask for (evaluation_frequency = rounds + 1).

  python bench/peers/pfl_sim.py --split FILE --out RESULT.json [--setting default|best]
"""
import argparse
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

PROG = "pfl_sim.py"


def use_probe_log(out):
    """The probe log every process of this run appends to: STARLING_PEERS_PROBE_LOG when set, else
    OUT.probe.jsonl, emptied by the first process (the launcher, or the single process)."""
    if not os.environ.get("STARLING_PEERS_PROBE_LOG"):
        path = os.path.abspath(out) + ".probe.jsonl"
        if os.path.exists(path):
            os.remove(path)
        os.environ["STARLING_PEERS_PROBE_LOG"] = path
    return os.environ["STARLING_PEERS_PROBE_LOG"]


def launch_workers(n):
    """Starts this script n times as pfl workers on 127.0.0.1 and waits for them; rank 0 writes
    the result. Returns the exit status (the first non-zero one)."""
    import socket
    import subprocess
    import time as _t

    ports = []
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    addresses = ",".join(f"127.0.0.1:{p}" for p in ports)
    procs = []
    for rank in range(n):
        env = dict(os.environ, PFL_WORKER_ADDRESSES=addresses, PFL_WORKER_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
    # A worker that fails leaves the others waiting in a collective: stop them (by their pids).
    rc = 0
    while procs:
        _t.sleep(0.2)
        for pr in list(procs):
            r = pr.poll()
            if r is None:
                continue
            procs.remove(pr)
            if r != 0 and rc == 0:
                rc = r
                for other in procs:
                    other.terminate()
    return rc


def _launcher_workers():
    """With --setting best (and more than one --workers) and no PFL_WORKER_RANK yet, this process
    only starts the workers: it decides so before importing PyTorch or pfl, so that it stays small
    (its memory counts in the measured process tree)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--setting", default="default")
    pre.add_argument("--workers", type=int, default=2)
    pre.add_argument("--out", default=None)
    k, _ = pre.parse_known_args()
    if k.out and "PFL_WORKER_RANK" not in os.environ:
        use_probe_log(k.out)  # before the workers start: they inherit it
    return k.workers if k.setting == "best" and k.workers > 1 and "PFL_WORKER_RANK" not in os.environ else 0


if __name__ == "__main__" and _launcher_workers():
    sys.exit(launch_workers(_launcher_workers()))

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from pfl.version import __version__ as pfl_version
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.callback.central_evaluation import CentralEvaluationCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.internal.ops.selector import get_framework_module as get_ops
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel
except ImportError as e:
    common.die(PROG, f"{e}: run it with the peers' virtual environment (bash scripts/peers-venv.sh; "
                     "then $STARLING_PEERS_VENV/bin/python, default ~/.cache/starling/peers-venv)")


def make_module(net=None):
    """`net` (the CNN by default; pfl_dp.py passes the MLP) with the two methods pfl's
    PyTorchModel calls: loss(*data), metrics(*data)."""
    net = common.make_cnn() if net is None else net

    class PflCnn(type(net)):
        def loss(self, x, y, eval=False):
            self.eval() if eval else self.train()
            return F.cross_entropy(self(x), y.long())

        def metrics(self, x, y, eval=True):
            self.eval() if eval else self.train()
            with torch.no_grad():
                out = self(x)
                loss = F.cross_entropy(out, y.long(), reduction="sum").item()
                correct = (out.argmax(1) == y).sum().item()
            n = len(y)
            return {"loss": Weighted(loss, n), "accuracy": Weighted(correct, n)}

    net.__class__ = PflCnn
    return net


class EveryKRounds(CentralEvaluationCallback):
    """pfl's CentralEvaluationCallback on our cadence: after round r (1-based) when
    r % frequency == 0 (pfl's own counts central iterations from 0 and evaluates before round 1),
    recording each result for the JSON."""

    def __init__(self, dataset, eval_params, frequency, sink):
        super().__init__(dataset, model_eval_params=eval_params, frequency=frequency)
        self._sink = sink

    def on_train_begin(self, *, model):
        return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        rnd = central_iteration + 1
        if rnd % self._frequency != 0:
            return False, Metrics()
        stop, metrics = self._eval(model)
        values = {str(k): v for k, v in metrics.to_simple_dict().items()}
        self._sink.append({"round": rnd,
                           "accuracy": values.get("Central val | accuracy"),
                           "loss": values.get("Central val | loss")})
        return stop, metrics


class RoundClock(TrainingProcessCallback):
    """The end time of every central iteration, and pfl's aggregated train metrics."""

    def __init__(self, sink):
        self._sink = sink

    def on_train_begin(self, *, model):
        self.t_start = time.time()
        return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        self._sink.append({"round": central_iteration + 1, "t_end": time.time()})
        return False, Metrics()


def main():
    p = argparse.ArgumentParser(description="The demo task in pfl's simulation (bench/peers/)")
    common.add_common_args(p)
    p.add_argument("--workers", type=int, default=2, help="pfl worker processes with --setting best")
    p.add_argument("--stateful", action="store_true",
                   help="per-user state (bench/peers/scale.py): FedAvg whose clients keep a model-sized float32 "
                        "residual in pfl's InMemoryUserStateStorage and send top-k 1%% with error feedback "
                        "(the top-k and error feedback are our code; pfl ships no compressor)")
    a = p.parse_args()
    probe = use_probe_log(a.out)
    if a.threads is not None:
        common.set_threads(a.threads)
    elif a.setting == "best":
        common.set_threads(1)
    common.note_threads("pfl-worker")
    x, y = common.load_fashion_mnist("train", a.data_dir, PROG, as_float=False)  # uint8; per user below
    shards = common.read_split(a.split, len(y), PROG)
    x_test, y_test = common.load_fashion_mnist("t10k", a.data_dir, PROG)
    y = y.astype(np.int64)

    def make_user(user_id):
        idx = shards[user_id]
        return Dataset(raw_data=[common.to_float(x[idx]), y[idx]], user_id=user_id)

    users = list(range(len(shards)))
    train_data = FederatedDataset(make_user, get_user_sampler("minimize_reuse", users),
                                  user_id_to_weight={u: len(shards[u]) for u in users})
    test_data = Dataset(raw_data=[x_test, y_test.astype(np.int64)])

    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    module = make_module(common.make_model(a.model))
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    numel = sum(t.numel() for t in module.state_dict().values())

    evals, clock = [], []
    # pfl evaluates every trained user's data before and after local training on the iterations
    # where evaluation_frequency fires (0, k, 2k, ...: the first always). Its default here is our
    # central cadence; best, tuned for speed, keeps only the first (the task's evaluation is the
    # central one, which EveryKRounds runs on its own cadence).
    user_eval_every = a.eval_every if a.setting == "default" else a.rounds + 1
    algorithm_params = NNAlgorithmParams(central_num_iterations=a.rounds,
                                         evaluation_frequency=user_eval_every,
                                         train_cohort_size=a.clients_per_round, val_cohort_size=None)
    train_params = NNTrainHyperParams(local_learning_rate=common.LR, local_num_epochs=common.EPOCHS,
                                      local_batch_size=common.BATCH_SIZE)
    eval_params = NNEvalHyperParams(local_batch_size=1000)
    backend = SimulatedBackend(training_data=train_data, val_data=train_data,
                               postprocessors=[WeightByDatapoints()])
    rc = RoundClock(clock)
    # The clock last: a round ends after its evaluation, as in starling-sim's metrics.
    callbacks = [EveryKRounds(test_data, eval_params, a.eval_every, evals), rc]
    t0 = time.time()
    algorithm = FederatedAveraging()
    if a.stateful:
        algorithm = _error_feedback_fedavg(FederatedAveraging)
    algorithm.run(algorithm_params=algorithm_params, backend=backend, model=model,
                             model_train_params=train_params, model_eval_params=eval_params,
                             callbacks=callbacks)
    t1 = time.time()
    dist = get_ops().distributed
    if dist.global_rank != 0:
        return
    mb = 4 * numel
    result = {
        "system": "pfl",
        "setting": a.setting,
        "compressor": ("topk 1% with error feedback, residual in pfl's InMemoryUserStateStorage (our code)"
                       if a.stateful else "none"),
        "versions": {"pfl": pfl_version,
                     "torch": torch.__version__, "numpy": np.__version__},
        "workers": dist.world_size,
        "launch": ("PFL_WORKER_ADDRESSES / PFL_WORKER_RANK, one process per worker"
                   if dist.world_size > 1 else "one process"),
        "user_evaluation_frequency": user_eval_every,
        "client_threads": torch.get_num_threads(),
        "client_blas_threads": common.blas_threads(),
        "data_loads": common.probe_summary(probe),
        "rounds": len(clock),
        "clients_trained": len(clock) * a.clients_per_round,
        "loop_seconds": (clock[-1]["t_end"] - rc.t_start) if clock else None,
        "run_seconds_inside": t1 - t0,
        "per_round": [{"round": r["round"],
                       "seconds": r["t_end"] - (clock[i - 1]["t_end"] if i else rc.t_start),
                       "downlink_bytes": mb * a.clients_per_round,
                       "uplink_bytes": mb * a.clients_per_round}
                      for i, r in enumerate(clock)],
        "bytes_note": "computed: a dense float32 model (or difference) per sampled client and direction; "
                      "pfl simulates no transport",
        "evals": evals,
    }
    result["max_train_loads_per_process"] = result["data_loads"]["max_train_loads_per_process"]
    common.write_result(a.out, result)


def _error_feedback_fedavg(base, density=0.01):
    """FedAvg whose users keep a residual (pfl's per-user state, InMemoryUserStateStorage, the
    storage its SCAFFOLD uses) and send the top-k `density` of update + residual; our code."""
    from pfl.data.user_state import InMemoryUserStateStorage
    from pfl.exception import UserNotFoundError

    storage = InMemoryUserStateStorage()

    class ErrorFeedbackFedAvg(base):
        def train_one_user(self, initial_model_state, model, user_dataset, central_context):
            stats, metrics = super().train_one_user(initial_model_state, model, user_dataset, central_context)
            uid = str(user_dataset.user_id)
            try:
                residual = storage.load_state(uid, "residual")
            except UserNotFoundError:
                residual = {k: torch.zeros_like(v) for k, v in stats.items()}
            keys = list(stats.keys())
            full = {k: stats[k] + residual[k] for k in keys}
            flat = torch.cat([full[k].reshape(-1) for k in keys])
            kth = max(1, int(flat.numel() * density))
            thresh = torch.topk(flat.abs(), kth, sorted=False).values.min()
            new_residual = {}
            for k in keys:
                sent = torch.where(full[k].abs() >= thresh, full[k], torch.zeros_like(full[k]))
                new_residual[k] = full[k] - sent
                stats[k] = sent
            storage.save_state(new_residual, uid, "residual")
            return stats, metrics

    return ErrorFeedbackFedAvg()


if __name__ == "__main__":
    main()
