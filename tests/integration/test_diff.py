"""`toki diff`: the same prompt raw (cache_prompt off), then cached, against a
real toki serve in front of a real llama-server. The table and --json agree
with what llama-server did: the raw run evaluates the whole prompt, the cached
run reuses what the raw run computed and evaluates less, and the two answers
are byte-identical (exact mode). With no daemon it fails with a message that
says how to start one; with --model and no daemon it starts one and stops it."""
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th

UBATCH = 64
# About 1,500 tokens: long enough that the prefill shows, and many times the
# 64-token micro-batch that exact mode reuses in.
SYSTEM = " ".join(["You are a careful assistant. Answer briefly, cite the facts you use, and say "
                   "so when you do not know."] * 60)


def diff(*args, env=None, timeout=300):
    return subprocess.run([th.TOKI_BIN, "diff", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


class Diff(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = th.generated_model("ui", params="4M", ctx=8192)
        cls.llama = th.LlamaServer(model=cls.model, slots=2, ctx=8192, ubatch=UBATCH)
        cls.toki = th.Toki([cls.llama], ubatch=UBATCH)
        cls.url = f"http://127.0.0.1:{cls.toki.port}"

    @classmethod
    def tearDownClass(cls):
        cls.toki.kill()
        cls.llama.kill()

    def test_table(self):
        out = diff("--url", self.url, "--system", SYSTEM, "--max-tokens", "16",
                   "Tell me about the river.")
        self.assertEqual(out.returncode, 0, out.stderr)
        rows = {}
        for line in out.stdout.splitlines():
            m = re.match(r"^(raw|cached)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)ms\s+(\d+)ms\s+(\d+)$",
                         line)
            if m:
                rows[m.group(1)] = [int(x) for x in m.groups()[1:]]
        self.assertIn("raw", rows, out.stdout)
        self.assertIn("cached", rows, out.stdout)
        prompt, raw_eval, raw_cached, raw_ttft, raw_total, raw_out = rows["raw"]
        cprompt, c_eval, c_cached, c_ttft, c_total, c_out = rows["cached"]
        self.assertGreater(prompt, 1000)
        self.assertEqual(prompt, cprompt)
        self.assertEqual(raw_eval, prompt)  # cache off: all of it
        self.assertEqual(raw_cached, 0)
        self.assertLess(c_eval, raw_eval)
        # Evaluated counts a cut's one throw-away token too, when there was one.
        self.assertIn(c_eval + c_cached, (prompt, prompt + 1))
        # Exact mode evaluates the generation prompt's chunk only.
        self.assertLessEqual(c_eval, 8)
        self.assertLessEqual(raw_ttft, raw_total)
        self.assertLessEqual(c_ttft, c_total)
        self.assertEqual(raw_out, 16)
        m = re.search(r"speed-up: TTFT ([\d.]+)x, total ([\d.]+)x; outputs byte-identical: (\w+)",
                      out.stdout)
        self.assertIsNotNone(m, out.stdout)
        self.assertEqual(m.group(3), "yes", out.stdout)
        self.assertGreater(float(m.group(1)), 0)
        self.assertIn("route: hit", out.stdout)

    def test_json(self):
        out = diff("--url", self.url, "--system", SYSTEM, "--max-tokens", "12", "--json",
                   "What is a heron?")
        self.assertEqual(out.returncode, 0, out.stderr)
        j = json.loads(out.stdout)
        self.assertIsInstance(j["prompt_tokens"], int)
        self.assertGreater(j["prompt_tokens"], 1000)
        for k in ("raw", "cached"):
            self.assertIsInstance(j[k]["evaluated"], int, k)
            self.assertIsInstance(j[k]["ttft_ms"], (int, float), k)
            self.assertIsInstance(j[k]["total_ms"], (int, float), k)
            self.assertGreater(j[k]["ttft_ms"], 0, k)
            self.assertGreaterEqual(j[k]["total_ms"], j[k]["ttft_ms"], k)
            self.assertEqual(j[k]["output_tokens"], 12, k)
        self.assertIs(j["identical"], True)
        self.assertEqual(j["raw"]["text"], j["cached"]["text"])
        self.assertEqual(j["raw"]["evaluated"], j["prompt_tokens"])
        self.assertLess(j["cached"]["evaluated"], j["raw"]["evaluated"])
        self.assertEqual(j["cached"]["cache"]["route"], "hit")
        self.assertEqual(j["cached"]["cache"]["evaluated"], j["cached"]["evaluated"])
        self.assertGreater(j["speedup"]["ttft"], 0)

    def test_short_prompt(self):
        # Exact mode reuses all of a short prompt but its generation prompt.
        out = diff("--url", self.url, "--max-tokens", "4", "hi")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("outputs byte-identical: yes", out.stdout)
        self.assertIn("route: hit", out.stdout)
        self.assertNotIn("nothing was reused", out.stdout)
        # On llama-server's own schedule (--reuse grid) a prompt under one
        # micro-batch has nothing to reuse, and the note says why.
        grid = th.Toki([self.llama], mode="grid", ubatch=UBATCH, name="toki-grid")
        try:
            out = diff("--url", f"http://127.0.0.1:{grid.port}", "--max-tokens", "4", "hi")
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("outputs byte-identical: yes", out.stdout)
            self.assertIn("nothing was reused", out.stdout)
        finally:
            grid.kill()

    def test_no_daemon(self):
        port = th.free_port()
        out = diff("--url", f"http://127.0.0.1:{port}", "hello")
        self.assertNotEqual(out.returncode, 0)
        self.assertEqual(out.stdout, "")
        self.assertIn(f"no toki daemon answers at http://127.0.0.1:{port}", out.stderr)
        self.assertIn("toki model use", out.stderr)
        # No --url and nothing running: the default place, named in the message.
        tmp = tempfile.mkdtemp(prefix="toki-diff-")
        try:
            env = dict(os.environ, TOKI_STATE_DIR=tmp,
                       TOKI_MODEL_REGISTRY=os.path.join(tmp, "models.yaml"))
            try:
                th.request(8787, "GET", "/health", timeout=2)
                default_free = False
            except OSError:
                default_free = True
            if default_free:
                out = diff("--json", "hello", env=env)
                self.assertEqual(out.returncode, 1)
                self.assertEqual(out.stdout, "")
                self.assertIn("no toki daemon answers at http://127.0.0.1:8787", out.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_finds_the_running_model(self):
        # Without --url: the run `toki model use` recorded, and of two, the
        # registry's active one.
        tmp = tempfile.mkdtemp(prefix="toki-diff-")
        try:
            env = dict(os.environ, TOKI_STATE_DIR=os.path.join(tmp, "state"),
                       TOKI_MODEL_REGISTRY=os.path.join(tmp, "models.yaml"))
            for name, port in (("a-dead", th.free_port()), ("b-live", self.toki.port)):
                d = os.path.join(tmp, "state", "run", name)
                os.makedirs(d)
                with open(os.path.join(d, "serve.json"), "w") as f:
                    json.dump({"name": name, "pid": self.toki.proc.pid, "port": port,
                               "host": "127.0.0.1", "model": self.model}, f)
            with open(env["TOKI_MODEL_REGISTRY"], "w") as f:
                f.write(f"models:\n  b-live:\n    path: {self.model}\nactive: b-live\n")
            out = diff("--json", "--max-tokens", "2", "hi", env=env)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(json.loads(out.stdout)["url"], self.url)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_bad_arguments(self):
        self.assertEqual(diff().returncode, 2)
        self.assertEqual(diff("--max-tokens", "0", "x").returncode, 2)
        out = diff("--url", self.url, "--model", "/nonexistent/x.gguf", "--max-tokens", "4", "hi")
        self.assertEqual(out.returncode, 0, out.stderr)  # a daemon answers: it is used
        self.assertIn("using it", out.stderr)
        self.assertEqual(diff("--help").returncode, 0)

    def test_model_starts_and_stops_a_daemon(self):
        tmp = tempfile.mkdtemp(prefix="toki-diff-")
        env = dict(os.environ, TOKI_STATE_DIR=os.path.join(tmp, "state"),
                   TOKI_MODEL_REGISTRY=os.path.join(tmp, "models.yaml"),
                   TOKI_LLAMA_SERVER=th.llama_server_path())
        port = th.free_port()
        try:
            out = diff("--url", f"http://127.0.0.1:{port}", "--model", self.model, "--system",
                       SYSTEM, "--max-tokens", "4", "--json", "Hello", env=env, timeout=600)
            self.assertEqual(out.returncode, 0, out.stderr)
            j = json.loads(out.stdout)
            self.assertIs(j["identical"], True)
            self.assertLess(j["cached"]["evaluated"], j["raw"]["evaluated"])
            self.assertIn("starting", out.stderr)
            self.assertIn("stopping", out.stderr)
            # It returns once its daemon has stopped, not at the end of the
            # stop's timeout (30 s: an exited child it had not reaped still
            # looked alive).
            done = time.time()
            logs = glob.glob(os.path.join(tmp, "state", "run", "*", "serve.log"))
            self.assertEqual(len(logs), 1, logs)
            with open(logs[0]) as f:
                stopped = [line for line in f if " toki info: stopped" in line]
            self.assertTrue(stopped, "the daemon logged no stop")
            t_stop = datetime.datetime.strptime(stopped[-1][:23], "%Y-%m-%dT%H:%M:%S.%f")
            t_stop = t_stop.replace(tzinfo=datetime.timezone.utc).timestamp()
            self.assertLess(done - t_stop, 10, "toki diff waited on after its daemon stopped")
            st = subprocess.run([th.TOKI_BIN, "status"], capture_output=True, text=True,
                                env=env, timeout=60)
            self.assertIn("nothing is running", st.stdout)
            with self.assertRaises(OSError):
                th.request(port, "GET", "/health", timeout=2)
        finally:
            subprocess.run([th.TOKI_BIN, "down"], capture_output=True, env=env, timeout=120)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    th.run_tests()
