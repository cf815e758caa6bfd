"""Starling for Python: join a Starling federation with a model trained in Python.

A client is an object with Flower's NumPyClient shape::

    class MyClient(starling.NumPyClient):
        def fit(self, parameters, config):
            ...  # train on this client's data, starting from `parameters`
            return new_parameters, num_examples, {"train_loss": loss}

        def evaluate(self, parameters, config):
            return loss, num_examples, {"accuracy": accuracy}

    starling.start_client(MyClient(), server="tcp://127.0.0.1:7700", client_id=3,
                          layout=starling.model_layout("cnn"), num_examples=600,
                          key="keys/client-3.key_secret", server_key="keys/server.key")

`parameters` is a list of float32 numpy arrays, one per tensor of the layout, in its order.
Everything between fit() and the server is Starling's C++ client runtime: the protocol, the
compressor the server names (top-k, QSGD, PowerSGD, ...) with this client's error-feedback state,
CURVE, heartbeats, re-registration, and the state file that makes a crash lose nothing.
docs/python.md is the guide.
"""

import os as _os

from . import _starling
from ._starling import ConfigError, InvalidArgument, IoError, UpstreamRefused, layout_fingerprint

__all__ = [
    "NumPyClient",
    "Client",
    "start_client",
    "model_layout",
    "shard",
    "layout_fingerprint",
    "load_idx",
    "fashion_mnist",
    "ConfigError",
    "InvalidArgument",
    "IoError",
    "UpstreamRefused",
]


class NumPyClient:
    """The base of a Python client: override fit() and, to take part in federated evaluation,
    evaluate().

    fit(parameters, config) -> (parameters, num_examples, metrics)
        parameters: list of float32 numpy arrays (the model the server sent, in the layout's
        order; with step-ahead error feedback, plus the client's residual). Return the trained
        parameters in the same shapes and dtype, all finite; num_examples (an int >= 1) is the
        weight FedAvg gives the update; metrics a dict of str -> number ("train_loss" is the
        one the server reports by default). Anything else raises before anything is sent.
        config: {"round", "epochs", "batch_size", "lr", "prox_mu", "seed"}: the server's local
        training settings (lr and prox_mu travel as float32 and come as the shortest decimal of
        that float: train.lr = 0.05 gives 0.05) (prox_mu > 0: the server asks for FedProx's proximal term toward the
        parameters given; 0 otherwise), and a seed for this round's shuffling.

    evaluate(parameters, config) -> (loss, num_examples, metrics)
        The loss (>= 0) and metrics["accuracy"] (required, in [0, 1]) of `parameters` on this
        client's held-out data. config: {"round"}.
    """

    def fit(self, parameters, config):
        raise NotImplementedError("a NumPyClient must implement fit(parameters, config)")

    def evaluate(self, parameters, config):
        raise NotImplementedError("this client has no evaluate(); give eval_examples=0")


def model_layout(spec="cnn", rows=28, cols=28, classes=10):
    """The (name, shape) pairs of one of Starling's built-in models (softmax, logreg, mlp, cnn,
    resnet), in the order the server sends them: what a Python model must match to join a
    federation that trains that model.spec. A PyTorch module gives its own with
    [(name, tuple(p.shape)) for name, p in module.state_dict().items()]."""
    return [(name, tuple(shape)) for name, shape in _starling.model_layout(spec, rows, cols, classes)]


def shard(labels, *, num_clients, client_id, partition="dirichlet:alpha=0.5", seed=1, num_classes=None):
    """The indices (ascending int64) of the training examples client `client_id` holds when
    `labels` (every training label, in file order) are split among `num_clients` clients by
    `partition` (data.partition) from `seed` (model.seed): the shard a C++ starling-client with
    those keys trains on, and the simulator's. num_classes: the largest label + 1 by default."""
    import numpy as np

    labels = np.asarray(labels)
    if labels.ndim != 1 or not (np.issubdtype(labels.dtype, np.integer) or labels.size == 0):
        raise TypeError(f"labels must be a 1-dimensional array of integers, not {labels.dtype} of shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() > 255):
        raise ValueError("labels must be integers in [0, 255]")
    labels = labels.astype(np.uint8)
    if num_classes is None:
        num_classes = int(labels.max()) + 1 if labels.size else 0
    return _starling.shard(labels, int(num_classes), int(num_clients), partition, int(seed), int(client_id))


def load_idx(images, labels, num_classes=0):
    """An IDX pair (gzip or plain) as the C++ clients and the simulator load it: (x, y,
    num_classes), x float32 of shape (n, rows, cols) with unsigned-byte pixels scaled by 1/255 (the
    values a C++ client trains on), y uint8 labels. num_classes: 0 for the largest label + 1, or
    the data set's known count (a label at or above it is an error). Raises IoError for a missing
    or malformed file, with its path."""
    return _starling.load_idx(str(images), str(labels), int(num_classes))


def fashion_mnist(split="train", directory="/usr/share/datasets/fashion-mnist"):
    """One split ("train" or "t10k") of Fashion-MNIST from the Debian package
    dataset-fashion-mnist: (x, y) as load_idx() gives them, x float32 (n, 28, 28) in [0, 1]."""
    if split not in ("train", "t10k"):
        raise ValueError(f"split must be 'train' or 't10k', not {split!r}")
    x, y, _ = load_idx(_os.path.join(directory, f"{split}-images-idx3-ubyte.gz"),
                       _os.path.join(directory, f"{split}-labels-idx1-ubyte.gz"), 10)
    return x, y


def _count(name, value, low, high=None):
    """An int in [low, high], or a ValueError that names the argument."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import numpy as np

            if isinstance(value, np.integer):
                value = int(value)
        except ImportError:
            pass
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"at least {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


class Client:
    """A Starling client around a NumPyClient; start_client() builds one and runs it.

    server: the server's (or an edge aggregator's) endpoint, tcp://host:port.
    client_id: this client's id (its key file's id under CURVE), an int >= 0.
    layout: the model's tensors as (name, shape) pairs (model_layout(), or a state_dict's).
    num_examples / eval_examples: the sizes of this client's training and held-out data, told to
        the server when registering (eval_examples=0: no federated evaluation).
    key / server_key: this client's NAME.key_secret file and the server's public key file
        (starling-keygen); insecure=True instead: plain TCP, tests and trusted networks only.
    state_file: where the client keeps its error-feedback state and its last update (written
        before every send), so that a restarted client resends instead of training again. Its
        folder must exist.
    log_level: trace, debug, info, warn, error, critical or off.
    register_retry_ms: send the registration again when no answer came in this long.
    server_silence_ms: register again when nothing came from the server this long
        (net.server_silence_ms of the C++ programs). The runtime reads the server and heartbeats
        while fit() runs, so a fit of any length is not mistaken for a silent server.
    secagg_threat / secagg_authority: secure aggregation's threat model, as the C++ client's
        secagg.threat and secagg.authority (docs/privacy.md). "malicious-server": the client takes
        part only in rounds whose keys are signed, signs its own with the certified signing key in
        its key file (starling-keygen --authority), and checks its neighbours' against the
        authority's public key file secagg_authority. The runtime runs the protocol; fit() sees
        none of it.
    secagg_min_noise: under distributed DP (privacy.dp = distributed at the root), the least
        noise this client adds, as the C++ client's secagg.min_noise: a round that asks for less
        is refused. 0: any.
    secagg_min_clients: the fewest clients a sum this client helps release may hold, as the C++
        client's secagg.min_clients (secagg_threat="malicious-server" only): a round of fewer
        clients, or a survivors list leaving fewer masked inputs, is refused. 0: any.

    Everything is checked here, before anything connects. run() raises UpstreamRefused (a
    ConnectionRefusedError) when the server will not take this client: its key is not on the
    server's allow-list or is listed under another id, one side runs CURVE and the other
    insecure=True, or its layout is not the server's model.
    """

    def __init__(self, client, *, server, client_id, layout, num_examples, eval_examples=0, key=None,
                 server_key=None, insecure=False, state_file=None, log_level="info",
                 register_retry_ms=1000, server_silence_ms=15000, secagg_threat="semi-honest",
                 secagg_authority=None, secagg_min_noise=0.0, secagg_min_clients=0):
        if not callable(getattr(client, "fit", None)):
            raise TypeError("client must have a fit(parameters, config) method (see starling.NumPyClient)")
        client_id = _count("client_id", client_id, 0, 2**64 - 1)
        num_examples = _count("num_examples", num_examples, 1)
        eval_examples = _count("eval_examples", eval_examples, 0)
        register_retry_ms = _count("register_retry_ms", register_retry_ms, 10, 2**32 - 1)
        server_silence_ms = _count("server_silence_ms", server_silence_ms, 100, 2**32 - 1)
        secagg_min_clients = _count("secagg_min_clients", secagg_min_clients, 0, 2**64 - 1)
        if not isinstance(server, str):
            raise TypeError(f"server must be a str such as 'tcp://127.0.0.1:7700', not {type(server).__name__}")
        if eval_examples and not callable(getattr(client, "evaluate", None)):
            raise TypeError("eval_examples > 0 needs an evaluate(parameters, config) method")
        layout = [(str(name), tuple(int(d) for d in shape)) for name, shape in layout]
        self._client = _starling.Client(client, server, int(client_id), layout, int(num_examples),
                                        int(eval_examples), bool(insecure), key or "", server_key or "",
                                        state_file or "", log_level, int(register_retry_ms),
                                        int(server_silence_ms), str(secagg_threat),
                                        secagg_authority or "", float(secagg_min_noise),
                                        int(secagg_min_clients))

    def run(self):
        """Serves the federation until the server ends it (returns True), stop() (False) or
        Ctrl-C (KeyboardInterrupt). fit() and evaluate() run on this thread. An exception of
        fit() or evaluate(), or a result that breaks their contract, stops the client and is
        raised here; nothing was sent for that task. A client may run() again after that."""
        return self._client.run()

    def stop(self):
        """From another thread: the running run() (or, if none runs, the next one) returns False
        at its next turn; a fit() in progress runs to its end first, and its update is not
        sent."""
        self._client.stop()

    @property
    def stats(self):
        """What the last run() did: tasks, updates_sent, evaluations_sent, resent, rejects,
        registrations, heartbeats, uplink_bytes, downlink_bytes, update_bytes, last_round."""
        return self._client.stats

    @property
    def fingerprint(self):
        """The layout's fingerprint (docs/protocol.md): the server refuses a client whose
        fingerprint is not its model's."""
        return self._client.fingerprint


def start_client(client, *, server, client_id, layout, num_examples, eval_examples=0, key=None,
                 server_key=None, insecure=False, state_file=None, log_level="info",
                 register_retry_ms=1000, server_silence_ms=15000, secagg_threat="semi-honest",
                 secagg_authority=None, secagg_min_noise=0.0, secagg_min_clients=0):
    """Builds a Client (its arguments, described there) and runs it: serves the federation until
    the server ends it (returns True), Ctrl-C (KeyboardInterrupt) or an error. Raises what fit()
    or evaluate() raised, UpstreamRefused when the server will not take this client, and
    ConfigError, IoError, ValueError or TypeError for a bad argument before anything connects.

    start_client(MyClient(), server="tcp://127.0.0.1:7700", client_id=3,
                 layout=starling.model_layout("cnn"), num_examples=600,
                 key="keys/client-3.key_secret", server_key="keys/server.key")"""
    return Client(client, server=server, client_id=client_id, layout=layout, num_examples=num_examples,
                  eval_examples=eval_examples, key=key, server_key=server_key, insecure=insecure,
                  state_file=state_file, log_level=log_level, register_retry_ms=register_retry_ms,
                  server_silence_ms=server_silence_ms, secagg_threat=secagg_threat,
                  secagg_authority=secagg_authority, secagg_min_noise=secagg_min_noise,
                  secagg_min_clients=secagg_min_clients).run()
