"""The client logic both systems run in bench/peers/deploy.py: no training, the received
parameters plus a fixed delta. Shared so that the servers are what differs."""
import numpy as np

DELTA = np.float32(1e-3)  # added to every value: an update of L2 norm 1e-3 * sqrt(1,000,010) ~ 1
NUM_EXAMPLES = 100  # FedAvg's weight of every update (equal weights)


def softmax_shapes(rows, cols, classes):
    """The shapes of Starling's `softmax` layout (starling.model_layout('softmax', rows, cols,
    classes)): fc.weight [classes, rows*cols], fc.bias [classes]."""
    return [(int(classes), int(rows) * int(cols)), (int(classes),)]


def initial_model(shapes):
    """Starling's softmax starts at zero; Flower's ServerApp is given the same."""
    return [np.zeros(s, dtype=np.float32) for s in shapes]


def fit(parameters):
    """The update every client returns: each array plus DELTA, float32."""
    return [np.asarray(p, dtype=np.float32) + DELTA for p in parameters]
