"""Flower ClientApp: a NumPyClient whose fit returns the received parameters plus logic.DELTA."""
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context

from starling_deploy_app import logic


class DeltaClient(NumPyClient):
    def fit(self, parameters, config):
        return logic.fit(parameters), logic.NUM_EXAMPLES, {}

    def evaluate(self, parameters, config):  # never asked: the strategy's fraction_evaluate is 0
        return 0.0, 1, {}


def client_fn(context: Context):
    return DeltaClient().to_client()


app = ClientApp(client_fn=client_fn)
