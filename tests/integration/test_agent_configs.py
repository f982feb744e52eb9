"""The configuration `toki launch` writes, checked by the agents themselves:
Cline, Factory Droid and GitHub Copilot CLI (pinned in
tests/agents/package.json) each run one turn through `toki launch` against a
stand-in for a run (tests/integration/fake_run.py: no model is loaded, so
each agent takes seconds). A unit test of toki's own idea of a format is what
let Cline's missing `updatedAt` through: Cline then discarded the file and
never called toki. Here the agent has to reach the endpoint, with the token
and the run's name as the model, and ask for the output budget toki gave it.

The other agents: Claude Code, Codex, OpenCode and Qwen Code complete real
turns in test_launch_agents.py; OpenClaw needs Node >= 24.16 and Kilo, Pi and
the rest cost more to install than this suite can spend (docs/agents.md;
scripts/check-agents.sh checks them by hand)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from fake_run import FakeRun

CTX = 65536
MAX_OUTPUT = 2048  # the run's cap: within half the context, so it is the budget


def install_agents():
    """The bin directory of the pinned agents (installed on first use)."""
    script = os.path.join(th.SOURCE_DIR, "scripts", "install-test-agents.sh")
    out = subprocess.run([script], capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        raise RuntimeError("scripts/install-test-agents.sh failed:\n" + out.stderr[-4000:])
    return out.stdout.strip().splitlines()[-1]


class AgentConfigs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bin = install_agents()

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="toki-agentcfg-")
        self.state = os.path.join(self.tmp, "state")
        self.home = os.path.join(self.tmp, "home")
        self.work = os.path.join(self.tmp, "work")
        for d in (self.state, self.home, self.work):
            os.makedirs(d)
        self.run_ = FakeRun(self.state, name="tiny", ctx=CTX, max_output=MAX_OUTPUT)
        self.env = dict(os.environ, TOKI_STATE_DIR=self.state, HOME=self.home,
                        XDG_CONFIG_HOME=os.path.join(self.home, ".config"),
                        XDG_CACHE_HOME=os.path.join(self.home, ".cache"),
                        XDG_DATA_HOME=os.path.join(self.home, ".local", "share"),
                        XDG_STATE_HOME=os.path.join(self.home, ".local", "state"),
                        TOKI_PROFILE="cpu",
                        PATH=self.bin + os.pathsep + os.environ.get("PATH", ""))
        for k in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "COPILOT_MODEL", "CLINE_DIR",
                  "CLINE_DATA_DIR"):
            self.env.pop(k, None)

    def tearDown(self):
        self.run_.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def launch(self, agent, *args, timeout=120):
        """Runs `toki launch agent -- args`; the first chat request the stand-in
        got (failing when none came), and the finished process."""
        try:
            p = subprocess.run([th.TOKI_BIN, "launch", agent, "--", *args], env=self.env,
                               cwd=self.work, capture_output=True, text=True,
                               stdin=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            self.fail("%s did not finish in %d s: %s" % (agent, timeout, e.stderr))
        req = self.run_.wait_chat(0)
        self.assertIsNotNone(req, "%s never called toki (exit %d):\n%s\n%s"
                             % (agent, p.returncode, p.stdout[-2000:], p.stderr[-2000:]))
        self.assertEqual(req["headers"].get("authorization"), "Bearer " + th.TEST_TOKEN)
        self.assertEqual(req["body"].get("model"), "tiny")
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        return req, p

    def test_cline_reads_its_providers_file(self):
        # Without updatedAt in providers.json, Cline 3.0.65 falls back to its
        # own provider ("Cannot connect to API ... ConnectionRefused").
        self.launch("cline", "say hi please")

    def test_droid_takes_its_custom_model(self):
        req, _ = self.launch("droid", "exec", "-m", "custom:toki-0", "say hi please")
        self.assertEqual(req["body"].get("max_tokens"), MAX_OUTPUT)

    def test_copilot_takes_its_provider(self):
        req, _ = self.launch("copilot", "-p", "say hi please", "--allow-all-tools")
        self.assertEqual(req["body"].get("max_tokens"), MAX_OUTPUT)


if __name__ == "__main__":
    th.run_tests()
