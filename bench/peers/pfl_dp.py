"""Central differential privacy in pfl (Apple's pfl-research), on the task of
bench/privacy_accuracy.sh (Starling's "Accuracy against privacy", q 0.01), so docs/results.md can
put the two side by side.

The task, as Starling runs it: 10,000 clients of 60 Fashion-MNIST examples each (the split that
starling-sim writes with --data.partition sampled:size=60 --model.seed 1 --data.split_file), 100
clients a round, 300 rounds, the MLP (common.make_mlp: 784->200, ReLU, 200->10, PyTorch's default
initialisation; --model cnn: common.make_cnn, Starling's "cnn"), local training 1 epoch of plain SGD lr 0.1 batch 20, the server step x += mean
delta (pfl: central SGD lr 1.0), test accuracy on the 10,000 test images every 10 rounds; every
update clipped to l2 norm 0.3 and weighing 1, Gaussian noise of stddev sigma * 0.3 on the sum.

How pfl runs it (one process, torch and OpenBLAS threads 1), the way its documentation teaches
central DP:
  - FederatedDataset over the split, users drawn by get_user_sampler(--user-sampler): 'random'
    (default: each of the cohort's 100 draws uniform over the 10,000 users, independently, so a
    user may appear twice in a round) or 'minimize_reuse' (users in a fixed cycle);
  - FederatedAveraging, PyTorchModel (local torch.optim.SGD, central SGD lr 1.0),
    NNAlgorithmParams(train_cohort_size=100, central_num_iterations=300), NNTrainHyperParams;
  - no weighting postprocessor: pfl's user statistics weigh 1 each (MappedVectorStatistics'
    default weight), so FedAvg's statistics.average() divides the (noisy) sum by the cohort's total
    weight, the number of users trained (100);
  - finite epsilon: PLDPrivacyAccountant(num_compositions=300, sampling_probability=100/10000,
    mechanism='gaussian', epsilon=E, delta=1e-5) -> GaussianMechanism.from_privacy_accountant(
    accountant, clipping_bound=0.3) -> CentrallyAppliedPrivacyMechanism, the SimulatedBackend's
    postprocessor (constrain_sensitivity per user, add_noise on the sum); the noise multiplier an
    RDPPrivacyAccountant gives for the same budget is recorded beside it (--accountant rdp runs
    with it instead);
  - --epsilon inf: CentrallyAppliedPrivacyMechanism(NormClippingOnly(2, 0.3)): the clipping, no noise.
pfl's own per-user evaluation of trained users is off (evaluation_frequency past the last round:
pfl still evaluates on iteration 0, as it always does); the central evaluation runs on our cadence
(pfl_sim.EveryKRounds).

  ~/.cache/starling/peers-venv/bin/python bench/peers/pfl_dp.py --split /tmp/pfl-dp/split.txt \\
      --epsilon 1 --out /tmp/pfl-dp/eps1.json [--rounds 300] [--user-sampler random|minimize_reuse]
      [--accountant pld|rdp] [--model mlp|cnn]

The split: build/bin/starling-sim --model.spec mlp --data.num_clients 10000 --data.partition
sampled:size=60 --model.seed 1 --data.split_file /tmp/pfl-dp/split.txt --train.rounds 1
--sim.workers 1 --sim.device cpu
"""
import argparse
import math
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

PROG = "pfl_dp.py"

try:
    import numpy as np
    import torch
    from pfl.version import __version__ as pfl_version
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel
    from pfl.privacy import PLDPrivacyAccountant, RDPPrivacyAccountant
    from pfl.privacy.gaussian_mechanism import GaussianMechanism
    from pfl.privacy.privacy_mechanism import CentrallyAppliedPrivacyMechanism, NormClippingOnly
    import pfl_sim  # EveryKRounds, RoundClock, use_probe_log
except ImportError as e:
    common.die(PROG, f"{e}: run it with the peers' virtual environment (bash scripts/peers-venv.sh; "
                     "then $STARLING_PEERS_VENV/bin/python, default ~/.cache/starling/peers-venv)")


class AggregateProbe(TrainingProcessCallback):
    """pfl's aggregate metrics of chosen rounds whose names speak of weight, devices or DP: the
    cohort's total weight (FedAvg's denominator), the users trained, the noise pfl added."""

    KEYS = ("weight", "devices", "dp", "norm", "clip", "data points")

    def __init__(self, rounds, sink):
        self._rounds, self._sink = set(rounds), sink

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        rnd = central_iteration + 1
        if rnd in self._rounds:
            simple = {str(k): v for k, v in aggregate_metrics.to_simple_dict().items()}
            self._sink.append({"round": rnd, **{k: v for k, v in simple.items()
                                                if any(w in k.lower() for w in self.KEYS)}})
        return False, Metrics()


def recording_fedavg(sink):
    """pfl's FederatedAveraging, recording the weight of the aggregated statistics of each round
    just before its statistics.average() divides the (noisy) sum by it: FedAvg's denominator."""

    class RecordingFedAvg(FederatedAveraging):
        def process_aggregated_statistics(self, central_context, aggregate_metrics, model, statistics):
            sink.append(float(statistics.weight))
            return super().process_aggregated_statistics(central_context, aggregate_metrics, model, statistics)

    return RecordingFedAvg()


def sigma_for(kind, epsilon, delta, q, rounds):
    cls = {"pld": PLDPrivacyAccountant, "rdp": RDPPrivacyAccountant}[kind]
    t = time.time()
    acc = cls(num_compositions=rounds, sampling_probability=q, mechanism="gaussian",
              epsilon=epsilon, delta=delta)
    return acc, time.time() - t


def main():
    p = argparse.ArgumentParser(description="Central DP in pfl's simulation on Starling's DP task (bench/peers/)")
    p.add_argument("--split", required=True, help="split file written by starling-sim --data.split_file")
    p.add_argument("--data-dir", default=common.DATA_DIR)
    p.add_argument("--epsilon", required=True, help="target epsilon, or inf (clipping only, no noise)")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--clip", type=float, default=0.3)
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--accounted-rounds", type=int, default=None,
                   help="num_compositions of the accountant (default --rounds; a short timing run "
                        "can keep 300 so that its noise is the full run's)")
    p.add_argument("--cohort", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--hidden", type=int, default=200)
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp",
                   help="mlp (mlp:hidden=--hidden) or cnn (McMahan et al.'s CNN, Starling's cnn)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--user-sampler", choices=["random", "minimize_reuse"], default="random")
    p.add_argument("--accountant", choices=["pld", "rdp"], default="pld",
                   help="the accountant whose noise multiplier the run uses (both are reported)")
    p.add_argument("--out", required=True, help="result JSON written at the end")
    a = p.parse_args()
    eps = math.inf if a.epsilon.lower() in ("inf", "infinity") else float(a.epsilon)
    accounted = a.accounted_rounds or a.rounds

    probe = pfl_sim.use_probe_log(a.out)
    common.set_threads(a.threads)
    common.note_threads("pfl-dp")
    x, y = common.load_fashion_mnist("train", a.data_dir, PROG, as_float=False)
    shards = common.read_split(a.split, len(y), PROG)
    x_test, y_test = common.load_fashion_mnist("t10k", a.data_dir, PROG)
    y = y.astype(np.int64)
    population = len(shards)
    q = a.cohort / population

    def make_user(user_id):
        idx = shards[user_id]
        return Dataset(raw_data=[common.to_float(x[idx]), y[idx]], user_id=user_id)

    torch.manual_seed(a.seed)
    np.random.seed(a.seed)  # pfl's random sampler draws from numpy's global state
    users = list(range(population))
    train_data = FederatedDataset(make_user, get_user_sampler(a.user_sampler, users))
    test_data = Dataset(raw_data=[x_test, y_test.astype(np.int64)])

    privacy = {"clip": a.clip, "delta": a.delta, "sampling_probability": q,
               "num_compositions": accounted}
    if math.isinf(eps):
        mechanism = NormClippingOnly(2.0, a.clip)
        privacy.update(epsilon="inf", mechanism="NormClippingOnly(2, clip), centrally applied")
    else:
        pld, pld_s = sigma_for("pld", eps, a.delta, q, accounted)
        rdp, rdp_s = sigma_for("rdp", eps, a.delta, q, accounted)
        acc = pld if a.accountant == "pld" else rdp
        mechanism = GaussianMechanism.from_privacy_accountant(acc, clipping_bound=a.clip)
        privacy.update(epsilon=eps, accountant=a.accountant,
                       sigma_pld=pld.noise_parameter, sigma_rdp=rdp.noise_parameter,
                       accountant_seconds={"pld": pld_s, "rdp": rdp_s},
                       noise_multiplier=mechanism.relative_noise_stddev,
                       noise_stddev_on_sum=mechanism.relative_noise_stddev * a.clip,
                       mechanism="GaussianMechanism.from_privacy_accountant, CentrallyAppliedPrivacyMechanism")
        print(f"{PROG}: epsilon {eps}: sigma PLD {pld.noise_parameter:.4f} ({pld_s:.1f} s), "
              f"RDP {rdp.noise_parameter:.4f} ({rdp_s:.1f} s); using {a.accountant}", file=sys.stderr, flush=True)

    net = common.make_mlp(a.hidden) if a.model == "mlp" else common.make_cnn()
    module = pfl_sim.make_module(net)
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    algorithm_params = NNAlgorithmParams(central_num_iterations=a.rounds,
                                         evaluation_frequency=a.rounds + 1,
                                         train_cohort_size=a.cohort, val_cohort_size=None)
    train_params = NNTrainHyperParams(local_learning_rate=a.lr, local_num_epochs=a.epochs,
                                      local_batch_size=a.batch_size)
    eval_params = NNEvalHyperParams(local_batch_size=1000)
    backend = SimulatedBackend(training_data=train_data, val_data=train_data,
                               postprocessors=[CentrallyAppliedPrivacyMechanism(mechanism)])
    evals, clock, probes = [], [], []
    rc = pfl_sim.RoundClock(clock)
    callbacks = [pfl_sim.EveryKRounds(test_data, eval_params, a.eval_every, evals),
                 AggregateProbe({1, a.rounds}, probes), rc]
    t0 = time.time()
    denominators = []
    recording_fedavg(denominators).run(algorithm_params=algorithm_params, backend=backend, model=model,
                             model_train_params=train_params, model_eval_params=eval_params,
                             callbacks=callbacks)
    t1 = time.time()
    accs = [e["accuracy"] for e in evals if e["accuracy"] is not None]
    result = {
        "system": "pfl",
        "versions": {"pfl": pfl_version, "torch": torch.__version__, "numpy": np.__version__},
        "task": {"population": population, "cohort": a.cohort, "rounds": a.rounds,
                 "model": f"mlp:hidden={a.hidden}" if a.model == "mlp" else "cnn", "lr": a.lr, "batch_size": a.batch_size,
                 "epochs": a.epochs, "central_lr": 1.0, "seed": a.seed, "user_sampler": a.user_sampler,
                 "split": os.path.abspath(a.split)},
        "privacy": privacy,
        "threads": {"torch": torch.get_num_threads(), "blas": common.blas_threads()},
        "data_loads": common.probe_summary(probe),
        "aggregate_metrics": probes,
        "denominator": {"min": min(denominators), "max": max(denominators), "rounds": len(denominators),
                        "note": "the weight of the summed statistics that FedAvg's statistics.average() "
                                "divides by (each user's statistics weigh 1)"} if denominators else None,
        "run_seconds": t1 - t0,
        "seconds_per_round": (t1 - t0) / max(1, len(clock)),
        "rounds_done": len(clock),
        "evals": evals,
        "mean_last5": sum(accs[-5:]) / len(accs[-5:]) if accs else None,
        "final": accs[-1] if accs else None,
    }
    common.write_result(a.out, result)
    print(f"{PROG}: epsilon {a.epsilon}: mean of last 5 {100 * result['mean_last5']:.2f}%, final "
          f"{100 * result['final']:.2f}%, {t1 - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
