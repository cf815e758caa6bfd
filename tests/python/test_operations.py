"""Operating a live federation (docs/deployment.md, "Operating"): a root's /metrics read by
Prometheus's own Python parser, and scraped by a real Prometheus server (Debian's `prometheus`)
whose HTTP query API must return the federation's values as its rounds advance.

Run by /usr/bin/python3 (ctest test_python_operations) with PYTHONPATH=<build>/python and
STARLING_BIN_DIR=<build>/bin. Every process listens on 127.0.0.1, is started by this file and
killed by its pid; every wait is bounded. Without a `prometheus` binary the real-server test is
skipped (the parser test still runs); `make test` installs it (scripts/bootstrap.sh).
"""

import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.parse
import urllib.request

import numpy as np

from prometheus_client.parser import text_string_to_metric_families

import starling
from test_client import BIN, Federation, free_port, run_in_thread, join

ROUNDS = 12


class Gate:
    """The test lets the federation's fits through: each fit takes one permit (waiting for it at
    most 60 s), so rounds advance when, and as far as, the test says."""

    def __init__(self):
        self.permits = threading.Semaphore(0)
        self.lock = threading.Lock()
        self.waiting = 0  # fits waiting for a permit now
        self.taken = 0  # permits taken: fits let through

    def open(self, fits):
        self.permits.release(fits)

    def take(self):
        with self.lock:
            self.waiting += 1
        got = self.permits.acquire(timeout=60)
        with self.lock:
            self.waiting -= 1
            self.taken += got
        if not got:
            raise RuntimeError("no permit to fit within 60 s")


class GatedClient(starling.NumPyClient):
    def __init__(self, gate, shift):
        self.gate, self.shift = gate, shift

    def fit(self, parameters, config):
        self.gate.take()
        return [p + np.float32(self.shift) for p in parameters], 10, {"train_loss": 1.0}


def wait_for(predicate, timeout, step=0.1):
    """Polls `predicate` (a file, a log, an HTTP answer: what the processes expose) until it holds
    or `timeout` passes; its value, or None."""
    until = time.monotonic() + timeout
    idle = threading.Event()  # never set: a bounded pause between polls
    while time.monotonic() < until:
        value = predicate()
        if value:
            return value
        idle.wait(step)
    return None


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def write_csv(path, rows, seed):
    """A CSV of the softmax model's shape: `rows` examples of 4 features, 3 separable classes."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        f.write("label,a,b,c,d\n")
        for _ in range(rows):
            y = int(rng.integers(3))
            x = rng.normal(size=4) + np.eye(3, 4)[y] * 2
            f.write(f"{y}," + ",".join(f"{v:.4f}" for v in x) + "\n")


def status_url(fed, name, timeout=30):
    """The status server's URL, as process `name` logged it ("status: URL serves /metrics")."""
    return wait_for(lambda: (re.search(r"status: (http://127\.0\.0\.1:\d+) serves /metrics",
                                       fed.log(name)) or [None, None])[1], timeout)


class Operations(unittest.TestCase):
    def setUp(self):
        self.fed = Federation()
        self.gate = Gate()

    def tearDown(self):
        self.gate.open(1000)  # no client is left waiting for a permit
        self.fed.close()

    def start_root(self, extra=()):
        port = free_port()
        self.fed.root(port, ["client-0", "client-1"], ROUNDS,
                      ["--status.listen", "127.0.0.1:0", "--sampling.min_available", "2",
                       "--sampling.wait_ms", "30000", *extra])
        # The root logs the address it serves (port 0: a free one).
        url = status_url(self.fed, "root", 30)
        self.assertIsNotNone(url, self.fed.log("root"))
        return port, url

    def start_clients(self, port):
        clients = [starling.Client(GatedClient(self.gate, 0.01 * (i + 1)), num_examples=10,
                                   **self.fed.client_kwargs(port, i)) for i in range(2)]
        return clients, [run_in_thread(c) for c in clients]

    def test_metrics_parse_with_prometheus_client_and_follow_the_rounds(self):
        port, url = self.start_root()
        clients, runs = self.start_clients(port)
        seen_rounds = []

        def scrape():
            status, ctype, body = http_get(url + "/metrics")
            self.assertEqual(status, 200)
            self.assertTrue(ctype.startswith("text/plain; version=0.0.4"), ctype)
            families = {f.name: f for f in text_string_to_metric_families(body)}
            return families

        def registered(f):
            return [x.value for x in f["starling_clients"].samples
                    if x.labels.get("state") == "registered"]

        def progressed():
            # The fleet's counts are read every 250 ms: wait for both the round and the clients.
            f = scrape()
            seen_rounds.append(f["starling_round"].samples[0].value)
            return f if seen_rounds[-1] >= 3 and registered(f) == [2] else None

        # Rounds 1 and 2 may run (two fits each); round 3 starts and waits at the gate.
        self.gate.open(2 * 2)
        families = wait_for(progressed, 60, step=0.2)
        self.assertIsNotNone(families, self.fed.log("root"))
        self.assertEqual(seen_rounds[-1], 3)  # held at the gate: no further
        self.gate.open(2 * (ROUNDS - 2))
        join(runs, clients, timeout=120, logs=lambda: self.fed.log("root"))
        # The reference parser read every family, with the types Prometheus's conventions give.
        types = {n: f.type for n, f in families.items()}
        for name, kind in [("starling_round", "gauge"), ("starling_model_version", "gauge"),
                           ("starling_rounds", "counter"), ("starling_updates", "counter"),
                           ("starling_round_duration_seconds", "histogram"),
                           ("starling_clients", "gauge"), ("starling_transport_bytes", "counter"),
                           ("starling_connections", "counter"), ("starling_info", "gauge"),
                           ("process_cpu_seconds", "counter"),
                           ("process_resident_memory_bytes", "gauge")]:
            self.assertEqual(types.get(name), kind, name)

        def value(name, **labels):
            for s in families[name].samples:
                if s.name.startswith(name) and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
            return None

        self.assertEqual(value("starling_clients", state="registered"), 2)
        self.assertGreaterEqual(value("starling_updates", result="accepted"), 2)
        self.assertGreater(value("starling_transport_bytes", direction="in"), 0)
        self.assertEqual(value("starling_info", role="root"), 1)
        # The rounds only moved forward between scrapes.
        self.assertEqual(seen_rounds, sorted(seen_rounds))
        # What the metrics said agrees with the run's own record.
        records = self.fed.metrics()
        self.assertEqual(len(records), ROUNDS)
        applied = value("starling_rounds", applied="true")
        self.assertLessEqual(applied, ROUNDS)
        self.assertGreaterEqual(applied, 2)

    @unittest.skipUnless(shutil.which("prometheus"), "no prometheus binary (Debian's prometheus)")
    def test_a_real_prometheus_server_scrapes_the_root_as_rounds_advance(self):
        port, url = self.start_root()
        target = url[len("http://"):]
        prom_port = free_port()
        prom_dir = os.path.join(self.fed.dir, "prometheus")
        os.makedirs(prom_dir)
        config = os.path.join(prom_dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
                    "scrape_configs:\n  - job_name: starling\n    static_configs:\n"
                    f"      - targets: ['{target}']\n")
        self.fed.start("prometheus", [
            shutil.which("prometheus"), f"--config.file={config}",
            f"--storage.tsdb.path={os.path.join(prom_dir, 'data')}",
            f"--web.listen-address=127.0.0.1:{prom_port}"])
        api = f"http://127.0.0.1:{prom_port}/api/v1/query?query="

        def query(expr):
            try:
                _, _, body = http_get(api + urllib.parse.quote(expr), timeout=2)
            except OSError:
                return None
            answer = json.loads(body)
            if answer.get("status") != "success" or not answer["data"]["result"]:
                return None
            return float(answer["data"]["result"][0]["value"][1])

        # Prometheus is up and sees the root before any client comes.
        self.assertIsNotNone(wait_for(lambda: query('up{job="starling"}') == 1, 60),
                             self.fed.log("prometheus") + self.fed.log("root"))
        clients, runs = self.start_clients(port)
        # As rounds advance, the query API returns them: round 3 while the gate holds it, then a
        # later one once it opens.
        self.gate.open(2 * 2)
        first = wait_for(lambda: (v := query("starling_round")) is not None and v >= 3 and v, 60)
        self.assertEqual(first, 3, self.fed.log("root"))
        self.gate.open(2)
        later = wait_for(lambda: (v := query("starling_round")) is not None and v > first and v,
                         60)
        self.assertIsNotNone(later, self.fed.log("root"))
        applied = query('starling_rounds_total{applied="true"}')
        self.assertIsNotNone(applied)
        self.assertGreaterEqual(applied, 1)
        self.assertEqual(query('starling_clients{state="registered"}'), 2)
        self.assertGreater(query('starling_transport_bytes_total{direction="in"}'), 0)
        self.gate.open(2 * ROUNDS)
        join(runs, clients, timeout=120, logs=lambda: self.fed.log("root"))


def admin(socket_path, *command):
    p = subprocess.run([os.path.join(BIN, "starling-admin"), "--socket", socket_path, *command],
                       capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout + p.stderr


class LiveRoot(unittest.TestCase):
    """A root of 500 rounds (more than a test lets its clients run: they fit as the gate allows)
    with an admin socket, and gated Python clients."""

    def setUp(self):
        self.fed = Federation()
        self.gate = Gate()
        self.clients, self.runs = {}, {}

    def tearDown(self):
        self.gate.open(1000)  # no client is left waiting for a permit
        for c in self.clients.values():
            c.stop()
        for r in self.runs.values():
            r["thread"].join(30)
        self.fed.close()

    def records(self):
        return self.fed.metrics()

    def start_root(self, extra=()):
        """Starts the root; returns its port and admin socket."""
        sock = os.path.join(self.fed.dir, "admin.sock")
        port = free_port()
        self.fed.root(port, ["client-0", "client-1"], 500,
                      ["--admin.socket", sock, "--sampling.min_available", "2",
                       "--sampling.wait_ms", "60000", *extra])
        self.assertTrue(wait_for(lambda: os.path.exists(sock), 30), self.fed.log("root"))
        return port, sock

    def start_client(self, port, i):
        self.clients[i] = starling.Client(GatedClient(self.gate, 0.01), num_examples=10,
                                          **self.fed.client_kwargs(port, i))
        self.runs[i] = run_in_thread(self.clients[i])


class Administration(LiveRoot):
    """starling-admin against a live root: admit a key without a restart, revoke a client, pause,
    resume and drain, each logged with who asked."""

    def test_admit_revoke_pause_resume_and_drain_a_running_root(self):
        port, sock = self.start_root(["--status.listen", "127.0.0.1:0"])
        url = status_url(self.fed, "root", 30)
        self.assertIsNotNone(url)

        def metric(name, **labels):
            body = http_get(url + "/metrics")[2]
            for f in text_string_to_metric_families(body):
                for smp in f.samples:
                    if smp.name == name and all(smp.labels.get(k) == v for k, v in labels.items()):
                        return smp.value
            return None
        self.assertEqual(oct(os.stat(sock).st_mode & 0o777), "0o600")
        runs = self.runs
        self.start_client(port, 0)
        self.start_client(port, 1)
        self.gate.open(20)
        self.assertTrue(wait_for(lambda: len(self.records()) >= 2, 60), self.fed.log("root"))
        rc, out = admin(sock, "bogus")
        self.assertEqual(rc, 1, out)
        self.assertTrue(out.startswith("error:"), out)

        # Admit client 2: its key goes into the allow-list folder, and a reload admits it.
        shutil.copy(os.path.join(self.fed.keys, "client-2.key"),
                    os.path.join(self.fed.dir, "allow-root"))
        rc, out = admin(sock, "reload")
        self.assertEqual(rc, 0, out)
        self.assertIn("admitted 2", out)
        self.start_client(port, 2)
        self.gate.open(30)
        self.assertTrue(wait_for(lambda: any(r["clients_completed"] == 3
                                             for r in self.records()), 60),
                        self.fed.log("root"))

        # Client 0's key replaced under the running root: the old key's connection is closed
        # (what it queued dropped unread), its next handshake refused, and a client holding the
        # new key takes its place.
        other = os.path.join(self.fed.dir, "other")
        subprocess.run([os.path.join(BIN, "starling-keygen"), "--out", other, "--name", "rot",
                        "--id", "0"], check=True, capture_output=True, timeout=30)
        shutil.copy(os.path.join(other, "rot.key"),
                    os.path.join(self.fed.dir, "allow-root", "client-0.key"))
        rc, out = admin(sock, "reload")
        self.assertEqual(rc, 0, out)
        self.assertIn("admitted none; revoked none; keys replaced 0", out)
        # A fit the old client 0 began ends, and it finds its connection gone. The gate is shared
        # and takes no turns: clients 1 and 2 may take any number of permits first (under load
        # ten did, and client 0 waited out its 60 s), so permits go on, one at a time, until it
        # has stopped.
        until = time.monotonic() + 60
        while runs[0]["thread"].is_alive() and time.monotonic() < until:
            self.gate.open(1)
            runs[0]["thread"].join(0.5)
        self.assertFalse(runs[0]["thread"].is_alive(), "the old key's client did not stop")
        self.assertIsInstance(runs[0].get("error"), starling.UpstreamRefused, runs[0])
        self.assertIn("client 0's key was replaced: 1 connection of the old key closed",
                      self.fed.log("root"))
        n = len(self.records())
        self.clients[0] = starling.Client(
            GatedClient(self.gate, 0.01), num_examples=10,
            **{**self.fed.client_kwargs(port, 0), "key": os.path.join(other, "rot.key_secret")})
        runs[0] = run_in_thread(self.clients[0])
        self.gate.open(30)
        self.assertTrue(wait_for(lambda: any(r["clients_completed"] == 3
                                             for r in self.records()[n:]), 60),
                        self.fed.log("root"))  # 0 with its new key, 1 and 2

        # Revoke client 1: it is told to stop (and does), the rounds go on with 0 and 2.
        rc, out = admin(sock, "revoke", "1")
        self.assertEqual(rc, 0, out)
        self.assertIn("revoked client 1", out)
        self.gate.open(30)  # a fit it began ends, and it hears the news
        runs[1]["thread"].join(60)
        self.assertFalse(runs[1]["thread"].is_alive(), "the revoked client did not stop")
        self.assertIsInstance(runs[1].get("error"), starling.UpstreamRefused, runs[1])
        self.assertIn("revoked", str(runs[1]["error"]))
        n = len(self.records())
        self.gate.open(20)
        self.assertTrue(wait_for(lambda: len(self.records()) >= n + 2, 60))
        self.assertEqual(self.records()[-1]["clients_completed"], 2)
        rc, out = admin(sock, "revoke", "1")
        self.assertEqual(rc, 0, out)
        self.assertIn("already", out)
        rc, out = admin(sock, "status")
        self.assertEqual(rc, 0, out)
        status = json.loads(out)
        self.assertEqual(status["revoked"], [1])
        # The operator's metrics say it too (read every 250 ms).
        self.assertTrue(wait_for(lambda: metric("starling_clients", state="revoked") == 1, 10))
        self.assertGreaterEqual(metric("starling_refused_messages_total", code="revoked"), 1)
        self.assertEqual(status["registered"], 2)
        self.assertFalse(status["paused"])

        # Pause: the round running finishes, then the root parks before the next one and
        # starts none, whatever the clients could do; resume: they go on.
        rc, out = admin(sock, "pause")
        self.assertEqual(rc, 0, out)
        self.gate.open(20)  # the running round can finish; the clients could run many more
        parked = wait_for(lambda: (st := json.loads(admin(sock, "status")[1]))["parked"] and st,
                          60)
        self.assertTrue(parked, self.fed.log("root"))
        self.assertTrue(parked["paused"])
        paused_at = len(self.records())
        self.assertEqual(paused_at, parked["round"] - 1)  # every round before it recorded
        self.assertTrue(json.loads(admin(sock, "status")[1])["parked"])
        self.assertEqual(len(self.records()), paused_at)  # none started meanwhile
        rc, out = admin(sock, "resume")
        self.assertEqual(rc, 0, out)
        self.assertTrue(wait_for(lambda: len(self.records()) >= paused_at + 3, 60))

        # Drain: the round in progress finishes (its fits let through once the root took the
        # command), and the root stops before the last of its 500.
        rc, out = admin(sock, "drain")
        self.assertEqual(rc, 0, out)
        self.gate.open(20)
        root = [p for name, p, _ in self.fed.procs if name == "root"][0]
        self.assertEqual(root.wait(timeout=60), 0, self.fed.log("root"))
        self.assertLess(len(self.records()), 500)
        self.assertFalse(os.path.exists(sock))  # removed when the root ended
        rc, out = admin(sock, "status")
        self.assertEqual(rc, 2, out)  # nobody there

        log = self.fed.log("root")
        uid = str(os.getuid())
        for line in ("allow-list reloaded", "client 1 revoked by uid " + uid, "paused by uid",
                     "resumed by uid", "drain asked by uid", "drained: stopping before round",
                     "refused 'bogus' from uid", "client 1 was revoked by an operator"):
            self.assertIn(line, log)


class AsyncDrain(LiveRoot):
    """starling-admin drain in asynchronous rounds (FedBuff): no task is handed out from then on,
    the open ones finish and are taken into the buffer, then the root stops."""

    def test_drain_lets_the_open_tasks_finish_then_stops(self):
        ck = os.path.join(self.fed.dir, "ck.bin")
        port, sock = self.start_root(["--round.mode", "async", "--async.buffer_size", "2",
                                      "--async.concurrency", "2", "--state.checkpoint", ck])
        self.start_client(port, 0)
        self.start_client(port, 1)
        self.gate.open(4)  # two steps of two updates
        self.assertTrue(wait_for(lambda: len(self.records()) >= 2, 60), self.fed.log("root"))
        # Both clients hold their third task, waiting at the gate.
        self.assertTrue(wait_for(lambda: self.gate.waiting == 2, 30), self.fed.log("root"))
        self.assertEqual(self.gate.taken, 4)
        rc, out = admin(sock, "drain")
        self.assertEqual(rc, 0, out)
        self.assertIn("draining", out)
        root = [p for name, p, _ in self.fed.procs if name == "root"][0]
        self.assertIsNone(root.poll(), "the root stopped with tasks open")
        self.gate.open(20)  # more than they need: only the two open tasks may take one
        self.assertEqual(root.wait(timeout=60), 0, self.fed.log("root"))
        log = self.fed.log("root")
        self.assertIn("drained: every open task finished", log)
        self.assertIn("kept in the checkpoint's journal", log)
        records = self.records()
        self.assertEqual(len(records), 3, log)  # the third step: the two open tasks' updates
        self.assertTrue(all(r["applied"] for r in records))
        self.assertEqual(self.gate.taken, 6)  # no task after the drain


class AsyncPause(LiveRoot):
    """starling-admin pause and resume in asynchronous rounds (FedBuff): while paused no task is
    handed out, the open ones finish into the buffer; resume hands out again."""

    def test_pause_holds_the_hand_outs_and_resume_gives_them_again(self):
        port, sock = self.start_root(["--round.mode", "async", "--async.buffer_size", "2",
                                      "--async.concurrency", "2"])
        self.start_client(port, 0)
        self.start_client(port, 1)
        self.gate.open(4)  # two steps of two updates
        self.assertTrue(wait_for(lambda: len(self.records()) >= 2, 60), self.fed.log("root"))
        self.assertTrue(wait_for(lambda: self.gate.waiting == 2, 30))  # third tasks, held
        rc, out = admin(sock, "pause")
        self.assertEqual(rc, 0, out)
        self.assertFalse(json.loads(admin(sock, "status")[1])["parked"])  # two tasks open
        self.gate.open(2)  # the open tasks finish: the third step
        self.assertTrue(wait_for(lambda: len(self.records()) >= 3, 60), self.fed.log("root"))
        parked = wait_for(lambda: json.loads(admin(sock, "status")[1])["parked"], 30)
        self.assertTrue(parked, self.fed.log("root"))
        # Parked: no task open and none handed out (the clients are idle, not at the gate).
        self.assertEqual((self.gate.waiting, self.gate.taken, len(self.records())), (0, 6, 3))
        self.assertEqual(admin(sock, "resume")[0], 0)
        self.assertTrue(wait_for(lambda: self.gate.waiting == 2, 30), self.fed.log("root"))
        self.gate.open(2)
        self.assertTrue(wait_for(lambda: len(self.records()) >= 4, 60), self.fed.log("root"))
        self.assertTrue(all(r["applied"] for r in self.records()))
        log = self.fed.log("root")
        self.assertIn("admin: paused by uid", log)
        self.assertIn("admin: resumed by uid", log)


class EvaluatedClient(GatedClient):
    """A gated client whose held-out accuracy climbs with the round (0.1 a round, up to 0.9)."""

    def evaluate(self, parameters, config):
        r = int(config["round"])
        return 1.0 / r, 5, {"accuracy": min(0.9, 0.1 * r)}


CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")
ARTIFACTS = os.environ.get("STARLING_TEST_ARTIFACTS",
                           os.path.join(os.path.dirname(BIN.rstrip("/")), "test-artifacts"))


def chromium(url, *args):
    """Headless Chromium on `url` (its scripts run until the network and timers settle, at most
    5 s of virtual time); its stdout."""
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--user-data-dir=" + tempfile.mkdtemp(prefix="starling-chromium-"),
         "--virtual-time-budget=5000", *args, url],
        capture_output=True, text=True, timeout=120).stdout


class DomReader(html.parser.HTMLParser):
    """The dumped DOM's elements: by id, their text; every element's attributes."""

    def __init__(self):
        super().__init__()
        self.text, self.elements, self.open = {}, [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a))
        if tag not in ("br", "img", "meta", "link", "input", "path", "line", "rect"):
            self.open.append(a.get("id"))
            if a.get("id"):
                self.text[a["id"]] = ""

    def handle_endtag(self, tag):
        if self.open and tag not in ("br", "img", "meta", "link", "input", "path", "line", "rect"):
            self.open.pop()

    def handle_data(self, data):
        for i in self.open:
            if i:
                self.text[i] += data


@unittest.skipUnless(CHROMIUM, "no headless Chromium (Debian's chromium-headless-shell)")
class StatusPage(LiveRoot):
    """The root's status page in a real browser: Debian's headless Chromium loads it from a live
    federation (root <- client 0 and edge aggregator 7 <- clients 1 and 2), the DOM shows the
    round, the tree of clients and the accuracy curve the root recorded, and a screenshot is kept
    (test-artifacts/status-page.png in the build folder)."""

    def start_client(self, port, i, server_key=None):
        kw = self.fed.client_kwargs(port, i)
        if server_key:
            kw["server_key"] = server_key
        self.clients[i] = starling.Client(EvaluatedClient(self.gate, 0.01), num_examples=10,
                                          eval_examples=5, **kw)
        self.runs[i] = run_in_thread(self.clients[i])

    def test_chromium_shows_the_round_the_tree_and_the_curve(self):
        port, agg_port = free_port(), free_port()
        agg_sock = os.path.join(self.fed.dir, "agg-admin.sock")
        self.fed.root(port, ["client-0", "agg-7"], 500,
                      ["--status.listen", "127.0.0.1:0", "--eval.every", "1",
                       "--security.aggregator_ids", "7", "--sampling.min_available", "2",
                       "--sampling.wait_ms", "60000"])
        self.fed.start("aggregator", [
            "starling-server", "--server.role", "aggregator", "--server.id", "7",
            "--server.bind", f"tcp://127.0.0.1:{agg_port}",
            "--server.upstream", f"tcp://127.0.0.1:{port}",
            "--security.key", os.path.join(self.fed.keys, "agg-7.key_secret"),
            "--security.server_key", os.path.join(self.fed.keys, "server.key"),
            "--security.clients", self.fed.allow("allow-agg", ["client-1", "client-2"]),
            "--model.spec", "softmax", "--model.rows", "1", "--model.cols", "4",
            "--model.classes", "3", "--aggregator.min_clients", "2", "--net.heartbeat_ms", "200",
            "--status.listen", "127.0.0.1:0", "--admin.socket", agg_sock])
        url, agg_url = status_url(self.fed, "root"), status_url(self.fed, "aggregator")
        self.assertIsNotNone(url, self.fed.log("root"))
        self.assertIsNotNone(agg_url, self.fed.log("aggregator"))
        self.start_client(port, 0)
        agg_key = os.path.join(self.fed.keys, "agg-7.key")
        self.start_client(agg_port, 1, agg_key)
        self.start_client(agg_port, 2, agg_key)
        self.gate.open(12)  # four rounds of three fits; the fifth waits while the browser looks
        self.assertTrue(wait_for(lambda: len(self.records()) >= 4, 60), self.fed.log("root"))
        records = self.records()[:4]

        # The JSON endpoint: what the root's run records say, its two peers, and the aggregator's
        # two clients as the aggregator told (a subtree heartbeat at most every 2 s).
        def status():
            return json.loads(http_get(url + "/status.json")[2])

        def settled(j):
            agg = [p for p in j["peers"] if p["id"] == "7"]
            return (j["round"]["number"] == 5 and j["round"]["step"] == "fit" and agg and
                    [c["updates"] for c in agg[0]["subtree"]] == [4, 4])
        s = wait_for(lambda: (lambda j: j if settled(j) else None)(status()), 30)
        self.assertIsNotNone(s, status())
        self.assertEqual(s["role"], "root")
        self.assertEqual(s["round"]["planned"], 500)
        self.assertEqual((s["round"]["sent"], s["round"]["accepted"]), (2, 0))
        self.assertEqual([r["round"] for r in s["rounds"]], [1, 2, 3, 4])
        for mine, rec in zip(s["rounds"], records):
            self.assertAlmostEqual(mine["accuracy"], rec["test_accuracy"], places=6)
            self.assertEqual(mine["up"], rec["uplink_bytes"])
        self.assertEqual(s["rounds"][-1]["total_bytes"],
                         sum(r["uplink_bytes"] + r["downlink_bytes"] for r in records))
        peers = {p["id"]: p for p in s["peers"]}
        self.assertEqual(set(peers), {"0", "7"})
        self.assertEqual((peers["0"]["role"], peers["0"]["online"], peers["0"]["updates"]),
                         ("client", True, 4))
        self.assertEqual((peers["7"]["role"], peers["7"]["updates"]), ("aggregator", 4))
        self.assertEqual([(c["id"], c["online"], c["in_round"]) for c in peers["7"]["subtree"]],
                         [("1", True, True), ("2", True, True)])
        self.assertEqual(s["clients"]["online"], 2)
        # The same in the root's metrics: the phase running, its aggregator's clients, and the
        # wall time of every phase so far (four fits and four evaluations).
        samples = {}
        for fam in text_string_to_metric_families(http_get(url + "/metrics")[2]):
            for smp in fam.samples:
                samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
        self.assertEqual(samples[("starling_phase_tasks", (("state", "sent"),))], 2)
        self.assertEqual(samples[("starling_phase_tasks", (("state", "accepted"),))], 0)
        self.assertEqual(samples[("starling_subtree_clients",
                                  (("aggregator", "7"), ("state", "online")))], 2)
        self.assertEqual(samples[("starling_phase_duration_seconds_count", (("step", "fit"),))], 4)
        self.assertEqual(
            samples[("starling_phase_duration_seconds_count", (("step", "evaluate"),))], 4)
        # The aggregator's own page: its subtree, no curves (the root's page has them).
        a = wait_for(lambda: (lambda j: j if j["round"]["number"] == 5 else None)(
            json.loads(http_get(agg_url + "/status.json")[2])), 30)
        self.assertIsNotNone(a, "the aggregator's page does not show the round it relays")
        self.assertEqual(a["role"], "aggregator")
        self.assertEqual((a["round"]["step"], a["round"]["sent"]), ("fit", 2))
        self.assertEqual([(p["id"], p["updates"]) for p in a["peers"]], [("1", 4), ("2", 4)])

        # The page itself: served with a policy that lets nothing but its own files run.
        status_code, ctype, _ = http_get(url + "/")
        self.assertEqual((status_code, ctype), (200, "text/html; charset=utf-8"))
        with urllib.request.urlopen(url + "/") as r:
            csp = r.headers.get("Content-Security-Policy", "")
        self.assertIn("default-src 'none'", csp)
        self.assertIn("script-src 'self'", csp)

        # In Chromium: the DOM after the page's script drew /status.json.
        dom = chromium(url + "/", "--dump-dom")
        reader = DomReader()
        reader.feed(dom)
        body_attrs = [a for tag, a in reader.elements if tag == "body"][0]
        self.assertEqual(body_attrs.get("data-loaded"), "yes", dom[:2000])
        self.assertEqual(reader.text["round"].strip(), "5 / 500")
        self.assertIn("training: 0 of 2 answered", reader.text["progress"])
        self.assertEqual(reader.text["clients-online"].strip(), "2")
        self.assertIn("behind aggregators 2 of 2 online", reader.text["clients-detail"])
        self.assertEqual(reader.text["accuracy"].strip(), "40.0%")  # round 4's, as recorded
        rows = [(a["data-id"], a.get("data-via")) for tag, a in reader.elements
                if tag == "tr" and "data-id" in a]
        self.assertEqual(rows, [("0", None), ("7", None), ("1", "7"), ("2", "7")])
        tree = [a["data-id"] for tag, a in reader.elements
                if tag in ("li", "span") and "data-id" in a]
        self.assertEqual(tree, ["7", "1", "2", "0"])  # aggregator 7 and its clients, then client 0
        curves = [(a.get("class"), int(a["data-points"])) for tag, a in reader.elements
                  if tag == "path" and "data-points" in a]
        # Accuracy and loss, by round and by bytes: one point a round.
        self.assertEqual(sorted(curves), [("accuracy", 4)] * 2 + [("loss", 4)] * 2)

        os.makedirs(ARTIFACTS, exist_ok=True)
        shot = os.path.join(ARTIFACTS, "status-page.png")
        if os.path.exists(shot):
            os.remove(shot)
        chromium(url + "/", "--screenshot=" + shot, "--window-size=1280,900",
                 "--hide-scrollbars")
        with open(shot, "rb") as f:
            png = f.read()
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        self.assertEqual(struct.unpack(">II", png[16:24]), (1280, 900))

        # The edge aggregator takes starling-admin's status, reload and revoke for its own
        # clients; drain and pause are the root's.
        rc, out = admin(agg_sock, "status")
        self.assertEqual(rc, 0, out)
        st = json.loads(out)
        self.assertEqual((st["role"], st["round"], st["registered"]), ("aggregator", 5, 2))
        self.assertEqual(admin(agg_sock, "drain")[0], 1)
        self.assertEqual(admin(agg_sock, "pause")[0], 1)
        shutil.copy(os.path.join(self.fed.keys, "client-3.key"),
                    os.path.join(self.fed.dir, "allow-agg"))
        self.assertEqual(admin(agg_sock, "reload")[0], 0)
        self.start_client(agg_port, 3, agg_key)  # admitted behind the aggregator, no restart
        self.assertTrue(wait_for(lambda: "3" in {p["id"] for p in json.loads(
            http_get(agg_url + "/status.json")[2])["peers"] if p["registered"]}, 30),
            self.fed.log("aggregator"))
        self.assertEqual(admin(agg_sock, "revoke", "2")[0], 0)
        self.gate.open(3)  # round 5's three fits end; client 2's answer is refused, it stops
        self.runs[2]["thread"].join(60)
        self.assertIsInstance(self.runs[2].get("error"), starling.UpstreamRefused)
        self.assertTrue(wait_for(lambda: [p for p in json.loads(http_get(
            agg_url + "/status.json")[2])["peers"] if p["id"] == "2" and p["revoked"]], 30))
        self.assertIn("client 2 revoked by uid", self.fed.log("aggregator"))


class ClientMetrics(unittest.TestCase):
    """starling-client --status.listen: its runtime's statistics as Prometheus metrics, which agree
    with what the root recorded of it."""

    def setUp(self):
        self.fed = Federation()

    def tearDown(self):
        self.fed.close()

    def test_a_clients_metrics_follow_its_rounds(self):
        write_csv(os.path.join(self.fed.dir, "data.csv"), 200, 2)
        port = free_port()
        sock = os.path.join(self.fed.dir, "admin.sock")
        self.fed.root(port, ["client-1"], 100000,
                      ["--sampling.min_available", "1", "--admin.socket", sock])
        self.assertTrue(wait_for(lambda: os.path.exists(sock), 30), self.fed.log("root"))
        client = self.fed.start("client", [
            "starling-client", "--client.server", f"tcp://127.0.0.1:{port}", "--client.id", "1",
            "--security.key", os.path.join(self.fed.keys, "client-1.key_secret"),
            "--security.server_key", os.path.join(self.fed.keys, "server.key"),
            "--model.spec", "softmax", "--data.format", "csv", "--data.dir", self.fed.dir,
            "--data.train", "data.csv", "--data.test", "data.csv", "--data.num_clients", "2",
            "--data.partition", "iid", "--status.listen", "127.0.0.1:0"])
        url = status_url(self.fed, "client", 30)
        self.assertIsNotNone(url, self.fed.log("client"))

        def scrape():
            out = {}
            for f in text_string_to_metric_families(http_get(url + "/metrics")[2]):
                for smp in f.samples:
                    out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
            return out
        # A few rounds, then the root pauses between two: what the client says it did can be
        # compared with what the root recorded.
        self.assertTrue(wait_for(lambda: len(self.fed.metrics()) >= 3, 60), self.fed.log("root"))
        self.assertEqual(admin(sock, "pause")[0], 0)
        self.assertTrue(wait_for(lambda: json.loads(admin(sock, "status")[1])["parked"], 30))
        records = self.fed.metrics()
        n = len(records)
        m = wait_for(lambda: (lambda x: x if x.get(("starling_client_updates_total", ())) == n
                              else None)(scrape()), 30)
        self.assertIsNotNone(m, (n, scrape()))
        self.assertEqual(m[("starling_client_round", ())], n)
        self.assertEqual(m[("starling_client_info", (("fingerprint", "9b95addb47c49e07"),
                                                      ("id", "1"), ("model", "softmax")))], 1)
        self.assertGreaterEqual(m[("starling_client_tasks_total", ())], 3)
        self.assertEqual(m[("starling_client_registrations_total", ())], 1)
        # Its updates' bytes are the root's uplink: it was the only client of each round.
        self.assertEqual(m[("starling_client_update_bytes_total", ())],
                         sum(r["uplink_bytes"] for r in records))
        self.assertGreater(m[("starling_client_bytes_total", (("direction", "down"),))],
                           sum(r["downlink_bytes"] for r in records) - 1)
        client.kill()
        client.wait(timeout=30)


class SimStatusPage(unittest.TestCase):
    """starling-sim serves the same page and metrics while it runs: its rounds, the ETA, the
    curves, and its pool of simulated clients (LibTorch-linked: ops/thread_stack_floor.cc lets the
    status server's threads start there)."""

    def setUp(self):
        self.fed = Federation()

    def tearDown(self):
        self.fed.close()

    def test_the_simulator_serves_rounds_eta_and_curves(self):
        write_csv(os.path.join(self.fed.dir, "data.csv"), 400, 1)
        # More rounds than the test waits for: it stops the simulator (by pid) when it has seen.
        sim = self.fed.start("sim", [
            "starling-sim", "--model.spec", "softmax", "--data.format", "csv",
            "--data.dir", self.fed.dir, "--data.train", "data.csv", "--data.test", "data.csv",
            "--data.num_clients", "20", "--sampling.clients_per_round", "5",
            "--train.rounds", "100000", "--eval.every", "5", "--status.listen", "127.0.0.1:0"])
        url = status_url(self.fed, "sim", 60)
        self.assertIsNotNone(url, self.fed.log("sim"))

        def status():
            return json.loads(http_get(url + "/status.json")[2])
        s = wait_for(lambda: (lambda j: j if len([r for r in j["rounds"] if r["accuracy"]]) >= 3
                              else None)(status()), 60)
        self.assertIsNotNone(s, self.fed.log("sim")[-2000:])
        self.assertEqual(s["role"], "simulation")
        self.assertEqual(s["round"]["planned"], 100000)
        self.assertEqual((s["clients"]["registered"], s["clients"]["in_round"]), (20, 5))
        self.assertGreater(s["round"]["eta_seconds"], 0)
        rounds = [r["round"] for r in s["rounds"]]
        self.assertEqual(rounds, list(range(1, len(rounds) + 1)))
        self.assertEqual([r["round"] for r in s["rounds"] if r["accuracy"] is not None],
                         [r for r in rounds if r % 5 == 0])
        # The progress lines the simulator printed say the same accuracy, to their 0.1%.
        printed = {int(m.group(1)): float(m.group(2)) for m in re.finditer(
            r"round +(\d+)/100000  acc (\d+\.\d)%  ", self.fed.log("sim"))}
        compared = [r for r in s["rounds"] if r["accuracy"] is not None and r["round"] in printed]
        self.assertGreaterEqual(len(compared), 3, printed)
        for r in compared:
            self.assertAlmostEqual(100 * r["accuracy"], printed[r["round"]], delta=0.051)
        later = wait_for(lambda: (lambda j: j if j["rounds"][-1]["round"] > rounds[-1] else None)(
            status()), 30)
        self.assertIsNotNone(later, "the rounds did not advance on the page")
        metrics = {smp.name: smp.value for f in text_string_to_metric_families(
            http_get(url + "/metrics")[2]) for smp in f.samples}
        self.assertGreater(metrics["starling_round"], rounds[-1])
        self.assertGreater(metrics["starling_eta_seconds"], 0)
        if CHROMIUM:
            reader = DomReader()
            reader.feed(chromium(url + "/", "--dump-dom"))
            self.assertEqual(reader.text["role"].strip(), "simulation")
            self.assertEqual(reader.text["clients-label"].strip(), "Simulated clients")
            self.assertEqual(reader.text["clients-online"].strip(), "20")
            self.assertIn("ETA", reader.text["progress"])
            self.assertTrue([a for tag, a in reader.elements if tag == "path" and
                             a.get("class") == "accuracy" and int(a["data-points"]) >= 3])
        sim.kill()
        sim.wait(timeout=30)


class SimJsonLog(unittest.TestCase):
    """starling-sim --log.format json: every line it prints one JSON object in the deployed
    programs' format, a round's line with its round."""

    def test_every_line_of_the_simulator_is_an_object_and_rounds_say_which(self):
        d = tempfile.mkdtemp(prefix="starling-simlog-")
        try:
            write_csv(os.path.join(d, "data.csv"), 200, 3)
            out = subprocess.run([
                os.path.join(BIN, "starling-sim"), "--model.spec", "softmax", "--data.format", "csv",
                "--data.dir", d, "--data.train", "data.csv", "--data.test", "data.csv",
                "--data.num_clients", "10", "--sampling.clients_per_round", "3",
                "--train.rounds", "12", "--eval.every", "5", "--log.format", "json"],
                capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        lines = [l for l in out.stdout.splitlines() if l.strip()]
        objects = [json.loads(l) for l in lines]  # every line parses
        self.assertTrue(all(o["program"] == "sim" and o["level"] == "info" for o in objects))
        self.assertTrue(objects[0]["msg"].startswith("starling-sim: softmax"), objects[0])
        rounds = [o for o in objects if re.match(r"round +\d+/12", o["msg"])]
        self.assertEqual([o["round"] for o in rounds], list(range(1, 13)))
        for o in rounds:
            self.assertEqual(o["round"], int(o["msg"].split()[1].split("/")[0]))
            self.assertNotIn("\r", o["msg"])
        # A round without an evaluation says which round its accuracy was measured at.
        self.assertIn("(round 5)", rounds[5]["msg"])
        self.assertTrue(objects[-1]["msg"].startswith("starling-sim: 12 rounds"), objects[-1])
        self.assertNotIn("round", objects[-1])


class JsonLogs(LiveRoot):
    """log.format = json: every line of the root's log one JSON object, the round, peer and error
    code where the root knows them."""

    def test_the_roots_log_is_one_json_object_a_line_with_round_peer_and_code(self):
        port, sock = self.start_root(["--log.format", "json"])
        self.start_client(port, 0)
        self.start_client(port, 1)
        self.gate.open(4)  # two rounds
        self.assertTrue(wait_for(lambda: len(self.records()) >= 2, 60), self.fed.log("root"))
        self.assertEqual(admin(sock, "revoke", "1")[0], 0)
        self.gate.open(2)  # the fits of round 3 end; client 1 hears the news
        self.runs[1]["thread"].join(60)
        self.assertIsInstance(self.runs[1].get("error"), starling.UpstreamRefused)
        # Client 1 gone, the next round waits for a second client (sampling.wait_ms, 60 s): a
        # drain does not wait for a round that has not started.
        self.assertEqual(admin(sock, "drain")[0], 0)
        root = [p for name, p, _ in self.fed.procs if name == "root"][0]
        t0 = time.monotonic()
        self.assertEqual(root.wait(timeout=60), 0, self.fed.log("root"))
        self.assertLess(time.monotonic() - t0, 20, "the drain waited for the clients")
        self.assertIn("was waiting for its clients and had not started", self.fed.log("root"))
        lines = [l for l in self.fed.log("root").splitlines() if l.strip()]
        self.assertGreater(len(lines), 5)
        objects = [json.loads(l) for l in lines]  # every line parses
        for o in objects:
            self.assertEqual(o["program"], "server")
            self.assertIn(o["level"], ("trace", "debug", "info", "warning", "error", "critical"))
            self.assertTrue(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", o["ts"]), o)
            self.assertIsInstance(o["msg"], str)
        # The round lines carry their round; the revocation's refusals their peer and code.
        rounds = [o for o in objects if o["msg"].startswith("round ")]
        self.assertTrue(rounds)
        for o in rounds:
            self.assertEqual(o.get("round"), int(o["msg"].split()[1].split("/")[0]), o)
        refused = [o for o in objects if o.get("code") == "revoked"]
        self.assertTrue(refused, "no line with code revoked")
        self.assertTrue(all(o.get("peer") == 1 for o in refused), refused)


if __name__ == "__main__":
    unittest.main()
