"""The starling Python package against real servers (ctest test_python; docs/python.md).

Run by /usr/bin/python3 with PYTHONPATH=<build>/python and STARLING_BIN_DIR=<build>/bin. Every
server listens on 127.0.0.1, is started by this file and killed by its pid; every wait is bounded.
"""

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import numpy as np

import starling

BIN = os.environ.get("STARLING_BIN_DIR", "build/bin")
# softmax regression of 4 features and 3 classes: fc.weight (3, 4), fc.bias (3,).
SHAPE = ["--model.spec", "softmax", "--model.rows", "1", "--model.cols", "4", "--model.classes", "3"]
LAYOUT = starling.model_layout("softmax", 1, 4, 3)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Federation:
    """Keys from starling-keygen, then servers started on 127.0.0.1 and killed by pid."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="starling-py-")
        self.keys = os.path.join(self.dir, "keys")
        self.procs = []
        self.keygen("--server")
        self.keygen("--clients", "4", "--first-id", "0")
        self.keygen("--name", "agg-7", "--id", "7")

    def keygen(self, *args):
        subprocess.run([os.path.join(BIN, "starling-keygen"), "--out", self.keys, *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)

    def allow(self, folder, names):
        d = os.path.join(self.dir, folder)
        os.makedirs(d, exist_ok=True)
        for n in names:
            shutil.copy(os.path.join(self.keys, n + ".key"), d)
        return d

    def start(self, name, args):
        log = open(os.path.join(self.dir, name + ".log"), "w")
        p = subprocess.Popen([os.path.join(BIN, args[0]), *args[1:]], stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, p, log))
        return p

    def root(self, port, allowed, rounds, extra=()):
        return self.start("root", [
            "starling-server", "--server.bind", f"tcp://127.0.0.1:{port}",
            "--security.key", os.path.join(self.keys, "server.key_secret"),
            "--security.clients", self.allow("allow-root", allowed), *SHAPE,
            "--train.rounds", str(rounds), "--sampling.fraction", "1.0", "--eval.every", "0",
            "--compression.compressor", "none", "--net.heartbeat_ms", "200",
            "--state.metrics", os.path.join(self.dir, "metrics.jsonl"), *extra])

    def metrics(self):
        path = os.path.join(self.dir, "metrics.jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def log(self, name):
        with open(os.path.join(self.dir, name + ".log")) as f:
            return f.read()

    def client_kwargs(self, port, client_id, **kw):
        return dict(server=f"tcp://127.0.0.1:{port}", client_id=client_id, layout=LAYOUT,
                    key=os.path.join(self.keys, f"client-{client_id}.key_secret"),
                    server_key=os.path.join(self.keys, "server.key"), register_retry_ms=200,
                    log_level="warn", **kw)

    def close(self):
        for _, p, log in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
            log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_in_thread(client):
    """Runs client.run() on a thread; returns a dict that gets 'result' or 'error'."""
    out = {}

    def body():
        try:
            out["result"] = client.run()
        except BaseException as e:  # noqa: B902 - handed to the test
            out["error"] = e

    t = threading.Thread(target=body, daemon=True)
    t.start()
    out["thread"] = t
    return out


def join(runs, clients, timeout=120, logs=lambda: ""):
    deadline = time.monotonic() + timeout
    for r in runs:
        r["thread"].join(max(0.0, deadline - time.monotonic()))
    if any(r["thread"].is_alive() for r in runs):
        for c in clients:
            c.stop()
        for r in runs:
            r["thread"].join(30)
        raise AssertionError("the clients did not finish in %d s\n%s" % (timeout, logs()))


class Shifter(starling.NumPyClient):
    """Adds `shift` to every parameter, reports `num_examples` and a training loss; records the
    parameters and configs it was given."""

    def __init__(self, shift, num_examples, loss):
        self.shift, self.num_examples, self.loss = shift, num_examples, loss
        self.seen, self.configs = [], []

    def fit(self, parameters, config):
        self.seen.append([p.copy() for p in parameters])
        self.configs.append(dict(config))
        return [p + np.float32(self.shift) for p in parameters], self.num_examples, {"train_loss": self.loss}


class PythonClientTest(unittest.TestCase):
    def setUp(self):
        self.fed = Federation()

    def tearDown(self):
        self.fed.close()

    def test_updates_are_counted_with_their_weights(self):
        # Two Python clients: +1 with weight 100, +4 with weight 300. FedAvg's round 1 moves the
        # zero model to (100 * 1 + 300 * 4) / 400 = 3.25 everywhere, which both receive in round 2;
        # the mean training loss is (100 * 1 + 300 * 2) / 400 = 1.75.
        port = free_port()
        self.fed.root(port, ["client-0", "client-1"], rounds=2, extra=["--sampling.min_available", "2"])
        a, b = Shifter(1.0, 100, 1.0), Shifter(4.0, 300, 2.0)
        ca = starling.Client(a, num_examples=100, **self.fed.client_kwargs(port, 0))
        cb = starling.Client(b, num_examples=300, **self.fed.client_kwargs(port, 1))
        runs = [run_in_thread(ca), run_in_thread(cb)]
        join(runs, [ca, cb])
        for r in runs:
            self.assertNotIn("error", r, msg=self.fed.log("root"))
            self.assertTrue(r["result"], "the server ended the federation")
        for c in (a, b):
            self.assertEqual(len(c.seen), 2)
            for p in c.seen[0]:
                self.assertTrue(np.all(p == 0.0))  # softmax starts at zero
            for p, (name, shape) in zip(c.seen[1], LAYOUT):
                self.assertEqual(p.dtype, np.float32)
                self.assertEqual(p.shape, shape, name)
                self.assertTrue(np.all(p == np.float32(3.25)), f"{name}: {p}")
            self.assertEqual([cfg["round"] for cfg in c.configs], [1, 2])
            self.assertEqual(c.configs[0]["epochs"], 1)
            self.assertEqual(c.configs[0]["batch_size"], 32)
        for c in (ca, cb):
            self.assertEqual(c.stats["updates_sent"], 2)
            self.assertGreater(c.stats["update_bytes"], 0)
        m = self.fed.metrics()
        self.assertEqual(len(m), 2)
        self.assertTrue(all(r["applied"] for r in m))
        self.assertEqual([r["clients_completed"] for r in m], [2, 2])
        self.assertAlmostEqual(m[0]["train_loss"], 1.75, places=12)

    def test_python_clients_take_part_in_secure_aggregation(self):
        self.secure_aggregation(signed=False)

    def test_python_clients_sign_their_keys_under_the_malicious_server_threat_model(self):
        self.secure_aggregation(signed=True)

    def secure_aggregation(self, signed):
        # Three Python clients under SecAgg+ (the runtime runs the protocol, not the user's code):
        # +1, +4 and +7, weighing alike (the root sees only their sum), so round 1 moves the zero
        # model to 4 everywhere, within the ring's rounding; the losses travel in the clear.
        # Signed: each client's key file carries a signing key the federation's authority
        # certified, and every party checks every advert against the authority.
        port = free_port()
        threat = []
        kw = {}
        if signed:
            auth = os.path.join(self.fed.dir, "authority")
            subprocess.run([os.path.join(BIN, "starling-keygen"), "--out", auth, "--new-authority"],
                           check=True, stdout=subprocess.DEVNULL)
            self.fed.keygen("--clients", "3", "--first-id", "0", "--force", "--authority",
                            os.path.join(auth, "authority.key_secret"))
            authority = os.path.join(auth, "authority.key")
            threat = ["--secagg.threat", "malicious-server", "--secagg.authority", authority]
            kw = dict(secagg_threat="malicious-server", secagg_authority=authority)
            # Without the authority's key, a client that requires signed rounds does not start.
            with self.assertRaises(starling.ConfigError) as got:
                starling.Client(Shifter(1, 1, 1), num_examples=1,
                                **self.fed.client_kwargs(port, 0, secagg_threat="malicious-server"))
            self.assertIn("secagg.authority", str(got.exception))
            with self.assertRaises(ValueError):
                starling.Client(Shifter(1, 1, 1), num_examples=1,
                                **self.fed.client_kwargs(port, 0, secagg_threat="paranoid"))
        self.fed.root(port, ["client-0", "client-1", "client-2"], rounds=2,
                      extra=["--sampling.min_available", "3", "--secagg.enabled", "true",
                             "--secagg.clip", "100", *threat])
        users = [Shifter(1.0, 100, 1.0), Shifter(4.0, 300, 2.0), Shifter(7.0, 50, 3.0)]
        clients = [starling.Client(u, num_examples=u.num_examples, **self.fed.client_kwargs(port, i, **kw))
                   for i, u in enumerate(users)]
        runs = [run_in_thread(c) for c in clients]
        join(runs, clients, logs=lambda: self.fed.log("root"))
        for r in runs:
            self.assertNotIn("error", r, msg=self.fed.log("root"))
            self.assertTrue(r["result"], "the server ended the federation")
        for u in users:
            self.assertEqual(len(u.seen), 2)
            for p in u.seen[1]:
                self.assertTrue(np.all(np.abs(p - 4.0) < 1e-5), p)
        for c in clients:
            self.assertEqual(c.stats["updates_sent"], 2)  # its masked inputs
        m = self.fed.metrics()
        self.assertEqual(len(m), 2)
        self.assertTrue(all(r["applied"] for r in m))
        self.assertEqual([r["clients_completed"] for r in m], [3, 3])
        self.assertAlmostEqual(m[0]["train_loss"], 2.0, places=9)

    def test_a_python_clients_floor_on_distributed_dp_noise_is_checked_before_it_connects(self):
        # secagg_min_noise (the C++ client's secagg.min_noise): a number >= 0, checked when the
        # client is built; the protocol's refusal of a round asking for less is the runtime's
        # (test_server [ddg]).
        port = free_port()
        starling.Client(Shifter(1, 1, 1), num_examples=1,
                        **self.fed.client_kwargs(port, 0, secagg_min_noise=0.3))
        for bad in (-1.0, float("nan")):
            with self.assertRaises(starling.ConfigError) as got:
                starling.Client(Shifter(1, 1, 1), num_examples=1,
                                **self.fed.client_kwargs(port, 0, secagg_min_noise=bad))
            self.assertIn("secagg.min_noise", str(got.exception))
        # secagg_min_clients (secagg.min_clients): a count, and only under the malicious-server
        # threat model (only a signed round lists who survived before the unmask).
        with self.assertRaises(starling.ConfigError) as got:
            starling.Client(Shifter(1, 1, 1), num_examples=1,
                            **self.fed.client_kwargs(port, 0, secagg_min_clients=10))
        self.assertIn("secagg.min_clients needs secagg.threat = malicious-server", str(got.exception))
        with self.assertRaises(ValueError):
            starling.Client(Shifter(1, 1, 1), num_examples=1,
                            **self.fed.client_kwargs(port, 0, secagg_min_clients=-1))

    def test_the_servers_compressor_and_error_feedback_apply_to_a_python_client(self):
        # Top-k with error feedback, one client adding 1 to every parameter each round. Round 1
        # sends k of the 15 ones; round 2's delta is 1 everywhere plus the residual (1 where
        # nothing was sent), so it sends k twos. The model the client gets in round 3 therefore
        # has 2k non-zeros summing to 3k (without error feedback: k non-zeros summing to 2k).
        port = free_port()
        self.fed.root(port, ["client-0"], rounds=3,
                      extra=["--sampling.min_available", "1", "--compression.compressor", "topk:density=0.1"])
        a = Shifter(1.0, 10, 1.0)
        state = os.path.join(self.fed.dir, "client-0.state")
        c = starling.Client(a, num_examples=10, state_file=state, **self.fed.client_kwargs(port, 0))
        runs = [run_in_thread(c)]
        join(runs, [c])
        self.assertNotIn("error", runs[0], msg=self.fed.log("root"))
        flat = [np.concatenate([p.ravel() for p in seen]) for seen in a.seen]
        k = int(np.count_nonzero(flat[1]))
        self.assertTrue(0 < k < 15, flat[1])
        self.assertEqual(sorted(set(flat[1][flat[1] != 0])), [1.0])
        self.assertEqual(int(np.count_nonzero(flat[2])), 2 * k, flat[2])
        self.assertEqual(float(flat[2].sum()), 3.0 * k)
        self.assertEqual(sorted(set(flat[2][flat[2] != 0])), [1.0, 2.0])
        # The error-feedback state is on disk (state_file), as a C++ client keeps it.
        self.assertEqual(c.stats["updates_sent"], 3)
        self.assertTrue(os.path.getsize(state) > 0)

    def test_a_python_client_decodes_the_block_scaled_downlink(self):
        # downlink.mode = q2: the root sends 2-bit levels with a power-of-two step per block of 64
        # (docs/compression.md). One client adding 1 to every parameter each round, from the
        # root's zeros: round 2's task is version 1 plus the refresh of x1 - x0 = 1, round 3's
        # version 2 plus the refresh of x2 - x-hat. The expected models come from the format's
        # definition, computed here (blockq below), not from Starling's code.
        def blockq(v, bits=2, block=64):
            v = np.asarray(v, np.float64)
            out = np.zeros_like(v)
            top = 2 ** bits - 1
            for lo in range(0, len(v), block):
                blk = v[lo:lo + block]
                m = np.abs(blk).max()
                if m == 0:
                    continue
                e0 = -130
                while top * 2.0 ** (e0 - 1) < m:
                    e0 += 1
                best = None
                for e in (e0, e0 - 1, e0 - 2, e0 - 3):  # the least squared error, coarsest on ties
                    levels = np.array([(2 * c - top) * 2.0 ** (e - 1) for c in range(top + 1)])
                    # the nearest level, the upper one halfway between two
                    q = np.array([max(levels, key=lambda lv: (-abs(x - lv), lv)) for x in blk])
                    sse = float(((blk - q) ** 2).sum())
                    if best is None or sse < best[0]:
                        best = (sse, q)
                out[lo:lo + block] = best[1]
            return out.astype(np.float32)

        def three_rounds(a, *downlink):  # one client, a root with these downlink options
            port = free_port()
            self.fed.root(port, ["client-0"], rounds=3,
                          extra=["--sampling.min_available", "1", *downlink])
            c = starling.Client(a, num_examples=10, **self.fed.client_kwargs(port, 0))
            runs = [run_in_thread(c)]
            join(runs, [c])
            self.assertNotIn("error", runs[0], msg=self.fed.log("root"))
            self.assertEqual(len(a.seen), 3)

        # q2-mirror (the root keeps the client's copy and sends the difference from it) sends this
        # one client, one version behind every round, what q2 sends: the same models.
        for mode in ("q2", "q2-mirror"):
            with self.subTest(mode):
                a = Shifter(1.0, 10, 1.0)
                three_rounds(a, "--downlink.mode", mode)
                for p in a.seen[0]:
                    self.assertFalse(p.any())  # the root's first model: zeros, sent whole
                x1 = [np.ones(p.shape, np.float32) for p in a.seen[0]]
                for got, x in zip(a.seen[1], x1):
                    np.testing.assert_array_equal(got, blockq(x.ravel()).reshape(x.shape))
                    self.assertFalse(np.array_equal(got, x))  # lossy: 2 bits, not the exact 1.0
                for got, held, x in zip(a.seen[2], a.seen[1], x1):
                    x2 = x + ((held + np.float32(1)) - held)
                    want = held + blockq((x2 - held).ravel()).reshape(x.shape)
                    np.testing.assert_array_equal(got, want)

        # stc-mirror: the difference from the client's copy as +-mu (mu its mean magnitude) on
        # downlink.density of each tensor; at density 1 every nonzero difference moves. A client
        # that adds a ramp: its next model is the ramp's mean, not the ramp (as dense would send).
        class Ramp(Shifter):
            def fit(self, parameters, config):
                self.seen.append([p.copy() for p in parameters])
                return [p + ramp(p) for p in parameters], self.num_examples, {"train_loss": 1.0}

        def ramp(p):
            return ((np.arange(p.size, dtype=np.float32) + 1) / 8).reshape(p.shape)

        def ternary(d):  # +-mu where d is not zero
            mu = np.float32(np.abs(d[d != 0].astype(np.float64)).sum() / np.count_nonzero(d))
            return np.sign(d).astype(np.float32) * mu

        with self.subTest("stc-mirror"):
            a = Ramp(0.0, 10, 1.0)
            three_rounds(a, "--downlink.mode", "stc-mirror", "--downlink.density", "1")
            for p in a.seen[0]:
                self.assertFalse(p.any())  # zeros, sent whole in q3's blocks
            for got in a.seen[1]:  # the model is the ramp; its copy the ramp's mean
                np.testing.assert_array_equal(got, ternary(ramp(got)))
                self.assertFalse(np.array_equal(got, ramp(got)))
            for got, held in zip(a.seen[2], a.seen[1]):
                x2 = ramp(held) + ((held + ramp(held)) - held)
                np.testing.assert_array_equal(got, held + ternary(x2 - held))

    def test_a_bad_result_raises_before_anything_is_sent(self):
        zeros = [np.zeros(s, np.float32) for _, s in LAYOUT]
        cases = {
            "a wrong shape": ([zeros[0].T.copy(), zeros[1]], 10, {}, ValueError, "shape (4, 3); the layout says (3, 4)"),
            "a wrong dtype": ([zeros[0].astype(np.float64), zeros[1]], 10, {}, TypeError, "dtype float64"),
            "a missing tensor": ([zeros[0]], 10, {}, ValueError, "returned 1 arrays; the model has 2"),
            "a NaN": ([zeros[0], np.array([0, np.nan, 0], np.float32)], 10, {}, ValueError, "non-finite"),
            "an infinite metric": (zeros, 10, {"train_loss": math.inf}, ValueError, "non-finite metrics['train_loss']"),
            "a zero weight": (zeros, 0, {}, ValueError, "num_examples = 0"),
            "a float weight": (zeros, 2.5, {}, TypeError, "not an integer"),
            "a numpy bool weight": (zeros, np.True_, {}, TypeError, "not an integer"),
            "a metric over the server's bound": (zeros, 10, {"train_loss": 1e10}, ValueError, "above the bound"),
            "an array as a metric": (zeros, 10, {"train_loss": np.array([0.5])}, TypeError, "not a number"),
            "a masked array": ([np.ma.masked_array(zeros[0], mask=True), zeros[1]], 10, {}, TypeError,
                               "not a plain numpy array"),
            "a weight above the registered one": (zeros, 11, {}, ValueError, "more than the 10 this client registered"),
            "no tuple": (None, None, None, TypeError, "must return a tuple"),
        }
        port = free_port()
        self.fed.root(port, ["client-0"], rounds=1, extra=["--sampling.min_available", "1"])
        for what, (params, n, metrics, error, words) in cases.items():
            with self.subTest(what):

                class Bad(starling.NumPyClient):
                    def fit(self, parameters, config):
                        return None if params is None else (params, n, metrics)

                c = starling.Client(Bad(), num_examples=10, **self.fed.client_kwargs(port, 0))
                with self.assertRaises(error) as got:
                    c.run()
                self.assertIn(words, str(got.exception))
                self.assertEqual(c.stats["tasks"], 1)
                self.assertEqual(c.stats["updates_sent"], 0)
        self.assertEqual(self.fed.metrics(), [])  # no round was applied

    def test_a_bad_evaluation_raises_before_anything_is_sent(self):
        cases = {
            "no accuracy": ((0.5, 5, {}), "must report metrics['accuracy']"),
            "an accuracy above 1": ((0.5, 5, {"accuracy": 1.5}), "outside [0, 1]"),
            "a loss over the server's bound": ((1e10, 5, {"accuracy": 0.5}), "above the bound"),
        }
        for what, (answer, words) in cases.items():
            with self.subTest(what):
                # A root each: a root of one round ends once its evaluation gave up.
                port = free_port()
                self.fed.root(port, ["client-0"], rounds=1,
                              extra=["--sampling.min_available", "1", "--eval.every", "1"])

                class BadEval(Shifter):
                    def evaluate(self, parameters, config):
                        return answer

                c = starling.Client(BadEval(1.0, 10, 1.0), num_examples=10, eval_examples=5,
                                    **self.fed.client_kwargs(port, 0))
                with self.assertRaises(ValueError) as got:
                    c.run()
                self.assertIn(words, str(got.exception))
                self.assertEqual(c.stats["evaluations_sent"], 0)

    def test_a_client_runs_again_after_a_failed_run(self):
        # Round 1: the first run() raises from fit(); the same Client runs again, registers anew,
        # gets round 1's task again and completes the federation.
        port = free_port()
        self.fed.root(port, ["client-0"], rounds=1, extra=["--sampling.min_available", "1"])

        class FailsOnce(Shifter):
            def fit(self, parameters, config):
                if not self.seen:
                    self.seen.append(None)
                    raise RuntimeError("first fit fails")
                return super().fit(parameters, config)

        c = starling.Client(FailsOnce(1.0, 10, 1.0), num_examples=10, **self.fed.client_kwargs(port, 0))
        with self.assertRaises(RuntimeError):
            c.run()
        runs = [run_in_thread(c)]
        join(runs, [c], logs=lambda: self.fed.log("root"))
        self.assertNotIn("error", runs[0])
        self.assertTrue(runs[0]["result"])
        self.assertEqual(c.stats["updates_sent"], 1)
        self.assertEqual(len(self.fed.metrics()), 1)

    def test_stop_and_ctrl_c_during_fit_send_nothing(self):
        port = free_port()
        self.fed.root(port, ["client-0"], rounds=1, extra=["--sampling.min_available", "1"])

        class Slow(Shifter):
            """A fit() that runs until `release` is set (or 60 s): a long local epoch."""
            started = threading.Event()
            release = threading.Event()
            waited_out = False  # fit()'s wait came to its end (not interrupted)

            def fit(self, parameters, config):
                Slow.started.set()
                # Waits on the event a slice at a time: Python notices a signal that arrived just
                # before a blocking wait only when it next runs bytecode, as a training loop does.
                for _ in range(1200):
                    if Slow.release.wait(0.05):
                        break
                Slow.waited_out = True
                return super().fit(parameters, config)

        # stop() from another thread while fit() runs, then fit() ends: its update is not sent.
        c = starling.Client(Slow(1.0, 10, 1.0), num_examples=10, **self.fed.client_kwargs(port, 0))
        threading.Thread(target=lambda: (Slow.started.wait(30), c.stop(), Slow.release.set()), daemon=True).start()
        self.assertFalse(c.run())
        self.assertEqual(c.stats["updates_sent"], 0)
        self.assertEqual(c.stats["tasks"], 1)
        # Ctrl-C once fit() has begun: KeyboardInterrupt inside fit() (which runs on the thread that
        # called run()), though nothing would ever release it; nothing sent.
        Slow.started.clear()
        Slow.release.clear()
        Slow.waited_out = False
        c = starling.Client(Slow(1.0, 10, 1.0), num_examples=10, **self.fed.client_kwargs(port, 0))
        # (Sent to the main thread, as a terminal's Ctrl-C reaches it: the runtime's threads block
        # SIGINT, and this helper thread must not take it.)
        main = threading.main_thread().ident
        threading.Thread(target=lambda: (Slow.started.wait(30), signal.pthread_kill(main, signal.SIGINT)),
                         daemon=True).start()
        with self.assertRaises(KeyboardInterrupt):
            c.run()
        self.assertTrue(Slow.started.is_set())
        self.assertFalse(Slow.waited_out)  # the interrupt ended fit() inside its wait
        self.assertEqual(c.stats["updates_sent"], 0)
        self.assertEqual(self.fed.metrics(), [])

    def test_an_exception_in_fit_reaches_the_caller(self):
        port = free_port()
        self.fed.root(port, ["client-0"], rounds=1, extra=["--sampling.min_available", "1"])

        class Crashing(starling.NumPyClient):
            def fit(self, parameters, config):
                raise KeyError("no such batch")

        c = starling.Client(Crashing(), num_examples=10, **self.fed.client_kwargs(port, 0))
        with self.assertRaises(KeyError) as got:
            c.run()
        self.assertIn("no such batch", str(got.exception))
        self.assertEqual(c.stats["updates_sent"], 0)

    def test_a_fit_longer_than_the_silence_threshold_loses_no_round(self):
        # A fit of 17 s against the runtime's 15 s silence once re-registered, stopped the
        # heartbeats and lost the next round. Here fits of 1.5x and 10x a 300 ms silence.
        for sleep in (0.45, 3.0):
            with self.subTest(fit_seconds=sleep):
                port = free_port()
                if sleep != 0.45:
                    self.fed.close()
                    self.fed = Federation()
                self.fed.root(port, ["client-0"], rounds=3, extra=["--sampling.min_available", "1"])

                class Slow(Shifter):
                    def fit(self, parameters, config):
                        time.sleep(sleep)
                        return super().fit(parameters, config)

                c = starling.Client(Slow(1.0, 10, 1.0), num_examples=10,
                                    **self.fed.client_kwargs(port, 0, server_silence_ms=300))
                runs = [run_in_thread(c)]
                join(runs, [c], logs=lambda: self.fed.log("root"))
                self.assertNotIn("error", runs[0], msg=self.fed.log("root"))
                self.assertTrue(runs[0]["result"])
                m = self.fed.metrics()
                self.assertEqual([r["round"] for r in m], [1, 2, 3])
                self.assertTrue(all(r["applied"] and r["clients_completed"] == 1 for r in m), m)
                self.assertEqual(c.stats["updates_sent"], 3)
                self.assertEqual(c.stats["registrations"], 1)
                self.assertGreater(c.stats["heartbeats"], 0)

    def test_a_server_that_will_not_take_the_client_is_an_error_that_says_why(self):
        # Each of these once waited forever, in silence or warning every second.
        port = free_port()
        self.fed.root(port, ["client-0", "client-1"], rounds=1, extra=["--sampling.min_available", "2"])
        other = [("w", (2, 2)), ("b", (2,))]
        cases = {
            "no CURVE against a CURVE root": (dict(insecure=True, key=None, server_key=None), "security.insecure"),
            "a key not on the allow-list": (dict(client_id=2, key=os.path.join(self.fed.keys, "client-2.key_secret")),
                                            "allow-list"),
            "a key listed under another id": (dict(client_id=1, key=os.path.join(self.fed.keys, "client-0.key_secret")),
                                              "listed as client 0"),
            "another model": (dict(layout=other), "layout fingerprint"),
        }
        for what, (kw, words) in cases.items():
            with self.subTest(what):
                args = {**self.fed.client_kwargs(port, 0), **kw}
                c = starling.Client(Shifter(1, 1, 1), num_examples=1, **args)
                started = time.monotonic()
                runs = [run_in_thread(c)]
                join(runs, [c], timeout=60, logs=lambda: self.fed.log("root"))
                self.assertIn("error", runs[0], "run() returned instead of raising")
                self.assertIsInstance(runs[0]["error"], starling.UpstreamRefused)
                self.assertIsInstance(runs[0]["error"], ConnectionRefusedError)
                self.assertIn(words, str(runs[0]["error"]))
                self.assertLess(time.monotonic() - started, 30)
        # The fingerprints are printed as the server's banner prints its own: 16 hex digits.
        banner = self.fed.log("root")
        own = banner.split("fingerprint ")[1][:16]
        self.assertIn(own, str(runs[0]["error"]))
        self.assertEqual(self.fed.metrics(), [])

    def test_lr_arrives_as_the_user_wrote_it(self):
        # config["lr"] once came as 0.05000000074505806 (the float32 on the wire).
        port = free_port()
        self.fed.root(port, ["client-0"], rounds=1, extra=["--sampling.min_available", "1", "--train.lr", "0.05"])
        a = Shifter(1.0, 10, 1.0)
        c = starling.Client(a, num_examples=10, **self.fed.client_kwargs(port, 0))
        runs = [run_in_thread(c)]
        join(runs, [c])
        self.assertNotIn("error", runs[0], msg=self.fed.log("root"))
        self.assertEqual(a.configs[0]["lr"], 0.05)
        self.assertEqual(a.configs[0]["prox_mu"], 0.0)

    def test_the_idx_loader_gives_the_values_cpp_clients_train_on(self):
        import gzip
        import struct

        d = tempfile.mkdtemp(prefix="starling-idx-", dir=self.fed.dir)
        pixels = bytes(range(0, 256, 8)) * 2  # 64 bytes: 4 images of 4 x 4
        with gzip.open(os.path.join(d, "x.gz"), "wb") as f:
            f.write(struct.pack(">IIII", 0x00000803, 4, 4, 4) + pixels)
        with open(os.path.join(d, "y"), "wb") as f:
            f.write(struct.pack(">II", 0x00000801, 4) + bytes([0, 3, 1, 2]))
        x, y, classes = starling.load_idx(os.path.join(d, "x.gz"), os.path.join(d, "y"))
        self.assertEqual(x.shape, (4, 4, 4))
        self.assertEqual(x.dtype, np.float32)
        self.assertEqual(list(y), [0, 3, 1, 2])
        self.assertEqual(classes, 4)
        want = np.frombuffer(pixels, np.uint8).astype(np.float32).reshape(4, 4, 4) / np.float32(255)
        self.assertTrue(np.array_equal(x, want))
        with self.assertRaises(starling.IoError) as got:
            starling.load_idx(os.path.join(d, "nope.gz"), os.path.join(d, "y"))
        self.assertIn("nope.gz", str(got.exception))

    def test_bad_configuration_is_refused_before_connecting(self):
        kw = self.fed.client_kwargs(free_port(), 0)
        bad_state = os.path.join(self.fed.dir, "bad.state")
        with open(bad_state, "wb") as f:
            f.write(b"not a state file at all")
        with self.assertRaises(starling.IoError):
            starling.Client(Shifter(1, 1, 1), num_examples=1, **{**kw, "state_file": bad_state})
        # These once gave pybind11's "incompatible constructor arguments" (a negative id or count)
        # or surfaced only after the first fit (a missing state folder).
        for arg, value, words in (("client_id", -1, "client_id must be in [0"),
                                  ("eval_examples", -5, "eval_examples must be at least 0"),
                                  ("server_silence_ms", 10, "server_silence_ms must be in [100")):
            with self.assertRaises(ValueError) as got:
                starling.Client(Shifter(1, 1, 1), num_examples=1, **{**kw, arg: value})
            self.assertIn(words, str(got.exception))
        with self.assertRaises(TypeError):
            starling.Client(Shifter(1, 1, 1), num_examples=1, **{**kw, "client_id": "3"})
        missing = os.path.join(self.fed.dir, "no-such-folder", "client.state")
        with self.assertRaises(starling.ConfigError) as got:
            starling.Client(Shifter(1, 1, 1), num_examples=1, **{**kw, "state_file": missing})
        self.assertIn("does not exist", str(got.exception))
        for server in ("not-an-endpoint", "127.0.0.1:7813"):  # no tcp://
            with self.assertRaises(starling.ConfigError) as got:
                starling.Client(Shifter(1, 1, 1), num_examples=1, **{**kw, "server": server})
            self.assertIn("tcp://", str(got.exception))
        with self.assertRaises(ValueError):
            starling.Client(Shifter(1, 1, 1), num_examples=1, **{**kw, "log_level": "nonsense"})
        with self.assertRaises(ValueError):
            starling.Client(Shifter(1, 1, 1), num_examples=2**40, **kw)
        with self.assertRaises(starling.IoError):  # an OSError
            starling.Client(Shifter(1, 1, 1), num_examples=1, **{**kw, "key": os.path.join(self.fed.dir, "nope")})
        with self.assertRaises(starling.ConfigError):  # a ValueError
            starling.Client(Shifter(1, 1, 1), num_examples=1, **{**kw, "key": os.path.join(self.fed.keys, "server.key")})
        with self.assertRaises(ValueError):
            starling.Client(Shifter(1, 1, 1), num_examples=0, **kw)
        with self.assertRaises(ValueError):
            starling.Client(Shifter(1, 1, 1), num_examples=1, **{**kw, "key": None})
        with self.assertRaises(TypeError):
            starling.Client(object(), num_examples=1, **kw)
        with self.assertRaises(starling.InvalidArgument):
            starling.Client(Shifter(1, 1, 1), num_examples=1, **{**kw, "layout": [("w", (0, 3))]})
        # shard(): labels that are not integers (a float would be truncated into another class).
        with self.assertRaises(TypeError):
            starling.shard(np.array([0.5, 1.5, 2.0]), num_clients=1, client_id=0)
        with self.assertRaises(ValueError):
            starling.shard(np.array([0, 1, 300]), num_clients=1, client_id=0)

    def test_a_python_client_beside_a_cpp_client_behind_an_edge_aggregator(self):
        # Root <- aggregator 7 <- {C++ starling-client 1, Python client 0}: both updates reach the
        # root in one partial every round, and the Python client's weight (123) is in it.
        data = os.path.join(self.fed.dir, "data.csv")
        rng = np.random.default_rng(1)
        with open(data, "w") as f:
            f.write("label,a,b,c,d\n")
            for _ in range(200):
                y = int(rng.integers(3))
                x = rng.normal(size=4) + np.eye(3, 4)[y] * 2
                f.write(f"{y}," + ",".join(f"{v:.4f}" for v in x) + "\n")
        root_port, agg_port = free_port(), free_port()
        self.fed.root(root_port, ["agg-7"], rounds=3,
                      extra=["--sampling.min_available", "1", "--sampling.min_clients", "1",
                             "--security.aggregator_ids", "7"])
        self.fed.start("aggregator", [
            "starling-server", "--server.role", "aggregator", "--server.id", "7",
            "--server.bind", f"tcp://127.0.0.1:{agg_port}", "--server.upstream", f"tcp://127.0.0.1:{root_port}",
            "--security.key", os.path.join(self.fed.keys, "agg-7.key_secret"),
            "--security.server_key", os.path.join(self.fed.keys, "server.key"),
            "--security.clients", self.fed.allow("allow-agg", ["client-0", "client-1"]), *SHAPE,
            "--aggregator.min_clients", "2", "--net.heartbeat_ms", "200"])
        cpp = self.fed.start("cpp-client", [
            "starling-client", "--client.server", f"tcp://127.0.0.1:{agg_port}", "--client.id", "1",
            "--security.key", os.path.join(self.fed.keys, "client-1.key_secret"),
            "--security.server_key", os.path.join(self.fed.keys, "agg-7.key"),  # the aggregator's key
            "--model.spec", "softmax", "--data.format", "csv", "--data.dir", self.fed.dir, "--data.train", "data.csv", "--data.test", "data.csv",
            "--data.num_clients", "2", "--data.partition", "iid"])
        py = Shifter(0.01, 123, 1000.0)
        c = starling.Client(py, num_examples=123, **{**self.fed.client_kwargs(agg_port, 0),
                                                     "server_key": os.path.join(self.fed.keys, "agg-7.key")})
        runs = [run_in_thread(c)]
        join(runs, [c], logs=lambda: "\n".join(f"---- {n}\n" + self.fed.log(n)[-3000:]
                                                for n in ("root", "aggregator", "cpp-client")))
        self.assertNotIn("error", runs[0], msg=self.fed.log("aggregator"))
        self.assertTrue(runs[0]["result"])
        self.assertEqual(cpp.wait(timeout=60), 0, self.fed.log("cpp-client"))
        m = self.fed.metrics()
        self.assertEqual(len(m), 3, self.fed.log("root"))
        self.assertTrue(all(r["applied"] for r in m))
        self.assertEqual(c.stats["updates_sent"], 3)
        self.assertEqual(len(py.seen), 3)
        # The root's train_loss is the mean of the Python client's 1000 (weight 123) and the C++
        # client's loss L (its 100 examples; softmax on this data: 0 < L < 10), weighted:
        # (123 * 1000 + 100 L) / 223 lies in (551.5, 556.1); a weight of 100 would give ~500.
        for r in m:
            self.assertGreater(r["train_loss"], 123 * 1000 / 223)
            self.assertLess(r["train_loss"], (123 * 1000 + 100 * 10) / 223)


if __name__ == "__main__":
    unittest.main()
