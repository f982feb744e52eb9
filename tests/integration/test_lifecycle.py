"""The model lifecycle as a user runs it: a registered model is started in
its own run with `toki up --model NAME`, answers through the cache, shows in
`toki status` and `toki model list`, refuses removal while running, and stops
with `toki down`; `toki model use NAME` loads it into the endpoint, starting
the endpoint when none runs. Contexts that do not fit are refused with the
numbers."""
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th


class Lifecycle(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="toki-life-")
        self.env = dict(os.environ, TOKI_STATE_DIR=os.path.join(self.tmp, "state"),
                        TOKI_MODEL_REGISTRY=os.path.join(self.tmp, "models.yaml"),
                        TOKI_LLAMA_SERVER=th.llama_server_path())
        self.env.pop("TOKI_TOKEN", None)  # the run makes its own token file
        self.model = os.path.join(self.tmp, "tiny.gguf")
        shutil.copy(th.test_model(), self.model)
        with open(self.env["TOKI_MODEL_REGISTRY"], "w") as f:
            f.write("models:\n  tiny:\n    path: %s\n    ctx: 1024\n    max_output: 16\n"
                    % self.model)

    def tearDown(self):
        self.toki("down")
        shutil.rmtree(self.tmp, ignore_errors=True)

    def toki(self, *args, env=None):
        return subprocess.run([th.TOKI_BIN, *args], capture_output=True, text=True,
                              env=env or self.env, timeout=300)

    def token(self):
        return open(os.path.join(self.env["TOKI_STATE_DIR"], "token")).read().strip()

    def test_use_request_status_remove_down(self):
        port = th.free_port()
        r = self.toki("up", "--model", "tiny", "--port", str(port))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"http://127.0.0.1:{port}/v1", r.stdout)
        self.assertIn("context 1024 tokens per slot", r.stderr)
        # The recorded context is the one the daemon and /v1/models use.
        ctx_file = os.path.join(self.env["TOKI_STATE_DIR"], "run", "tiny", "ctx")
        self.assertEqual(open(ctx_file).read().strip(), "1024")
        auth = {"Authorization": "Bearer " + self.token()}
        st, models = th.request(port, "GET", "/v1/models", headers=auth, auth=False)
        self.assertEqual(models["data"][0]["context_length"], 1024)
        body = {"messages": [{"role": "user", "content": "Once upon a time"}],
                "max_tokens": 32000}
        for turn in range(2):
            st, resp = th.request(port, "POST", "/v1/chat/completions", body, headers=auth,
                                  auth=False)
            self.assertEqual(st, 200, resp)
            self.assertEqual(resp["cache"]["max_tokens"], 16)  # max_output from the registry
        self.assertEqual(resp["cache"]["route"], "hit")
        # The model id is the run's name (llama-server's --alias), not the
        # GGUF's absolute path; a client that still sends the path is served.
        self.assertEqual(models["data"][0]["id"], "tiny")
        for model in ("tiny", self.model):
            st, resp = th.request(port, "POST", "/v1/chat/completions",
                                  {"model": model, "max_tokens": 2,
                                   "messages": [{"role": "user", "content": "hi"}]},
                                  headers=auth, auth=False)
            self.assertEqual(st, 200, (model, resp))
        # ... and what toki launch writes into an agent's config is that name.
        r = self.toki("launch", "opencode", "--config")
        self.assertEqual(r.returncode, 0, r.stderr)
        agent_dir = os.path.join(self.env["TOKI_STATE_DIR"], "agents", "opencode")
        conf = json.load(open(os.path.join(agent_dir, "opencode.json")))
        self.assertEqual(conf["model"], "toki/tiny")
        for name in os.listdir(agent_dir):
            self.assertNotIn(self.model, open(os.path.join(agent_dir, name)).read(), name)
        # A prompt that cannot fit is refused, not cut.
        st, err = th.request(port, "POST", "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "the cat " * 700}]},
                             headers=auth, auth=False)
        self.assertEqual(st, 400, err)
        self.assertIn("exceeds the available context size (1024 tokens)", err["error"]["message"])

        r = self.toki("status", "--json")
        status = json.loads(r.stdout)
        self.assertEqual(len(status), 1)
        self.assertEqual(status[0]["name"], "tiny")
        self.assertEqual(status[0]["effective_ctx"], 1024)
        self.assertGreaterEqual(status[0]["stats"]["routed"], 2)
        self.assertGreater(status[0]["llama_rss_kib"], 0)
        r = self.toki("status")
        self.assertIn("1024 tokens per slot", r.stdout)
        # Where the log is, and toki logs shows it (the active run by default).
        log = os.path.join(self.env["TOKI_STATE_DIR"], "run", "tiny", "serve.log")
        self.assertIn("log          " + log, r.stdout)
        self.assertEqual(status[0]["log"], log)
        r = self.toki("logs")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("/v1/chat/completions slot=", r.stdout)
        self.assertEqual(r.stdout, open(log).read())
        r = self.toki("logs", "tiny", "--llama")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, open(status[0]["llama_log"]).read())
        self.assertEqual(self.toki("logs", "nosuchrun").returncode, 1)
        # -f follows: a refused request made after it started shows up in it.
        follow = subprocess.Popen([th.TOKI_BIN, "logs", "-f"], stdout=subprocess.PIPE,
                                  env=self.env)
        try:
            th.request(port, "GET", "/v1/models?follow-marker", auth=False)
            deadline = time.time() + 20
            seen = ""
            while "401 GET /v1/models" not in seen and time.time() < deadline:
                ready, _, _ = select.select([follow.stdout], [], [], deadline - time.time())
                if ready:
                    seen += os.read(follow.stdout.fileno(), 65536).decode(errors="replace")
            self.assertIn("401 GET /v1/models", seen)
        finally:
            follow.kill()
            follow.wait()

        r = self.toki("model", "list")
        self.assertIn("* tiny", r.stdout)
        r = self.toki("model", "remove", "tiny")
        self.assertEqual(r.returncode, 1)
        self.assertIn("running", r.stderr)

        # Starting it twice does not start a second one, nor does toki model
        # use (which would start the endpoint) while it runs on its own.
        r = self.toki("model", "use", "tiny", "--port", str(th.free_port()))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("tiny already runs as its own run: http://127.0.0.1:%d/v1" % port,
                      r.stdout)
        self.assertEqual([x["name"] for x in json.loads(self.toki("status", "--json").stdout)],
                         ["tiny"])

        r = self.toki("down", "tiny")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRaises(OSError, th.request, port, "GET", "/health", None, None, 2)
        # A run that stopped keeps its log, and toki logs still finds it.
        r = self.toki("logs")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("/v1/chat/completions slot=", r.stdout)
        r = self.toki("model", "remove", "tiny")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(self.model), "remove without --purge kept the weights")
        r = self.toki("model", "list", "--json")
        self.assertEqual(json.loads(r.stdout)["models"] if r.stdout.strip().startswith("{")
                         else json.loads(r.stdout), [])

    def processes_with(self, marker):
        """The live processes whose command line holds marker."""
        found = []
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError, ValueError):
                continue
            if marker in cmd and state != "Z":
                found.append((int(pid), cmd))
        return found

    def test_selftest_verdict_kept_across_starts(self):
        # Exact mode's self-test runs at a server's first start; the same
        # server started again (a swap, a restart) takes the verdict kept
        # then, and a changed server (here its model file's mtime) is
        # tested again, as is one whose kept verdicts do not parse.
        log = os.path.join(self.env["TOKI_STATE_DIR"], "run", "tiny", "serve.log")
        verdicts = os.path.join(self.env["TOKI_STATE_DIR"], "selftest-verdicts.json")

        def start():
            at = os.path.getsize(log) if os.path.exists(log) else 0
            r = self.toki("up", "--model", "tiny", "--port", str(th.free_port()))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(self.toki("down", "tiny").returncode, 0)
            with open(log) as f:
                f.seek(at)
                lines = [l for l in f.read().splitlines() if ": exact: " in l]
            self.assertEqual(len(lines), 1, lines)
            return lines[0]

        self.assertIn("exact: verified on this backend (self-test, ", start())
        kept = json.load(open(verdicts))
        self.assertEqual(len(kept), 1, kept)
        # The backend's bits are kept with it (docs/exact.md).
        bits = next(iter(kept.values()))["bits"]
        self.assertRegex(bits, "^[0-9a-f]{64}$")
        self.assertTrue(start().endswith(
            "exact: verified on this backend (at an earlier start of the same server)"))
        # One kept before bits existed is tested again, and gives the same.
        with open(verdicts, "w") as f:
            json.dump({k: {f: v for f, v in e.items() if f != "bits"}
                       for k, e in kept.items()}, f)
        self.assertIn("(self-test, ", start())
        self.assertEqual(next(iter(json.load(open(verdicts)).values()))["bits"], bits)
        st = os.stat(self.model)
        os.utime(self.model, (st.st_atime, st.st_mtime + 10))
        self.assertIn("(self-test, ", start())
        with open(verdicts, "w") as f:
            f.write("{not json")
        self.assertIn("(self-test, ", start())
        self.assertTrue(json.load(open(verdicts)))  # written whole again

    def test_taken_port_is_refused_before_the_model_loads(self):
        # Another program holds the port: the start is refused with why, and
        # nothing was started (before, toki serve failed after starting
        # llama-server, which stayed behind with the model loaded).
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        try:
            r = self.toki("up", "--model", "tiny", "--port", str(port))
            # The same for the endpoint toki model use would start.
            use = self.toki("model", "use", "tiny", "--port", str(port))
        finally:
            holder.close()
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(f"port {port} is in use; pass --port", r.stderr)
        self.assertNotIn("context", r.stderr, "the model was sized and started anyway")
        self.assertEqual(use.returncode, 1, use.stdout + use.stderr)
        self.assertIn(f"port {port} is in use; pass --port", use.stderr)
        self.assertEqual(self.processes_with(self.model), [])
        self.assertIn("nothing is running", self.toki("status").stdout)
        # A port held by one of toki's runs names that run.
        port = th.free_port()
        self.assertEqual(self.toki("up", "--model", "tiny", "--port", str(port)).returncode, 0)
        r = self.toki("up", "--model", self.model, "--name", "other", "--port", str(port))
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"port {port} is in use by the run 'tiny'", r.stderr)

    def test_use_starts_the_endpoint(self):
        # No endpoint runs: toki model use starts one and loads the model
        # into it, the active model; a second model use of it answers at
        # once; a model that cannot load stops the endpoint the use started.
        port = th.free_port()
        r = self.toki("model", "use", "tiny", "--port", str(port))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"the endpoint is up for 1 registry model: http://127.0.0.1:{port}/v1",
                      r.stdout)
        self.assertIn("tiny is loaded in the endpoint (context 1024)", r.stdout)
        runs = [x["name"] for x in json.loads(self.toki("status", "--json").stdout)]
        self.assertIn("endpoint", runs)
        auth = {"Authorization": "Bearer " + self.token()}
        st, models = th.request(port, "GET", "/v1/models", headers=auth, auth=False)
        self.assertEqual(st, 200, models)
        tiny = [m for m in models["data"] if m["id"] == "tiny"][0]
        self.assertEqual((tiny["state"], tiny["active"]), ("loaded", True))
        self.assertIn("* tiny", self.toki("model", "list").stdout)
        r = self.toki("model", "use", "tiny")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("tiny is loaded in the endpoint", r.stdout)
        # One load's own context would change the model under its saved
        # states: refused, with the command that does it.
        r = self.toki("model", "use", "tiny", "--ctx", "512")
        self.assertEqual(r.returncode, 2)
        self.assertIn("toki up --model tiny --ctx N", r.stderr)
        self.assertEqual(self.toki("down").returncode, 0)
        self.assertEqual(self.processes_with(self.model), [])

        bad = os.path.join(self.tmp, "bad.gguf")
        with open(bad, "wb") as f:
            f.write(b"GGUF" + b"\0" * 64)
        with open(self.env["TOKI_MODEL_REGISTRY"], "a") as f:
            f.write("  bad:\n    path: %s\n" % bad)
        r = self.toki("model", "use", "bad", "--port", str(port))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("toki model use: ", r.stderr)
        self.assertIn("nothing is running", self.toki("status").stdout)

    def test_start_that_times_out_leaves_nothing_running(self):
        # A llama-server that never answers: the start gives up after --wait
        # and stops toki serve and it (before, both stayed, toki status
        # listed a run that never became ready, holding the memory).
        fake = os.path.join(self.tmp, "never-ready-llama-server")
        with open(fake, "w") as f:
            # It answers the probes (--help) as llama-server does.
            f.write("#!/bin/sh\n[ \"$1\" = --help ] && exit 0\n"
                    "sleep 300\n")  # sh stays, with the marker
        os.chmod(fake, 0o755)
        env = dict(self.env, TOKI_LLAMA_SERVER=fake)
        r = self.toki("up", "--model", self.model, "--name", "slow", "--port",
                      str(th.free_port()), "--wait", "2", env=env)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("did not become ready within 2 s, so toki stopped it", r.stderr)
        self.assertEqual(self.processes_with(fake), [])
        self.assertEqual(self.processes_with(self.model), [])
        self.assertIn("nothing is running", self.toki("status").stdout)

    def test_serve_that_dies_at_start_leaves_no_llama_server(self):
        # toki serve dies after starting llama-server (here the stand-in
        # kills it): the llama-server, left to init, is found by its session
        # and stopped (before, it stayed, and toki down could not see it).
        fake = os.path.join(self.tmp, "orphaned-llama-server")
        with open(fake, "w") as f:
            f.write("#!/bin/sh\n[ \"$1\" = --help ] && exit 0\n"
                    "kill -9 $PPID\nsleep 300\n")  # sh stays, with the marker
        os.chmod(fake, 0o755)
        env = dict(self.env, TOKI_LLAMA_SERVER=fake)
        # An earlier start's error in the same log is not this one's.
        os.makedirs(os.path.join(self.env["TOKI_STATE_DIR"], "run", "dies"))
        with open(os.path.join(self.env["TOKI_STATE_DIR"], "run", "dies", "serve.log"),
                  "w") as f:
            f.write("toki serve: cannot listen on 127.0.0.1:1: Address already in use\n")
        r = self.toki("up", "--model", self.model, "--name", "dies", "--port",
                      str(th.free_port()), "--wait", "60", env=env)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("toki serve was killed at start (signal 9)", r.stderr)
        self.assertEqual(self.processes_with(fake), [])

    def test_context_that_does_not_fit_is_refused(self):
        big = th.generated_model("fit", params="24M", ctx=32768)
        env = dict(self.env, TOKI_MEMORY_MB="1700")
        r = self.toki("up", "--model", big, "--name", "fit", "--ctx", "32768", "--port",
                      str(th.free_port()), env=env)
        self.assertEqual(r.returncode, 1)
        self.assertIn("does not fit", r.stderr)
        self.assertIn("KiB/token", r.stderr)
        # The KV caches' types as llama-server reads them: K's from its
        # environment, V left at f16 (before: K's type counted for V too,
        # 28160 tokens, more than fit); both q8_0 by their options.
        r = self.toki("up", "--model", big, "--name", "fit", "--ctx", "32768", "--port",
                      str(th.free_port()), env=dict(env, LLAMA_ARG_CACHE_TYPE_K="q8_0"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("but only 19456 fit: weights 47.0 MiB + KV q8_0/f16 3.1 KiB/token",
                      r.stderr)
        r = self.toki("up", "--model", big, "--name", "fit", "--ctx", "32768", "--port",
                      str(th.free_port()), "--", "--cache_type_k", "q8_0", "-ctv", "q8_0",
                      env=env)
        self.assertEqual(r.returncode, 1)
        self.assertIn("but only 28160 fit: weights 47.0 MiB + KV q8_0 2.1 KiB/token", r.stderr)
        small = th.generated_model("small", params="1M", ctx=2048)
        r = self.toki("up", "--model", small, "--ctx", "4096", "--port",
                      str(th.free_port()))
        self.assertEqual(r.returncode, 1)
        self.assertIn("trained on 2048", r.stderr)
        # Without --ctx, the largest context that fits is chosen.
        r = self.toki("up", "--model", big, "--name", "fit", "--port", str(th.free_port()),
                      env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        ctx = int(open(os.path.join(self.env["TOKI_STATE_DIR"], "run", "fit", "ctx")).read())
        # 1700 MiB - 1.5 GiB margin - 47 MiB weights = 117 MiB; 4 KiB/token x 2 slots
        # -> 14976 tokens a slot, rounded down to 256: 14848.
        self.assertEqual(ctx, 14848)


if __name__ == "__main__":
    th.run_tests()
