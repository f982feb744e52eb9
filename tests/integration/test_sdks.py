"""The official SDKs against a real `toki serve`: the `openai` package (chat
completions and Responses, streamed and not) and `@anthropic-ai/sdk` (/anthropic:
messages streamed and not, count_tokens, the token as x-api-key and as a
bearer token). A malformed request must surface as the SDK's BadRequestError
(400) and a wrong token as its AuthenticationError (401).

The SDKs are pinned in tests/agents/package-lock.json and installed outside the
source tree by scripts/install-test-agents.sh; each case is one run of
tests/agents/sdk_openai.mjs or sdk_anthropic.mjs. A case whose route toki lacks
fails and says so (it does not skip)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from test_launch_agents import install_agents

SCRIPTS = os.path.join(th.SOURCE_DIR, "tests", "agents")


class SDKs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        bin_dir = install_agents()
        cls.agents_dir = os.path.dirname(os.path.dirname(bin_dir))
        cls.state = tempfile.mkdtemp(prefix="toki-sdk-")
        env = dict(os.environ, TOKI_STATE_DIR=cls.state, TOKI_LLAMA_SERVER=th.llama_server_path())
        cls.proc = subprocess.Popen([th.TOKI_BIN, "serve", "--port", "0", "--model",
                                     th.test_model(), "--name", "sdk", "--ctx", "2048",
                                     "--max-output", "16"],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                    env=env, start_new_session=True)
        line = cls.proc.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError("toki serve did not start: " + line)
        cls.port = int(line.strip().rsplit(":", 1)[1])
        th.wait_http(cls.port, "/health", timeout=120)
        st, models = th.request(cls.port, "GET", "/v1/models")
        cls.model = models["data"][0]["id"]

    @classmethod
    def tearDownClass(cls):
        cls.proc.send_signal(signal.SIGTERM)
        try:
            cls.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(cls.proc.pid, signal.SIGKILL)
            cls.proc.wait()
        shutil.rmtree(cls.state, ignore_errors=True)

    def case(self, script, name, route=None):
        env = dict(os.environ, TOKI_AGENTS_DIR=self.agents_dir,
                   TOKI_ENDPOINT=f"http://127.0.0.1:{self.port}", TOKI_TOKEN=th.TEST_TOKEN,
                   TOKI_MODEL=self.model)
        p = subprocess.run(["node", os.path.join(SCRIPTS, script), name], env=env,
                           capture_output=True, text=True, timeout=300)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        self.assertTrue(lines, f"{script} {name} printed no result:\n{p.stdout}\n{p.stderr}")
        r = json.loads(lines[-1])
        if route and r.get("status") == 404:
            self.fail(f"toki has no {route} route: {r}")
        self.assertTrue(r.get("ok"), f"{script} {name}: {r}\n{p.stderr[-2000:]}")
        self.assertEqual(p.returncode, 0, r)
        return r

    # openai
    def test_openai_nonstream(self):
        r = self.case("sdk_openai.mjs", "nonstream")
        self.assertIn(r["route"], ("hit", "partial", "miss", "disk"))

    def test_openai_stream(self):
        self.case("sdk_openai.mjs", "stream")

    def test_openai_models(self):
        self.case("sdk_openai.mjs", "models")

    def test_openai_bad_request(self):
        r = self.case("sdk_openai.mjs", "bad_request")
        self.assertEqual(r["type"], "BadRequestError")

    def test_openai_wrong_token(self):
        r = self.case("sdk_openai.mjs", "wrong_token")
        self.assertEqual(r["type"], "AuthenticationError")

    def test_openai_responses(self):
        self.case("sdk_openai.mjs", "responses", route="/v1/responses")

    def test_openai_responses_stream(self):
        self.case("sdk_openai.mjs", "responses_stream", route="/v1/responses")

    # @anthropic-ai/sdk
    def test_anthropic_nonstream(self):
        self.case("sdk_anthropic.mjs", "nonstream", route="/anthropic/v1/messages")

    def test_anthropic_bearer(self):
        self.case("sdk_anthropic.mjs", "bearer", route="/anthropic/v1/messages")

    def test_anthropic_stream(self):
        self.case("sdk_anthropic.mjs", "stream", route="/anthropic/v1/messages")

    def test_anthropic_count_tokens(self):
        self.case("sdk_anthropic.mjs", "count_tokens", route="/anthropic/v1/messages/count_tokens")

    def test_anthropic_bad_request(self):
        r = self.case("sdk_anthropic.mjs", "bad_request", route="/anthropic/v1/messages")
        self.assertEqual(r["type"], "BadRequestError")

    def test_anthropic_wrong_token(self):
        r = self.case("sdk_anthropic.mjs", "wrong_token", route="/anthropic/v1/messages")
        self.assertEqual(r["type"], "AuthenticationError")


if __name__ == "__main__":
    th.run_tests()
