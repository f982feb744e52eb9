"""What operators see of the endpoint's models (issue 33, ask 7): under
TOKI_MAX_LOADED=1 a conversation on a, then b (a swapped out, its slots
saved), then a again (b swapped out, a started on its slot files):
/toki/stats, /metrics (a `model` label) and `toki status` count each
model's loads, unloads, exits, swap seconds and slot bytes saved and
restored, and so does `toki web`'s models table (headless Chromium, as
test_web.py drives it)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from test_web import Web, browse


class EndpointOps(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="toki-endpoint-ops-")
        self.env = dict(os.environ, TOKI_STATE_DIR=os.path.join(self.tmp, "state"),
                        TOKI_MODEL_REGISTRY=os.path.join(self.tmp, "models.yaml"),
                        TOKI_LLAMA_SERVER=th.llama_server_path(), TOKI_MAX_LOADED="1")
        for name in ("a", "b"):
            shutil.copy(th.test_model(), os.path.join(self.tmp, name + ".gguf"))
        with open(self.env["TOKI_MODEL_REGISTRY"], "w") as f:
            f.write("models:\n"
                    "  a:\n    path: %s/a.gguf\n    ctx: 1024\n"
                    "  b:\n    path: %s/b.gguf\n    ctx: 1024\n"
                    "active: a\n" % (self.tmp, self.tmp))
        self.port = th.free_port()

    def tearDown(self):
        self.toki("down")
        shutil.rmtree(self.tmp, ignore_errors=True)

    def toki(self, *args):
        return subprocess.run([th.TOKI_BIN, *args], capture_output=True, text=True,
                              env=self.env, timeout=120)

    def chat(self, model, msgs):
        st, r = th.request(self.port, "POST", "/v1/chat/completions",
                           {"model": model, "messages": msgs, "max_tokens": 8,
                            "temperature": 0})
        self.assertEqual(st, 200, r)
        return r

    def stats(self):
        st, s = th.request(self.port, "GET", "/toki/stats")
        self.assertEqual(st, 200, s)
        return {m["name"]: m for m in s["models"]}

    def test_swaps_are_counted(self):
        r = self.toki("up", "--port", str(self.port))
        self.assertEqual(r.returncode, 0, r.stderr)
        s = self.stats()
        self.assertEqual((s["a"]["loads"], s["a"]["unloads"], s["a"]["saved_bytes"]),
                         (0, 0, 0), s)
        hist = [{"role": "system", "content": "You tell short stories. " * 20},
                {"role": "user", "content": "Once upon a time"}]
        self.chat("a", hist)
        # b's answer comes once a has stopped (one model at a time): a's
        # exit, and the save of its slots, are counted by then.
        self.chat("b", hist)
        s = self.stats()
        self.assertEqual((s["a"]["state"], s["b"]["state"]), ("unloaded", "loaded"), s)
        self.assertEqual((s["a"]["loads"], s["a"]["unloads"]), (1, 1), s)
        self.assertGreater(s["a"]["saved_bytes"], 0, s)
        self.assertGreater(s["a"]["last_stop_s"], 0, s)
        self.assertEqual(s["b"]["restored_bytes"], 0, s)  # nothing to restore yet
        # Back to a: it starts on the slot files its first run saved.
        self.chat("a", hist)
        s = self.stats()
        a, b = s["a"], s["b"]
        self.assertEqual((a["state"], b["state"]), ("loaded", "unloaded"), s)
        self.assertEqual((a["loads"], a["unloads"], a["exits"]), (2, 1, 0), s)
        self.assertEqual((b["loads"], b["unloads"], b["exits"]), (1, 1, 0), s)
        self.assertGreater(a["restored_bytes"], 0, s)
        self.assertGreater(b["saved_bytes"], 0, s)
        self.assertGreater(a["last_start_s"], 0, s)
        self.assertGreaterEqual(a["total_start_s"], a["last_start_s"], s)
        self.assertEqual(a["queued"], 0, s)

        st, metrics = th.request(self.port, "GET", "/metrics", raw=True)
        self.assertEqual(st, 200, metrics)
        for line in ('toki_endpoint_model_loads_total{model="a"} 2',
                     'toki_endpoint_model_unloads_total{model="a"} 1',
                     'toki_endpoint_model_exits_total{model="a"} 0',
                     'toki_endpoint_model_loads_total{model="b"} 1',
                     'toki_endpoint_model_queued{model="a"} 0',
                     'toki_endpoint_model_saved_bytes_total{model="a"} %d' % a["saved_bytes"],
                     'toki_endpoint_model_restored_bytes_total{model="a"} %d'
                     % a["restored_bytes"]):
            self.assertIn(line + "\n", metrics)
        for fam in ("last_start_seconds", "last_stop_seconds", "start_seconds_total"):
            self.assertRegex(metrics, r'toki_endpoint_model_%s\{model="a"\} [0-9.]+\n' % fam)
            self.assertIn("# TYPE toki_endpoint_model_%s " % fam, metrics)

        r = self.toki("status")
        self.assertEqual(r.returncode, 0, r.stderr)
        line_a = re.search(r"^  model +a loaded: loads 2, unloads 1, last start [0-9.]+ s, "
                           r"last stop [0-9.]+ s, saved ([0-9.]+ [KM]?i?B), "
                           r"restored ([0-9.]+ [KM]?i?B)$", r.stdout, re.M)
        self.assertTrue(line_a, r.stdout)
        self.assertNotEqual(line_a.group(1), "0 B", r.stdout)
        self.assertNotEqual(line_a.group(2), "0 B", r.stdout)
        self.assertRegex(r.stdout, r"(?m)^  model +b unloaded: loads 1, unloads 1, ")

        # toki web in front of the endpoint: its models table, a row each.
        web = Web("http://127.0.0.1:%d/v1" % self.port, env=self.env)
        try:
            seen = browse({"scenario": "models", "url": web.url})
        finally:
            web.kill()
            web.proc.stdout.close()
            web.log.close()
        self.assertEqual(seen["errors"], [], seen["console"])
        rows = {m["name"]: m for m in seen["models"]}
        self.assertEqual(sorted(rows), ["a", "b"], seen["models"])
        self.assertEqual((rows["a"]["state"], rows["a"]["loads"], rows["a"]["unloads"]),
                         ("loaded", "2", "1"), rows)
        self.assertEqual((rows["b"]["state"], rows["b"]["loads"], rows["b"]["unloads"]),
                         ("unloaded", "1", "1"), rows)
        self.assertNotEqual(rows["a"]["saved"], "0 B", rows)
        self.assertNotEqual(rows["a"]["restored"], "0 B", rows)
        self.assertEqual(rows["b"]["restored"], "0 B", rows)


if __name__ == "__main__":
    unittest.main()
