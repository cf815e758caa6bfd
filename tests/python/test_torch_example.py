"""examples/python/torch_client.py (a PyTorch CNN in Python) as a member of a CURVE federation
with a C++ starling-client (ctest test_python_torch_example). Skipped without Debian's
python3-torch or the Fashion-MNIST package."""

import os
import subprocess
import sys
import unittest

from test_client import BIN, Federation, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "python", "torch_client.py")
DATA = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


@unittest.skipUnless(HAVE_TORCH, "needs Debian's python3-torch")
@unittest.skipUnless(os.path.exists(DATA), "needs the dataset-fashion-mnist package")
class TorchExampleTest(unittest.TestCase):
    def setUp(self):
        self.fed = Federation()

    def tearDown(self):
        self.fed.close()

    def test_a_pytorch_client_and_a_cpp_client_train_the_cnn_together(self):
        config = os.path.join(self.fed.dir, "federation.toml")
        with open(config, "w") as f:
            f.write('[model]\nspec = "cnn"\nseed = 3\n[data]\nnum_clients = 100\npartition = "iid"\n'
                    '[train]\nrounds = 2\nlr = 0.05\n[compression]\ncompressor = "topk:density=0.05"\n'
                    '[eval]\nevery = 1\n')
        port = free_port()
        keys = self.fed.keys
        root = self.fed.start("root", [
            "starling-server", "--config", config, "--server.bind", f"tcp://127.0.0.1:{port}",
            "--security.key", os.path.join(keys, "server.key_secret"),
            "--security.clients", self.fed.allow("allow", ["client-0", "client-1"]),
            "--sampling.fraction", "1.0", "--sampling.min_available", "2", "--net.heartbeat_ms", "200",
            "--state.metrics", os.path.join(self.fed.dir, "metrics.jsonl")])
        cpp = self.fed.start("cpp", [
            "starling-client", "--config", config, "--client.id", "0", "--client.server", f"tcp://127.0.0.1:{port}",
            "--security.key", os.path.join(keys, "client-0.key_secret"),
            "--security.server_key", os.path.join(keys, "server.key")])
        log = open(os.path.join(self.fed.dir, "py.log"), "w")
        py = subprocess.Popen([sys.executable, EXAMPLE, "--config", config, "--client-id", "1", "--server",
                               f"tcp://127.0.0.1:{port}", "--key", os.path.join(keys, "client-1.key_secret"),
                               "--server-key", os.path.join(keys, "server.key"),
                               "--state-file", os.path.join(self.fed.dir, "py.state")],
                              stdout=log, stderr=subprocess.STDOUT)
        self.fed.procs.append(("py", py, log))
        try:
            self.assertEqual(root.wait(timeout=240), 0, self.fed.log("root"))
            self.assertEqual(py.wait(timeout=60), 0, self.fed.log("py"))
            self.assertEqual(cpp.wait(timeout=60), 0, self.fed.log("cpp"))
        except subprocess.TimeoutExpired:
            self.fail("the federation did not finish:\n" + "\n".join(self.fed.log(n)[-2000:] for n in ("root", "py")))
        m = self.fed.metrics()
        self.assertEqual(len(m), 2)
        for r in m:
            self.assertTrue(r["applied"])
            self.assertEqual(r["clients_completed"], 2)  # the Python client's update counted
            self.assertGreater(r["test_accuracy"], 0.2)  # 10 classes: chance is 0.1
        out = self.fed.log("py")
        self.assertIn("600 training and 100 test examples", out)  # its iid shard of 60,000 / 100
        self.assertIn("done: 4 tasks, 2 updates", out)  # 2 fit + 2 evaluate tasks
        self.assertIn("2 evaluations", out)


if __name__ == "__main__":
    unittest.main()
