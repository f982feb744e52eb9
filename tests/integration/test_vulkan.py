"""Exact mode's self-test on a GPU backend: llama.cpp's Vulkan backend
(ggml-vulkan) on Mesa's software Vulkan driver, lavapipe, from Debian sid's
packages (scripts/provision-llama-server.sh --backend vulkan).

On lavapipe, ggml-vulkan's cooperative-matrix matrix product gets the last
partial tile of a micro-batch wrong, from memory past its input, so what a
server computed before changes the next answer, cached or not
(docs/exact.md, "GPU backends"). So:
- at its defaults, toki's start-up self-test finds that, and the log, the
  stats and every cache block say so;
- a server toki manages (toki serve --model) is restarted with the remedy,
  GGML_VK_DISABLE_COOPMAT=1, when the self-test fails, and then verified.
test_vulkan_identity.py has the identity workloads on the remedied server."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from test_vulkan_identity import MODELS, body, ask


class SelfTestFindsIt(unittest.TestCase):
    """ggml-vulkan at its defaults on lavapipe: not verified, and said so."""

    def test_defaults_are_not_verified(self):
        llama = th.LlamaServer(model=MODELS[0][1](), slots=2, ctx=4096, backend="vulkan")
        toki = th.Toki([llama], mode="exact")
        try:
            devices = subprocess.run([th.llama_server_path("vulkan"), "--list-devices"],
                                     capture_output=True, text=True).stdout
            self.assertIn("Vulkan0: llvmpipe", devices)
            ex = toki.stats()["backends"][0]["exact"]
            self.assertEqual(ex["selftest"], "failed", ex)
            self.assertIn("after one earlier prompt", ex["verdict"])
            self.assertIsNone(ex["remedy"])
            log = toki.wait_log("exact: not verified on this backend")
            self.assertIn("start llama-server with GGML_VK_DISABLE_COOPMAT=1", log)
            r = ask(self, toki, [{"role": "user", "content": "Hello there."}], max_tokens=4)
            self.assertTrue(r["cache"]["exact"].startswith("not verified on this backend: "),
                            r["cache"])
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()


class ManagedRemedy(unittest.TestCase):
    """toki serve --model on ggml-vulkan: the self-test fails, toki restarts
    its llama-server with GGML_VK_DISABLE_COOPMAT=1, and then verifies it."""

    def test_managed_server_gets_the_remedy(self):
        state = tempfile.mkdtemp(prefix="toki-state-")
        self.addCleanup(shutil.rmtree, state, True)
        env = dict(os.environ, TOKI_STATE_DIR=state,
                   TOKI_LLAMA_SERVER=th.llama_server_path("vulkan"))
        args = [th.TOKI_BIN, "serve", "--port", "0", "--model", th.test_model(), "--name", "vk",
                "--ctx", "2048", "--slots", "2"]
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
        try:
            port = int(p.stdout.readline().strip().rsplit(":", 1)[1])
            th.wait_http(port, "/health", timeout=120)
            ex = th.request(port, "GET", "/toki/stats")[1]["backends"][0]["exact"]
            self.assertEqual(ex["selftest"], "verified", ex)
            self.assertEqual(ex["remedy"], "GGML_VK_DISABLE_COOPMAT=1")
            out = subprocess.run([th.TOKI_BIN, "status"], capture_output=True, text=True,
                                 env=env, check=True).stdout
            self.assertIn("exact        verified on this backend with "
                          "GGML_VK_DISABLE_COOPMAT=1", out)
            r = th.request(port, "POST", "/v1/chat/completions",
                           body([{"role": "user", "content": "Once upon a time"}]))[1]
            self.assertEqual(r["cache"]["exact"],
                             "verified on this backend with GGML_VK_DISABLE_COOPMAT=1")
        finally:
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=60)
        self.assertIn("restarting its llama-server with GGML_VK_DISABLE_COOPMAT=1", err)
        self.assertEqual(p.returncode, 0, err)


if __name__ == "__main__":
    th.run_tests()
