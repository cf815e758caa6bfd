"""The split the peers of bench/peers/ train on is the split Starling trains on (ctest
test_python_peers_split): starling-sim writes it (data.split_file), bench/peers/common.py reads it
back, and every client's shard equals the one Starling's partitioner gives that client
(starling.shard, the C++ client's and the simulator's). Skipped without the Fashion-MNIST package."""

import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import starling
from test_client import BIN

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "peers"))
import common  # noqa: E402  (bench/peers/common.py: numpy only at import)

DATA = "/usr/share/datasets/fashion-mnist"


@unittest.skipUnless(os.path.exists(os.path.join(DATA, "train-labels-idx1-ubyte.gz")), "needs dataset-fashion-mnist")
class PeersSplitTest(unittest.TestCase):
    def test_the_peers_read_the_split_starling_trained_on(self):
        with tempfile.TemporaryDirectory(prefix="starling-split-") as d:
            split = os.path.join(d, "split.txt")
            stats = os.path.join(d, "stats.csv")
            # The demo's split (100 clients, Dirichlet(0.5), model.seed 1), one short round.
            r = subprocess.run([os.path.join(BIN, "starling-sim"), "--config",
                                os.path.join(HERE, "..", "..", "examples", "sim", "demo.toml"),
                                "--model.spec", "logreg", "--train.rounds", "1", "--sim.workers", "1",
                                "--eval.every", "0", "--data.split_file", split, "--data.stats_file", stats],
                               capture_output=True, text=True, timeout=240)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            _, y = common.load_fashion_mnist("train", DATA)
            shards = common.read_split(split, num_examples=len(y))
            self.assertEqual(len(shards), 100)
            seen = np.zeros(len(y), np.int64)
            for k, s in enumerate(shards):
                mine = starling.shard(y, num_clients=100, client_id=k, partition="dirichlet:alpha=0.5", seed=1)
                np.testing.assert_array_equal(s, mine, err_msg=f"client {k}")
                np.add.at(seen, s, 1)
            self.assertTrue(np.all(seen == 1))  # a disjoint cover of the training set
            # The run's own per-client statistics (what it trained on) agree: sizes per client.
            with open(stats) as f:
                rows = [line.split(",") for line in f.read().splitlines()[1:]]
            self.assertEqual([int(row[1]) for row in rows], [len(s) for s in shards])


if __name__ == "__main__":
    unittest.main()
