"""The ServerApp of the demo task (bench/peers/flower_sim.py): its @app.main() runs FedAvg of
flwr.serverapp.strategy (strategy.start with a central evaluate_fn on the 10,000 test images) and
writes what it measured to the run config's result-file (JSON), which flower_sim.py completes.

It runs in the flwr-simulation process that Flower's local SuperLink starts for the run. The
central evaluation runs there while every Ray actor is idle (FedAvg evaluates after aggregating),
so it gets the threads the actors leave: eval-threads (2 on this machine), PyTorch's and
OpenBLAS's alike, where Starling evaluates on its two workers, one thread each.
"""
import json
import time

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

import common  # bench/peers/common.py: flower_sim.py puts bench/peers/ on PYTHONPATH

PROG = "flower ServerApp"


def _array_bytes(arrays):
    """Serialized size of an ArrayRecord's tensors (Array.data: the bytes Flower ships)."""
    return sum(len(a.data) for a in arrays.values())


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context):
    cfg = context.run_config
    rounds, per_round, every = int(cfg["rounds"]), int(cfg["clients-per-round"]), int(cfg["eval-every"])
    num_clients = int(cfg["num-clients"])
    model, x_test, y_test = common.flower_server_start(cfg, PROG)
    initial = ArrayRecord(model.state_dict())
    log = {"rounds": [], "evals": [], "eval_seconds": []}

    def central_eval(server_round: int, arrays: ArrayRecord):
        # Called before round 1 (server_round 0) and after every round; a round ends after its
        # evaluation, as in starling-sim's metrics.
        if server_round == 0:
            log["t_start"] = time.time()
            return None
        record = None
        if common.evaluated(server_round, every):
            t = time.time()
            model.load_state_dict(arrays.to_torch_state_dict())
            acc, loss = common.accuracy(model, x_test, y_test)
            log["evals"].append({"round": server_round, "accuracy": acc, "loss": loss})
            log["eval_seconds"].append(time.time() - t)
            record = MetricRecord({"accuracy": acc, "loss": loss})
        log["rounds"].append({"round": server_round, "t_end": time.time()})
        return record

    strategy = FedAvg(fraction_train=per_round / num_clients, fraction_evaluate=0.0,
                      min_train_nodes=per_round, min_available_nodes=num_clients)
    t0 = time.time()
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds,
                            train_config=ConfigRecord({}), evaluate_fn=central_eval)
    t1 = time.time()
    tm = {int(r): dict(m) for r, m in result.train_metrics_clientapp.items()}
    rs, mb = log["rounds"], _array_bytes(initial)
    out = {
        "rounds": len(rs),
        "clients_trained": len(rs) * per_round,
        "loop_seconds": (rs[-1]["t_end"] - log["t_start"]) if rs else None,
        "strategy_seconds": t1 - t0,
        "client_threads": tm[max(tm)].get("threads") if tm else None,
        "eval_threads": torch.get_num_threads(),
        "eval_blas_threads": common.blas_threads(),
        "eval_seconds": log["eval_seconds"],
        "per_round": [{"round": r["round"],
                       "seconds": r["t_end"] - (rs[i - 1]["t_end"] if i else log["t_start"]),
                       "train_loss": tm.get(r["round"], {}).get("train_loss"),
                       # Array payloads: the model to each sampled client, a model back from each.
                       "downlink_bytes": mb * per_round,
                       "uplink_bytes": mb * per_round}
                      for i, r in enumerate(rs)],
        "evals": log["evals"],
        "versions_inside": {"torch": torch.__version__, "numpy": np.__version__},
    }
    path = str(cfg["result-file"])
    if path:
        common.write_result(path, out)
    else:
        print(json.dumps(out))
