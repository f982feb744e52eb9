"""/metrics through toki, scraped by a real Prometheus (Debian's
`prometheus` package, started here on a loopback port with toki's token):
toki's own series (toki_*) and every backend's llama-server series
(llamacpp:*, from the server started with --metrics) arrive with a backend
label and move as requests are made; the backend without --metrics is
reported by toki_backend_metrics_up 0; `promtool check metrics` passes on
toki's series (and on the whole scrape says only of llama-server's names);
every query of docs/grafana/toki-dashboard.json has data."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toki_harness as th  # noqa: E402


def scrape(port):
    st, body = th.request(port, "GET", "/metrics")
    assert st == 200, (st, body)
    return body


def samples(text):
    """{(name, frozenset of label pairs): value} of an exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, labels = head.partition("{")
        pairs = []
        for part in labels.rstrip("}").split(",") if labels else []:
            k, _, v = part.partition("=")
            pairs.append((k, v.strip('"')))
        out[(name, frozenset(pairs))] = float(value)
    return out


@unittest.skipUnless(shutil.which("prometheus") and shutil.which("promtool"),
                     "needs Debian's prometheus package (scripts/install-deps.sh)")
class Metrics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = th.generated_model("ui", params="4M", ctx=8192)
        # One thread each: the two compute at once (their self-tests).
        cls.a = th.LlamaServer(model=cls.model, slots=2, ctx=4096, ubatch=64,
                               extra=["--metrics"], name="metrics-a", threads=1)
        cls.b = th.LlamaServer(model=cls.model, slots=1, ctx=4096, ubatch=64, name="metrics-b",
                               threads=1)
        cls.toki = th.Toki([cls.a, cls.b], ubatch=64, name="toki-metrics")
        cls.tmp = tempfile.mkdtemp(prefix="toki-prom-", dir=th.WORK_DIR)

    @classmethod
    def tearDownClass(cls):
        cls.toki.kill()
        cls.a.kill()
        cls.b.kill()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_promtool_and_series(self):
        text = scrape(self.toki.port)

        def promtool(t):
            r = subprocess.run(["promtool", "check", "metrics"], input=t, capture_output=True,
                               text=True, timeout=60)
            return r.returncode, [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
        # toki's own series: no problem at all.
        own = "".join(l + "\n" for l in text.splitlines() if "toki_" in l.split(" ")[0] or
                      (l.startswith("# ") and l.split(" ")[2].startswith("toki_")))
        rc, problems = promtool(own)
        self.assertEqual((rc, problems), (0, []), own)
        # The whole scrape parses (a parse error is no family's); what the
        # linter says is only of llama-server's own names (llamacpp:*, with
        # colons, one counter without _total), kept as llama-server has them.
        rc, problems = promtool(text)
        self.assertTrue(problems)
        self.assertTrue(all(p.startswith("llamacpp:") for p in problems), problems)
        s = samples(text)
        for b, up in ((self.a, 1), (self.b, 0)):
            self.assertEqual(s[("toki_backend_metrics_up", frozenset({("backend", b.url)}))], up)
            self.assertEqual(s[("toki_backend_up", frozenset({("backend", b.url)}))], 1)
        names = {n for n, _ in s}
        self.assertIn("llamacpp:prompt_tokens_total", names)
        # Only the server started with --metrics has llama-server series.
        backends = {dict(l)["backend"] for n, l in s if n.startswith("llamacpp:")}
        self.assertEqual(backends, {self.a.url})

    def test_prometheus_scrapes_and_series_move(self):
        prom_port = th.free_port()
        token = os.path.join(self.tmp, "token")
        with open(token, "w") as f:
            f.write(th.TEST_TOKEN)
        cfg = os.path.join(self.tmp, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n"
                    "scrape_configs:\n  - job_name: toki\n"
                    f"    authorization:\n      credentials_file: {token}\n"
                    f"    static_configs:\n      - targets: ['127.0.0.1:{self.toki.port}']\n")
        log = open(os.path.join(self.tmp, "prometheus.log"), "w")
        prom = subprocess.Popen(["prometheus", f"--config.file={cfg}",
                                 f"--storage.tsdb.path={os.path.join(self.tmp, 'data')}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                                stdout=log, stderr=log)
        try:
            self._scraped(prom_port)
        finally:
            prom.terminate()
            prom.wait(timeout=30)
            log.close()

    def _query(self, prom_port, q):
        url = (f"http://127.0.0.1:{prom_port}/api/v1/query?" +
               urllib.parse.urlencode({"query": q}))
        with urllib.request.urlopen(url, timeout=10) as r:
            d = json.load(r)
        return [(m["metric"], float(m["value"][1])) for m in d["data"]["result"]]

    def _wait_value(self, prom_port, q, pred, timeout=90):
        """Polls the query until pred(its results) holds: a scrape after the
        event, however slow the machine."""
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                last = self._query(prom_port, q)
                if pred(last):
                    return last
            except OSError as e:  # not up yet
                last = e
            time.sleep(0.2)
        self.fail(f"{q}: never as expected; last {last}")

    def _scraped(self, prom_port):
        self._wait_value(prom_port, 'up{job="toki"}', lambda r: r and r[0][1] == 1)
        before = self._query(prom_port, "sum(toki_requests_total)")
        n0 = before[0][1] if before else 0
        conv = [{"role": "system", "content": "You answer in one word. " * 20},
                {"role": "user", "content": "Colour of the sky?"}]
        for turn in range(3):
            st, r = self.toki.chat(conv, max_tokens=4)
            self.assertEqual(st, 200, r)
            conv += [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"And turn {turn}?"}]
        # A raw prompt: the completion API, on exact mode's grid schedule.
        st, r = th.request(self.toki.port, "POST", "/completion",
                           {"prompt": "Once upon a time", "n_predict": 4, "temperature": 0})
        self.assertEqual(st, 200, r)
        self._wait_value(prom_port, "sum(toki_requests_total)",
                         lambda r: r and r[0][1] == n0 + 4)
        by_api = {m["api"]: v for m, v in
                  self._query(prom_port, "sum by (api) (toki_routed_requests_total)")}
        self.assertGreaterEqual(by_api["chat"], 3)
        self.assertGreaterEqual(by_api["completion"], 1)
        self.assertEqual(by_api["messages"] + by_api["responses"], 0)
        sched = {m["schedule"]: v for m, v in
                 self._query(prom_port, "sum by (schedule) (toki_exact_requests_total)")}
        self.assertGreaterEqual(sched["messages"], 3)
        self.assertGreaterEqual(sched["grid"], 1)
        made = {m["made_by"]: v for m, v in
                self._query(prom_port, "sum by (made_by) (toki_prompts_total)")}
        self.assertGreaterEqual(made["toki"], 3)  # its own template and tokenizer
        # The conversation's later turns were hits, on a backend named.
        hits = self._wait_value(prom_port, 'toki_routes_total{route="hit"} > 0',
                                lambda r: bool(r))
        self.assertIn(hits[0][0]["backend"], (self.a.url, self.b.url))
        self._wait_value(prom_port, "sum(toki_cached_tokens_total)",
                         lambda r: r and r[0][1] > 0)
        self._wait_value(prom_port, "toki_queue_wait_seconds_count",
                         lambda r: sum(v for _, v in r) >= 3)
        # The llama-server series, labelled with their backend.
        lc = self._wait_value(prom_port, "llamacpp:prompt_tokens_total",
                              lambda r: bool(r))
        self.assertEqual([m["backend"] for m, _ in lc], [self.a.url])
        off = self._wait_value(prom_port, "toki_backend_metrics_up == 0", lambda r: bool(r))
        self.assertEqual([m["backend"] for m, _ in off], [self.b.url])
        # Every query of the Grafana dashboard in docs/ runs, and has data.
        with open(os.path.join(th.SOURCE_DIR, "docs", "grafana", "toki-dashboard.json")) as f:
            dash = json.load(f)
        exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
        self.assertGreaterEqual(len(exprs), 8)
        for e in exprs:
            self._wait_value(prom_port, e, lambda r: bool(r))

    def test_z_backend_killed(self):
        """Last: a backend killed between scrapes. The scrape toki answers
        while it may still count it up goes through the failed call (its
        series left out, 200 all the same); then toki says it is down."""
        self.a.kill()
        deadline = time.time() + 60
        while True:
            s = samples(scrape(self.toki.port))
            self.assertFalse([n for n, _ in s if n.startswith("llamacpp:")])
            self.assertEqual(s[("toki_backend_metrics_up", frozenset({("backend", self.a.url)}))],
                             0)
            if s[("toki_backend_up", frozenset({("backend", self.a.url)}))] == 0:
                break
            self.assertLess(time.time(), deadline, "toki never saw the backend down")
            time.sleep(0.1)


if __name__ == "__main__":
    th.run_tests()
