"""`toki launch <agent>`: real coding agents (Claude Code, Codex, OpenCode, Qwen
Code; pinned by tests/agents/package-lock.json and installed outside the source
tree by scripts/install-test-agents.sh) each complete a turn against a real
run (`toki up` of a generated model with a large context, --max-output 16 since
the random-weight model never stops by itself), and the second identical turn
is a cache hit: its first request evaluates at most 8 tokens (llama-server's
prompt_n, toki's `evaluated=` in the run's log).

Claude Code needs toki's /anthropic/v1/messages route and Codex its
/v1/responses route: where one is missing, its test fails saying so (it does
not skip). HOME is a temporary directory, so no agent touches the user's
configuration."""
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

RUN = "agents"
TURN_TIMEOUT = int(os.environ.get("TOKI_AGENT_TURN_TIMEOUT", "420"))
MAX_HIT_EVALUATED = 8


def install_agents():
    """The bin directory of the pinned agents (installed on first use)."""
    script = os.path.join(th.SOURCE_DIR, "scripts", "install-test-agents.sh")
    out = subprocess.run([script], capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        raise RuntimeError("scripts/install-test-agents.sh failed:\n" + out.stderr[-4000:])
    return out.stdout.strip().splitlines()[-1]


class LaunchAgents(unittest.TestCase):
    REUSE = "fast"

    @staticmethod
    def agents_model():
        """A model whose context holds an agent's system prompt and tools."""
        return th.generated_model("agents", params="1M", ctx=65536)

    @classmethod
    def setUpClass(cls):
        cls.bin = install_agents()
        cls.tmp = tempfile.mkdtemp(prefix="toki-launch-")
        cls.state = os.path.join(cls.tmp, "state")
        cls.home = os.path.join(cls.tmp, "home")
        cls.work = os.path.join(cls.tmp, "work")
        for d in (cls.state, cls.home, cls.work):
            os.makedirs(d)
        with open(os.path.join(cls.work, "README.md"), "w") as f:
            f.write("scratch directory for toki launch tests\n")
        cls.env = dict(os.environ, TOKI_STATE_DIR=cls.state, HOME=cls.home,
                       XDG_CONFIG_HOME=os.path.join(cls.home, ".config"),
                       XDG_CACHE_HOME=os.path.join(cls.home, ".cache"),
                       XDG_DATA_HOME=os.path.join(cls.home, ".local", "share"),
                       XDG_STATE_HOME=os.path.join(cls.home, ".local", "state"),
                       TOKI_LLAMA_SERVER=th.llama_server_path(),
                       PATH=cls.bin + os.pathsep + os.environ.get("PATH", ""))
        for k in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_HOME",
                  "OPENCODE_CONFIG"):
            cls.env.pop(k, None)
        cls.model = cls.agents_model()
        cls.port = th.free_port()
        up = subprocess.run([th.TOKI_BIN, "up", "--model", cls.model, "--name", RUN,
                             "--ctx", "65536", "--slots", "2", "--max-output", "16",
                             "--reuse", cls.REUSE, "--port", str(cls.port), "--wait", "300"],
                            env=cls.env, capture_output=True, text=True, timeout=400)
        if up.returncode != 0:
            raise RuntimeError("toki up failed: " + up.stdout + up.stderr)
        cls.log = os.path.join(cls.state, "run", RUN, "serve.log")

    @classmethod
    def tearDownClass(cls):
        subprocess.run([th.TOKI_BIN, "down", RUN], env=cls.env, capture_output=True, timeout=60)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    # --- helpers -------------------------------------------------------------

    def log_size(self):
        return os.path.getsize(self.log) if os.path.exists(self.log) else 0

    def finished_requests(self, offset):
        """(route line, evaluated) for each request finished after offset."""
        with open(self.log, errors="replace") as f:
            f.seek(offset)
            text = f.read()
        return [(line, int(m.group(1))) for line in text.splitlines()
                for m in [re.search(r"route=\w+ .*\bevaluated=(\d+)", line)] if m]

    def require_route(self, path, body, agent):
        """Fails (not skips) when toki lacks a route an agent needs."""
        st, resp = th.request(self.port, "POST", path, body, timeout=120)
        if st == 404:
            self.fail(f"toki has no {path} route, which {agent} needs: {resp}")
        self.assertEqual(st, 200, f"{path} answered {st}: {resp}")

    def launch(self, agent, args, extra_env=None):
        env = dict(self.env, **(extra_env or {}))
        t0 = time.time()
        p = subprocess.run([th.TOKI_BIN, "launch", agent, "--"] + args, cwd=self.work, env=env,
                           capture_output=True, text=True, timeout=TURN_TIMEOUT,
                           stdin=subprocess.DEVNULL)
        return p.returncode, p.stdout, p.stderr, time.time() - t0

    def two_turns(self, agent, args, extra_env=None):
        """Runs the same turn twice; checks both complete and the second's first
        request is a cache hit. Returns the second turn's output."""
        off1 = self.log_size()
        rc, out, err, secs = self.launch(agent, args, extra_env)
        self.assertEqual(rc, 0, f"{agent} turn 1 failed ({secs:.0f} s):\n{out[-3000:]}\n"
                                f"{err[-3000:]}")
        turn1 = self.finished_requests(off1)
        self.assertTrue(turn1, f"{agent} sent toki no request:\n{out[-2000:]}\n{err[-2000:]}")
        off2 = self.log_size()
        rc, out, err, secs = self.launch(agent, args, extra_env)
        self.assertEqual(rc, 0, f"{agent} turn 2 failed ({secs:.0f} s):\n{out[-3000:]}\n"
                                f"{err[-3000:]}")
        turn2 = self.finished_requests(off2)
        self.assertTrue(turn2, f"{agent} turn 2 sent toki no request")
        line, evaluated = turn2[0]
        self.assertLessEqual(evaluated, MAX_HIT_EVALUATED,
                             f"{agent}: the second turn's first request was not a cache hit: "
                             f"{line}\n(turn 1: {[l for l, _ in turn1]})")
        print(f"  {agent}: turn 1 {len(turn1)} request(s), turn 2 first request: {line}",
              file=sys.stderr)
        # Every request the agent sent was templated and tokenized as the
        # server does it: no difference turned the local prompts off.
        st, stats = th.request(self.port, "GET", "/toki/stats")
        prompts = stats["backends"][0]["prompts"]
        self.assertEqual(prompts["mismatches"], 0, prompts)
        self.assertTrue(prompts["local_template"], prompts)
        return out

    # --- the agents ------------------------------------------------------------

    def test_opencode(self):
        self.two_turns("opencode", ["run", "say hi"])

    def test_qwen_code(self):
        self.two_turns("qwen", ["-p", "say hi"])

    def test_claude_code(self):
        self.require_route("/anthropic/v1/messages",
                           {"model": "x", "max_tokens": 4,
                            "messages": [{"role": "user", "content": "hi"}]}, "Claude Code")
        self.two_turns("claude", ["-p", "say hi"],
                       {"TOKI_CLAUDE_MCP": "none", "TOKI_PROFILE": "cpu"})

    def test_claude_code_reads_a_prompt_too_long(self):
        """A conversation longer than the context: toki answers in the
        Messages API's words ("prompt is too long: N tokens > M maximum"),
        which Claude Code matches and reports as such (it quoted toki's own
        wording before), so that it can offer to compact."""
        port = th.free_port()
        up = subprocess.run([th.TOKI_BIN, "up", "--model", self.model, "--name", "small",
                             "--ctx", "4096", "--slots", "1", "--max-output", "16",
                             "--port", str(port), "--wait", "300"],
                            env=self.env, capture_output=True, text=True, timeout=400)
        self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
        try:
            env = dict(self.env, TOKI_CLAUDE_MCP="none", TOKI_PROFILE="cpu")
            p = subprocess.run([th.TOKI_BIN, "launch", "claude", "--model", "small", "--",
                                "-p", "say hi"], cwd=self.work, env=env, capture_output=True,
                               text=True, timeout=TURN_TIMEOUT)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("Prompt is too long", p.stdout + p.stderr)
        finally:
            subprocess.run([th.TOKI_BIN, "down", "small"], env=self.env, capture_output=True,
                           timeout=60)

    def test_codex(self):
        self.require_route("/v1/responses",
                           {"model": "x", "max_output_tokens": 4, "input": "hi"}, "Codex")
        self.two_turns("codex", ["exec", "--skip-git-repo-check",
                                 "--dangerously-bypass-approvals-and-sandbox", "say hi"])

    def test_config_and_home_untouched(self):
        """--config writes owner-only files under the state dir and prints where;
        the user's HOME gets no configuration of toki's making."""
        p = subprocess.run([th.TOKI_BIN, "launch", "codex", "--config"], env=self.env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        cfg = os.path.join(self.state, "agents", "codex", "home", "config.toml")
        self.assertIn(cfg, p.stdout)
        self.assertEqual(os.stat(cfg).st_mode & 0o777, 0o600)
        self.assertEqual(os.stat(os.path.dirname(cfg)).st_mode & 0o777, 0o700)
        self.assertNotIn(th.TEST_TOKEN, p.stdout)
        with open(cfg) as f:
            self.assertIn('wire_api = "responses"', f.read())
        self.assertFalse(os.path.exists(os.path.join(self.home, ".codex", "config.toml")))

    def test_not_installed_and_listing(self):
        env = dict(self.env, PATH="/usr/bin:/bin")
        p = subprocess.run([th.TOKI_BIN, "launch", "droid"], env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("npm install -g droid", p.stderr)
        p = subprocess.run([th.TOKI_BIN, "launch"], env=self.env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 0)
        for name in ("claude", "codex", "opencode", "qwen", "droid", "kimi", "omp"):
            self.assertRegex(p.stdout, rf"(?m)^{name}\s")
        self.assertRegex(p.stdout, r"(?m)^claude\s.*\byes\b")


class LaunchAgentsThinking(LaunchAgents):
    """The same agents, in exact mode, on a model with Qwen 3's real
    vocabulary and chat template (thinking on): whatever each agent sends
    (reasoning settings, tools, developer messages), toki renders it as
    llama-server does, and the second turn is a hit."""
    REUSE = "exact"

    @staticmethod
    def agents_model():
        return th.tokenizer_model("qwen3", "qwen2", ctx=65536)

    # Only the agents' turns: the rest does not depend on the model.
    test_claude_code_reads_a_prompt_too_long = None
    test_config_and_home_untouched = None
    test_not_installed_and_listing = None


if __name__ == "__main__":
    th.run_tests()
