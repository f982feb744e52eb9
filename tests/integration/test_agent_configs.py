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
scripts/check-agents.sh checks them by hand).

SmallModel: `toki launch AGENT --small MODEL` against a real endpoint (`toki
up` without --model) with two registry models. The configuration toki
writes for each agent that takes --small is used the way the agent uses it
(its base URL, its key, the model its small/fast setting names), and the
request reaches the endpoint and is answered by the small model, which
/v1/models then shows loaded while the main one was never started; Codex
itself runs a turn on its `small` profile."""
import json
import os
import re
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


_agents_bin = []


def install_agents():
    """The bin directory of the pinned agents (installed on first use; asked
    once per process)."""
    if _agents_bin:
        return _agents_bin[0]
    script = os.path.join(th.SOURCE_DIR, "scripts", "install-test-agents.sh")
    out = subprocess.run([script], capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        raise RuntimeError("scripts/install-test-agents.sh failed:\n" + out.stderr[-4000:])
    _agents_bin.append(out.stdout.strip().splitlines()[-1])
    return _agents_bin[0]


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


class SmallModel(unittest.TestCase):
    """--small through one endpoint (no agent is started: --config writes the
    files, and each request is made from what they say)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="toki-small-")
        cls.state = os.path.join(cls.tmp, "state")
        cls.env = dict(os.environ, TOKI_STATE_DIR=cls.state,
                       TOKI_MODEL_REGISTRY=os.path.join(cls.tmp, "models.yaml"),
                       TOKI_LLAMA_SERVER=th.llama_server_path(), TOKI_PROFILE="gpu",
                       HOME=os.path.join(cls.tmp, "home"))
        os.makedirs(cls.env["HOME"])
        # The small model holds Codex's prompt (about 8,500 tokens).
        fast = th.generated_model("agents", params="1M", ctx=65536)
        with open(cls.env["TOKI_MODEL_REGISTRY"], "w") as f:
            f.write("models:\n"
                    "  main:\n    path: %s\n    ctx: 1024\n"
                    "  fast:\n    path: %s\n    ctx: 16384\n    max_output: 16\n"
                    "    aliases: [\"quick\"]\n"
                    "active: main\n" % (th.test_model(), fast))
        cls.port = th.free_port()
        up = cls.toki("up", "--port", str(cls.port))
        if up.returncode != 0:
            raise RuntimeError("toki up failed: " + up.stdout + up.stderr)

    @classmethod
    def tearDownClass(cls):
        cls.toki("down")
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def toki(cls, *args, env=None):
        return subprocess.run([th.TOKI_BIN, *args], capture_output=True, text=True,
                              env=env or cls.env, timeout=120)

    def states(self):
        st, m = th.request(self.port, "GET", "/v1/models")
        self.assertEqual(st, 200, m)
        return {e["id"]: e["state"] for e in m["data"]}

    def configure(self, agent, small="fast"):
        """`toki launch agent --small small --config`: the agent's directory
        and the variables its env.sh exports."""
        p = self.toki("launch", agent, "--small", small, "--config")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        d = os.path.join(self.state, "agents", agent)
        with open(os.path.join(d, "env.sh")) as f:
            env = dict(re.findall(r"^export (\w+)='([^']*)'$", f.read(), re.M))
        return d, env

    def post(self, url, path, token, body):
        m = re.match(r"http://127\.0\.0\.1:(\d+)(/.*)?$", url)
        self.assertIsNotNone(m, url)
        self.assertEqual(int(m.group(1)), self.port, url)
        st, r = th.request(self.port, "POST", (m.group(2) or "") + path, body, auth=False,
                           headers={"Authorization": "Bearer " + token})
        self.assertEqual(st, 200, r)
        return r

    def test_small_model_is_answered_through_the_endpoint(self):
        # (Codex's own turn, test_codex_runs_its_small_profile, may have
        # loaded fast already; main is never asked for.)
        self.assertEqual(self.states()["main"], "unloaded")
        msgs = [{"role": "user", "content": "Once upon a time"}]

        # Claude Code: its small fast model (the Haiku tier) on the
        # Anthropic route; the main model stays main.
        d, _ = self.configure("claude", "quick")  # an alias names the model too
        with open(os.path.join(d, "settings.json")) as f:
            cenv = json.load(f)["env"]
        self.assertEqual(cenv["ANTHROPIC_MODEL"], "main")
        self.assertEqual(cenv["ANTHROPIC_DEFAULT_HAIKU_MODEL"], "fast")
        r = self.post(cenv["ANTHROPIC_BASE_URL"], "/v1/messages", cenv["ANTHROPIC_AUTH_TOKEN"],
                      {"model": cenv["ANTHROPIC_SMALL_FAST_MODEL"], "max_tokens": 4,
                       "messages": msgs})
        self.assertEqual(r["model"], "fast")
        self.assertEqual(self.states(), {"main": "unloaded", "fast": "loaded"})

        # OpenCode: small_model names a model of its "toki" provider.
        d, env = self.configure("opencode")
        with open(os.path.join(d, "opencode.json")) as f:
            oc = json.load(f)
        self.assertEqual(oc["model"], "toki/main")
        prov, model = oc["small_model"].split("/", 1)
        opts = oc["provider"][prov]["options"]
        self.assertEqual(opts["apiKey"], "{env:TOKI_API_KEY}")
        self.assertEqual(oc["provider"][prov]["models"][model]["limit"],
                         {"context": 16384, "output": 16})
        r = self.post(opts["baseURL"], "/chat/completions", env["TOKI_API_KEY"],
                      {"model": model, "max_tokens": 4, "messages": msgs})
        self.assertEqual(r["model"], "fast")

        # Qwen Code: fastModel, found in modelProviders (its base URL and the
        # variable that holds its key) in the file QWEN_CODE_SYSTEM_SETTINGS_PATH names.
        d, env = self.configure("qwen")
        with open(env["QWEN_CODE_SYSTEM_SETTINGS_PATH"]) as f:
            qs = json.load(f)
        entry = [m for m in qs["modelProviders"]["openai"] if m["id"] == qs["fastModel"]][0]
        r = self.post(entry["baseUrl"], "/chat/completions", env[entry["envKey"]],
                      {"model": entry["id"], "max_tokens": 4, "messages": msgs})
        self.assertEqual(r["model"], "fast")

        # Codex: `codex --profile small` layers small.config.toml's model over
        # config.toml's provider (Responses API).
        d, env = self.configure("codex")
        home = env["CODEX_HOME"]
        with open(os.path.join(home, "config.toml")) as f:
            base = re.search(r'^base_url = "([^"]+)"$', f.read(), re.M).group(1)
        with open(os.path.join(home, "small.config.toml")) as f:
            model = re.search(r'^model = "([^"]+)"$', f.read(), re.M).group(1)
        r = self.post(base, "/responses", env["TOKI_API_KEY"],
                      {"model": model, "max_output_tokens": 4, "input": "Once upon a time"})
        self.assertEqual(r["model"], "fast")

        # Every one of them reached the small model: the main one never ran.
        self.assertEqual(self.states(), {"main": "unloaded", "fast": "loaded"})

    def test_codex_runs_its_small_profile(self):
        """Codex itself: `--profile small` reads small.config.toml and its turn
        goes to the small model."""
        env = dict(self.env, PATH=install_agents() + os.pathsep + os.environ.get("PATH", ""))
        env.pop("CODEX_HOME", None)
        env.pop("OPENAI_API_KEY", None)
        work = os.path.join(self.tmp, "work")
        os.makedirs(work, exist_ok=True)
        log = os.path.join(self.state, "run", "fast", "serve.log")
        before = os.path.getsize(log) if os.path.exists(log) else 0
        p = subprocess.run([th.TOKI_BIN, "launch", "codex", "--small", "fast", "--",
                            "--profile", "small", "exec", "--skip-git-repo-check",
                            "--dangerously-bypass-approvals-and-sandbox", "say hi"],
                           env=env, cwd=work, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        self.assertIn("small model fast", p.stderr)
        with open(log, errors="replace") as f:
            f.seek(before)
            self.assertRegex(f.read(), r"route=\w+ .*\bevaluated=\d+",
                             "Codex's turn did not reach the small model")
        self.assertEqual(self.states()["main"], "unloaded")

    def test_refusals(self):
        # An unknown name: exit 1, listing the registry's names.
        p = self.toki("launch", "opencode", "--small", "nope", "--config")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("no registry model 'nope' for --small", p.stderr)
        self.assertIn("main, fast", p.stderr)
        # An agent without a second-model setting: exit 2, naming those with one.
        p = self.toki("launch", "droid", "--small", "fast", "--config")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("agents that take --small: claude, codex, opencode, qwen", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.state, "agents", "droid")))
        # A single-model run cannot serve a second model: no endpoint, a run.
        solo_state = os.path.join(self.tmp, "solo-state")
        run = FakeRun(solo_state, name="solo")
        try:
            env = dict(self.env, TOKI_STATE_DIR=solo_state)
            p = self.toki("launch", "claude", "--small", "fast", "--config", env=env)
            self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
            self.assertIn("--small needs the endpoint", p.stderr)
            self.assertIn("toki up (without --model)", p.stderr)
        finally:
            run.close()


if __name__ == "__main__":
    th.run_tests()
