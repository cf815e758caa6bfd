"""Flower ServerApp: FedAvg over all N SuperNodes each round (fraction_fit=1.0, min_fit_clients =
min_available_clients = N), no evaluation, the model initialised at zero with Starling's softmax
shapes. The strategy writes a timing line when each round's fit begins (after the N nodes were
sampled) and when its aggregation ends, for bench/peers/deploy.py."""
import json
import time

from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg

from starling_deploy_app import logic


class TimedFedAvg(FedAvg):
    def __init__(self, timing_file, **kwargs):
        super().__init__(**kwargs)
        self._timing_file = timing_file

    def _mark(self, event, server_round, **extra):
        if not self._timing_file:
            return
        with open(self._timing_file, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, "round": server_round, "t": time.time(), **extra}) + "\n")

    def configure_fit(self, server_round, parameters, client_manager):
        instructions = super().configure_fit(server_round, parameters, client_manager)
        self._mark("fit_start", server_round, clients=len(instructions))
        return instructions

    def aggregate_fit(self, server_round, results, failures):
        out = super().aggregate_fit(server_round, results, failures)
        self._mark("fit_end", server_round, results=len(results), failures=len(failures))
        return out


def server_fn(context: Context):
    cfg = context.run_config
    n = int(cfg["num-clients"])
    shapes = logic.softmax_shapes(cfg["rows"], cfg["cols"], cfg["classes"])
    strategy = TimedFedAvg(
        str(cfg["timing-file"]),
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=n,
        min_evaluate_clients=0,
        min_available_clients=n,
        initial_parameters=ndarrays_to_parameters(logic.initial_model(shapes)),
    )
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=int(cfg["num-server-rounds"])))


app = ServerApp(server_fn=server_fn)
