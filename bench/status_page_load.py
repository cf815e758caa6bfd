#!/usr/bin/env python3
"""How long the root's status page takes to load in Chromium with 1,000 clients (issue 41: under
1 s), against the same page of an empty federation loaded in the same run.

Each page is served by `starling-deploy-bench --serve_status=N` (a real ZmqFleet with N CURVE
clients that answered three phases, three recorded rounds, FleetMetrics and the StatusServer on
127.0.0.1). Debian's headless Chromium is driven over its DevTools pipe (--remote-debugging-pipe:
JSON messages on fds 3 and 4, no WebSocket library): each load navigates to the page and reads
`data-first-draw-ms`, which the page's script sets when it has fetched /status.json, drawn it and
laid it out (performance.now(): milliseconds since the navigation began), and checks that the
page drew a row for every client. Loads alternate between the two
pages; the medians are reported, with their ratio.

    bench/status_page_load.py [--bin build/bin] [--clients 1000] [--loads 9] [--out FILE.json]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


class Chromium:
    """Headless Chromium on its DevTools pipe: send() a command, wait for its answer."""

    def __init__(self, binary):
        self.cmd_r, self.cmd_w = os.pipe()
        self.res_r, self.res_w = os.pipe()
        cmd_r, res_w = self.cmd_r, self.res_w

        def fds():
            # Chromium reads commands on fd 3 and writes answers on fd 4: move both out of the
            # way first (either pipe end may itself be 3 or 4).
            a, b = os.dup(cmd_r), os.dup(res_w)
            while a in (3, 4) or b in (3, 4):
                a, b = (os.dup(a) if a in (3, 4) else a), (os.dup(b) if b in (3, 4) else b)
            os.dup2(a, 3)
            os.dup2(b, 4)
        self.dir = tempfile.mkdtemp(prefix="starling-cdp-")
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-pipe", "--user-data-dir=" + self.dir, "about:blank"],
            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(res_w)
        self.buf = b""
        self.next_id = 0
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]

    def send(self, method, params=None, session=None, timeout=30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("id") == self.next_id:
                    if "error" in answer:
                        raise RuntimeError(f"{method}: {answer['error']}")
                    return answer.get("result", {})
            chunk = os.read(self.res_r, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its pipe")
            self.buf += chunk
        raise TimeoutError(method)

    def evaluate(self, expression):
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                      self.session)
        return r.get("result", {}).get("value")

    def load(self, url, timeout=30):
        """Navigates to `url`; the page's first-draw time (ms since navigation began) and the
        rows of its peers table."""
        self.send("Page.navigate", {"url": "about:blank"}, self.session)
        self.send("Page.navigate", {"url": url}, self.session)
        until = time.monotonic() + timeout
        probe = ("location.href === %s && document.body && document.body.dataset.firstDrawMs"
                 % json.dumps(url))
        while time.monotonic() < until:
            v = self.evaluate(probe)
            if v:
                return float(v), self.evaluate("document.querySelectorAll('#peers tbody tr').length")
            time.sleep(0.01)
        raise TimeoutError(f"{url} never drew its status")

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def serve(bin_dir, n):
    p = subprocess.Popen([os.path.join(bin_dir, "starling-deploy-bench"), f"--serve_status={n}"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    url = p.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        p.kill()
        raise RuntimeError(f"--serve_status={n} printed {url!r}")
    return p, url + "/"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--loads", type=int, default=9)
    ap.add_argument("--out")
    a = ap.parse_args()
    binary = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if not binary:
        sys.exit("no headless Chromium: apt-get install chromium-headless-shell")
    servers = {}
    try:
        for n in (a.clients, 0):
            t0 = time.monotonic()
            servers[n] = serve(a.bin, n)
            print(f"serving {n} clients at {servers[n][1]} (set up in {time.monotonic() - t0:.1f} s)",
                  file=sys.stderr)
        json_bytes = {}
        for n, (_, url) in servers.items():
            with urllib.request.urlopen(url + "status.json", timeout=30) as r:
                json_bytes[n] = len(r.read())
        c = Chromium(binary)
        try:
            c.send("Page.enable", session=c.session)
            for n, (_, url) in servers.items():  # one warm-up load each (Chromium's own start)
                c.load(url)
            ms = {n: [] for n in servers}
            for _ in range(a.loads):
                for n, (_, url) in servers.items():
                    t, rows = c.load(url)
                    if rows != n:
                        raise RuntimeError(f"the page of {n} clients drew {rows} rows")
                    ms[n].append(t)
        finally:
            c.close()
    finally:
        for p, _ in servers.values():
            p.stdin.close()
            p.wait(timeout=60)
    med = {n: statistics.median(v) for n, v in ms.items()}
    result = {
        "chromium": subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip(),
        "clients": a.clients,
        "loads": a.loads,
        "first_draw_ms": {str(n): v for n, v in ms.items()},
        "median_ms": {str(n): m for n, m in med.items()},
        "max_ms": {str(n): max(v) for n, v in ms.items()},
        "status_json_bytes": {str(n): b for n, b in json_bytes.items()},
        "ratio_vs_empty_federation": med[a.clients] / med[0],
        "target": f"under 1000 ms with {a.clients} clients",
        "met": max(ms[a.clients]) < 1000.0,
    }
    print(json.dumps(result, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
