"""The ServerApp of bench/peers/flower_sim.py --secagg: the legacy FedAvg strategy (central
evaluate_fn on the 10,000 test images) run by DefaultWorkflow with SecAggPlusWorkflow as its fit
workflow, Flower's SecAgg+ (num-shares, reconstruction-threshold from the run config; Flower's own
clipping range 8 and quantisation range 2^22 in a 2^32 ring, the defaults). It writes what it
measured to the run config's result-file in bench/peers/flower_app's form (rounds, per-round
seconds, evaluations), which flower_sim.py completes. A round's time is from the end of the last
one (or the initial evaluation) to its evaluation's end, as in flower_app.
"""
import json
import time

import numpy as np
import torch
from flwr.app import Context
from flwr.common import ndarrays_to_parameters
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid, ServerApp

import common

PROG = "flower SecAgg+ ServerApp"

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context):
    cfg = context.run_config
    rounds, per_round, every = int(cfg["rounds"]), int(cfg["clients-per-round"]), int(cfg["eval-every"])
    num_clients = int(cfg["num-clients"])
    model, x_test, y_test = common.flower_server_start(cfg, PROG)
    keys = list(model.state_dict().keys())
    initial = [v.detach().numpy().copy() for v in model.state_dict().values()]
    log = {"rounds": [], "evals": [], "eval_seconds": []}

    def central_eval(server_round, ndarrays, _config):
        if server_round == 0:
            log["t_start"] = time.time()
            return None
        result = None
        if common.evaluated(server_round, every):
            t = time.time()
            model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in zip(keys, ndarrays)})
            acc, loss = common.accuracy(model, x_test, y_test)
            log["evals"].append({"round": server_round, "accuracy": acc, "loss": loss})
            log["eval_seconds"].append(time.time() - t)
            result = (loss, {"accuracy": acc})
        log["rounds"].append({"round": server_round, "t_end": time.time()})
        return result

    strategy = FedAvg(fraction_fit=per_round / num_clients, fraction_evaluate=0.0,
                      min_fit_clients=per_round, min_available_clients=num_clients,
                      initial_parameters=ndarrays_to_parameters(initial), evaluate_fn=central_eval,
                      on_fit_config_fn=lambda rnd: {"server-round": rnd})
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=rounds), strategy=strategy)
    workflow = DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(
        num_shares=int(cfg["num-shares"]), reconstruction_threshold=int(cfg["reconstruction-threshold"]),
        max_weight=float(cfg["max-weight"])))
    t0 = time.time()
    workflow(grid, legacy)
    t1 = time.time()
    rs = log["rounds"]
    model_bytes = sum(a.nbytes for a in initial)
    out = {
        "rounds": len(rs),
        "clients_trained": len(rs) * per_round,
        "loop_seconds": (rs[-1]["t_end"] - log["t_start"]) if rs else None,
        "strategy_seconds": t1 - t0,
        "eval_threads": torch.get_num_threads(),
        "eval_blas_threads": common.blas_threads(),
        "eval_seconds": log["eval_seconds"],
        "secagg_params": {"num_shares": int(cfg["num-shares"]),
                   "reconstruction_threshold": int(cfg["reconstruction-threshold"]),
                   "max_weight": float(cfg["max-weight"]),
                   "clipping_range": 8.0, "quantization_range": 2 ** 22, "modulus_range": 2 ** 32},
        "per_round": [{"round": r["round"],
                       "seconds": r["t_end"] - (rs[i - 1]["t_end"] if i else log["t_start"]),
                       # Not measured under SecAgg+ (its messages are records of several kinds):
                       # the dense model each way, for scale.
                       "downlink_bytes": model_bytes * per_round,
                       "uplink_bytes": model_bytes * per_round}
                      for i, r in enumerate(rs)],
        "evals": log["evals"],
        "versions_inside": {"torch": torch.__version__, "numpy": np.__version__},
    }
    path = str(cfg["result-file"])
    if path:
        common.write_result(path, out)
    else:
        print(json.dumps(out))
