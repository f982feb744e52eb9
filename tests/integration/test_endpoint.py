"""One endpoint for every registry model (`toki up` without --model): requests
route by "model" (name, alias; none: the active model; unknown: 404 in the
route's own error shape), each model starts on its first request (once,
however many requests race for it), models take turns under
TOKI_MAX_LOADED=1, and a conversation whose model was swapped out and back
comes back from its slot files (route "disk") evaluating what it would have
without the swap, with exact mode's answer. A model's server that dies under
requests fails them (502, or an error event) and starts again on the next,
the other model untouched. `toki down` leaves nothing."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from test_exact_identity import conversations


class Endpoint(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="toki-endpoint-")
        self.env = dict(os.environ, TOKI_STATE_DIR=os.path.join(self.tmp, "state"),
                        TOKI_MODEL_REGISTRY=os.path.join(self.tmp, "models.yaml"),
                        TOKI_LLAMA_SERVER=th.llama_server_path(), TOKI_MAX_LOADED="1")
        for name in ("a", "b"):  # the same weights under two names: same answers
            shutil.copy(th.test_model(), os.path.join(self.tmp, name + ".gguf"))
        with open(self.env["TOKI_MODEL_REGISTRY"], "w") as f:
            f.write("models:\n"
                    "  a:\n    path: %s/a.gguf\n    ctx: 1024\n    aliases: [\"gpt-a\"]\n"
                    "  b:\n    path: %s/b.gguf\n    ctx: 1024\n    max_output: 64\n"
                    "active: a\n" % (self.tmp, self.tmp))
        self.port = th.free_port()
        self.log = os.path.join(self.tmp, "state", "run", "endpoint", "serve.log")

    def tearDown(self):
        self.toki("down")
        shutil.rmtree(self.tmp, ignore_errors=True)

    def toki(self, *args):
        return subprocess.run([th.TOKI_BIN, *args], capture_output=True, text=True,
                              env=self.env, timeout=120)

    def add_c(self, more=""):
        """A third model, c (the same weights again), in the registry, and
        `more` after it. Returns the registry's text without `more`."""
        shutil.copy(th.test_model(), os.path.join(self.tmp, "c.gguf"))
        reg = self.env["TOKI_MODEL_REGISTRY"]
        with open(reg) as f:
            text = f.read().replace("active:", "  c:\n    path: %s/c.gguf\n    ctx: 1024\n"
                                    "active:" % self.tmp)
        with open(reg, "w") as f:
            f.write(text + more)
        return text

    def log_text(self):
        with open(self.log) as f:
            return f.read()

    def starts(self, name):
        return len(re.findall(r"pool: starting %s \(start" % name, self.log_text()))

    def models(self):
        st, m = th.request(self.port, "GET", "/v1/models")
        self.assertEqual(st, 200, m)
        return {e["id"]: e for e in m["data"]}

    def chat(self, model, msgs, **kw):
        body = dict({"messages": msgs, "max_tokens": 12, "temperature": 0}, **kw)
        if model:
            body["model"] = model
        st, r = th.request(self.port, "POST", "/v1/chat/completions", body)
        self.assertEqual(st, 200, r)
        return r

    def chat_settled(self, model, msgs, starts_past_timeout=False):
        """A chat, then the wait until the CPU turn is free: its model's
        toki serve has ended what it does after the answer (the keep), so
        that the next request does not wait for it and the turn waits
        the test counts are its own. starts_past_timeout: under a short
        TOKI_BACKEND_TIMEOUT the model's start may outlast it on a loaded
        machine (a 504 for the waiter, the start going on): asked again."""
        deadline = time.time() + 120
        while True:
            body = {"model": model, "messages": msgs, "max_tokens": 12, "temperature": 0}
            st, r = th.request(self.port, "POST", "/v1/chat/completions", body)
            if st != 504 or not starts_past_timeout:
                break
            self.assertIn("timed out waiting for model", str(r))
            self.assertLess(time.time(), deadline, r)
        self.assertEqual((st, r.get("model")), (200, model), r)
        self.wait_turn_free()

    def up_loaded(self, names, starts_past_timeout=False):
        """`toki up` (every model may stay loaded), each of names loaded by a
        chat and settled (chat_settled). Returns the chats' messages."""
        self.env.pop("TOKI_MAX_LOADED", None)
        r = self.toki("up", "--port", str(self.port))
        self.assertEqual(r.returncode, 0, r.stderr)
        msgs = [{"role": "user", "content": "Once upon a time"}]
        for name in names:
            self.chat_settled(name, msgs, starts_past_timeout)
        return msgs

    def wait_turn_free(self):
        self.until("the CPU turn is free", lambda s, m: s["cpu_turn"] is None)

    def stats(self):
        """The endpoint's /toki/stats, and its models by name."""
        st, s = th.request(self.port, "GET", "/toki/stats")
        self.assertEqual(st, 200, s)
        return s, {m["name"]: m for m in s["models"]}

    def until(self, what, cond, timeout=30):
        """stats() once cond(stats, models) holds; fails after timeout s."""
        deadline = time.time() + timeout
        while True:
            s, m = self.stats()
            if cond(s, m):
                return s, m
            self.assertLess(time.time(), deadline, f"{what}: {s}")
            time.sleep(0.02)

    def child_pid(self, name):
        st, stats = th.request(self.port, "GET", "/toki/stats")
        self.assertEqual(st, 200, stats)
        pids = [m["pid"] for m in stats["models"] if m["name"] == name]
        self.assertTrue(pids and pids[0] > 0, stats)
        return pids[0]

    def processes_with(self, marker):
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

    def test_one_endpoint_routes_swaps_and_stops(self):
        r = self.toki("up", "--port", str(self.port))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("endpoint is up for 2 registry models", r.stdout)
        m = self.models()
        self.assertEqual(sorted(m), ["a", "b"])
        self.assertEqual((m["a"]["state"], m["b"]["state"]), ("unloaded", "unloaded"))
        self.assertEqual(m["a"]["context_length"], 1024)
        self.assertEqual(m["a"]["aliases"], ["gpt-a"])
        self.assertEqual(m["b"]["max_output"], 64)

        # Unknown names: 404 in each API's shape, naming the models there are.
        st, e = th.request(self.port, "POST", "/v1/chat/completions",
                           {"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        self.assertEqual(st, 404, e)
        self.assertIn("a (aliases gpt-a), b", e["error"]["message"])
        st, e = th.request(self.port, "POST", "/v1/messages",
                           {"model": "nope", "max_tokens": 4,
                            "messages": [{"role": "user", "content": "x"}]})
        self.assertEqual(st, 404, e)
        self.assertEqual(e["type"], "error")
        self.assertIn("gpt-a", e["error"]["message"])
        # The name is read from a body with a NUL in it (a tool's output of
        # a binary file) too; before, such a body went to the active model.
        st, e = th.request(self.port, "POST", "/v1/chat/completions",
                           {"model": "nope", "messages": [{"role": "user", "content": "\x00"}]})
        self.assertEqual(st, 404, e)

        # A registry edited while the endpoint runs is read again; one that
        # does not parse is reported and the old one kept.
        reg = self.env["TOKI_MODEL_REGISTRY"]
        with open(reg) as f:
            good = f.read()
        with open(reg, "w") as f:
            f.write("models:\n  a: [\n")
        self.assertEqual(sorted(self.models()), ["a", "b"])
        self.assertIn("the registry has an error, keeping the one read before", self.log_text())
        fake = os.path.join(self.tmp, "fails-to-load")
        with open(fake, "w") as f:
            f.write("#!/bin/sh\necho 'fake: cannot load the model' >&2\nexit 1\n")
        os.chmod(fake, 0o755)
        with open(th.test_model(), "rb") as src, open(os.path.join(self.tmp, "cut.gguf"),
                                                       "wb") as dst:
            dst.write(src.read()[:600000])  # its tensors end past the end
        with open(reg, "w") as f:
            f.write(good.replace("active:", "  dies:\n    path: %s/b.gguf\n    binary: %s\n"
                                 "  cut:\n    path: %s/cut.gguf\n"
                                 "active:" % (self.tmp, fake, self.tmp)))
        self.assertEqual(sorted(self.models()), ["a", "b", "cut", "dies"])
        # A corrupt GGUF: refused before anything starts, saying why.
        st, e = th.request(self.port, "POST", "/tokenize", {"model": "cut", "content": "x"})
        self.assertEqual(st, 503, e)
        self.assertIn("truncated file", e["error"]["message"])
        # A server that exits while loading: its requests get why.
        st, e = th.request(self.port, "POST", "/v1/chat/completions",
                           {"model": "dies", "messages": [{"role": "user", "content": "x"}]})
        self.assertEqual(st, 503, e)
        self.assertIn("fake: cannot load the model", e["error"]["message"])

        # Two first requests race for a (by its alias, on a chat route and a
        # pass-through one): it starts once, and both are answered.
        results = []

        def first(path, body):
            results.append(th.request(self.port, "POST", path, body))

        threads = [threading.Thread(target=first, args=a) for a in (
            ("/tokenize", {"model": "a", "content": "Once upon a time"}),
            ("/v1/chat/completions", {"model": "gpt-a", "max_tokens": 4,
                                      "messages": [{"role": "user", "content": "hi"}]}))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual([st for st, _ in results], [200, 200], results)
        self.assertEqual(self.starts("a"), 1, self.log_text())
        self.assertEqual(self.models()["a"]["state"], "loaded")
        # No model: the active one (a), no swap.
        self.assertEqual(self.chat(None, [{"role": "user", "content": "hi"}])["model"], "a")
        self.assertEqual(self.starts("a"), 1)

        # A conversation on a; the same one on b (the same weights) swaps a
        # out, saving its slots, and continues on b without a swap: what a
        # turn evaluates when its model stayed loaded.
        system, users = conversations(21, count=1, turns=2)[0]
        hist = [{"role": "system", "content": system[:1200]},
                {"role": "user", "content": users[0][:200]}]
        t1a = self.chat("a", hist)
        t1_text = t1a["choices"][0]["message"]["content"]
        swap_started = time.time()
        st, tok = th.request(self.port, "POST", "/tokenize", {"model": "b", "content": "hi"})
        swap_s = time.time() - swap_started
        self.assertEqual(st, 200, tok)
        m = self.models()
        self.assertEqual((m["a"]["state"], m["b"]["state"]), ("unloaded", "loaded"))
        t1b = self.chat("b", hist)
        self.assertEqual(t1b["choices"][0]["message"]["content"], t1_text)
        hist2 = hist + [{"role": "assistant", "content": t1_text},
                        {"role": "user", "content": users[1][:200]}]
        t2b = self.chat("b", hist2)
        # Back to a: b is swapped out, a restores the conversation from disk.
        t2a = self.chat("a", hist2)
        self.assertEqual(self.starts("a"), 2)
        c = t2a["cache"]
        self.assertEqual(c["route"], "disk", c)
        self.assertLessEqual(c["evaluated"], t2b["cache"]["evaluated"] * 1.05,
                             (c, t2b["cache"]))
        self.assertEqual(t2a["timings"]["prompt_n"], c["evaluated"])
        # Exact mode: the answer is the uncached request's.
        raw = self.chat("a", hist2, cache_prompt=False)
        self.assertEqual(t2a["choices"][0]["message"]["content"],
                         raw["choices"][0]["message"]["content"])
        self.assertEqual(t2a["choices"][0]["message"]["content"],
                         t2b["choices"][0]["message"]["content"])
        print(f"\nswap to b: {swap_s:.2f} s; turn 2 evaluated {c['evaluated']} after a swap, "
              f"{t2b['cache']['evaluated']} without", file=sys.stderr)

        # A streaming request for a model that is not loaded gets keep-alives
        # while it loads, then its answer.
        # (and, asking for progress, the load's events).
        st, events = th.stream(self.port, "/v1/chat/completions",
                               {"model": "b", "stream": True, "max_tokens": 4,
                                "return_progress": True,
                                "messages": [{"role": "user", "content": "hi"}]})
        self.assertEqual(st, 200)
        self.assertTrue(any(ev.startswith(": toki loading b") for ev in events), events[:3])
        loads = [th.event_json(ev) for ev in events if "toki.model.load" in ev]
        self.assertTrue(loads and loads[0]["model"] == "b", events[:3])
        self.assertTrue(th.stream_text(events), events)

        # toki model use loads into the running endpoint and makes it active.
        r = self.toki("model", "use", "a")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("a is loaded in the endpoint", r.stdout)
        self.assertEqual(self.models()["a"]["state"], "loaded")
        # Launchers pin the active model, through the endpoint (a swap does
        # not move them to a stopped model's port).
        r = self.toki("launch", "opencode", "--config")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.tmp, "state", "agents", "opencode",
                               "opencode.json")) as f:
            conf = f.read()
        self.assertEqual(json.loads(conf)["model"], "toki/a")
        self.assertIn("127.0.0.1:%d/v1" % self.port, conf)

        # Its toki serve dies: the next request starts it again.
        os.kill(self.child_pid("a"), 9)
        deadline = time.time() + 20
        while self.models()["a"]["state"] != "unloaded" and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.chat("a", [{"role": "user", "content": "hi"}])["model"], "a")
        self.assertEqual(self.starts("a"), 4)

        # toki status and a scrape ask the endpoint, and start no model.
        self.assertEqual(self.toki("status").returncode, 0)
        st, metrics = th.request(self.port, "GET", "/metrics", raw=True)
        self.assertIn('toki_endpoint_model_starts_total{model="a"} 4', metrics)
        # A ttl (here the registry's default) stops an idle model.
        pid = self.child_pid("a")
        with open(reg, "a") as f:
            f.write("ttl: 1\n")
        deadline = time.time() + 20
        while self.models()["a"]["state"] != "unloaded" and time.time() < deadline:
            time.sleep(0.1)
        self.assertIn("pool: stopping a (pid %d): idle past its ttl" % pid,
                      self.log_text())
        self.assertEqual(self.starts("a"), 4)

        r = self.toki("down")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("stopped endpoint", r.stdout)
        self.assertRaises(OSError, th.request, self.port, "GET", "/health", None, None, 2)
        self.assertEqual(self.processes_with(self.tmp), [])

    def test_memory_decides_who_runs(self):
        # Each model takes about 2.5 MiB here; 1.5 GiB is kept free. With
        # 1540 MiB one fits, not two: b makes a stop. With 1537 not even one:
        # the sizing error toki model use gives.
        self.env.pop("TOKI_MAX_LOADED")
        self.env["TOKI_MEMORY_MB"] = "1540"
        r = self.toki("up", "--port", str(self.port), "--max-body-mb", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        # toki serve's options given to toki up reach the endpoint.
        st, e = th.request(self.port, "POST", "/v1/chat/completions", "x" * (2 << 20))
        self.assertEqual(st, 413, e)
        for name in ("a", "b"):
            st, tok = th.request(self.port, "POST", "/tokenize",
                                 {"model": name, "content": "hi"})
            self.assertEqual(st, 200, tok)
        m = self.models()
        self.assertEqual((m["a"]["state"], m["b"]["state"]), ("unloaded", "loaded"))
        self.assertIn("pool: stopping a", self.log_text())
        self.assertEqual(self.toki("down").returncode, 0)
        self.env["TOKI_MEMORY_MB"] = "1537"
        r = self.toki("up", "--port", str(self.port))
        self.assertEqual(r.returncode, 0, r.stderr)
        st, e = th.request(self.port, "POST", "/tokenize", {"model": "a", "content": "hi"})
        self.assertEqual(st, 503, e)
        self.assertIn("refused: a does not fit this machine", e["error"]["message"])

    def test_groups_run_together(self):
        # a and b are a group; c is in none. The cap comes from the registry
        # (no TOKI_MAX_LOADED) so that it can change while the endpoint runs.
        self.env.pop("TOKI_MAX_LOADED")
        reg = self.env["TOKI_MODEL_REGISTRY"]
        text = self.add_c("groups:\n  pair: [a, b]\nmax_loaded: 1\n")
        r = self.toki("up", "--port", str(self.port))
        self.assertEqual(r.returncode, 0, r.stderr)

        def tokenize(name):
            return th.request(self.port, "POST", "/tokenize", {"model": name, "content": "hi"})

        self.assertEqual(tokenize("a")[0], 200)
        # One model at a time cannot hold the pair: b is refused, a stays.
        st, e = tokenize("b")
        self.assertEqual(st, 503, e)
        self.assertIn("b does not fit beside the running models of its group pair (a): "
                      "the group does not fit together: max_loaded is 1",
                      e["error"]["message"])
        m = self.models()
        self.assertEqual((m["a"]["state"], m["b"]["state"]), ("loaded", "unloaded"))
        # Two at a time: a, then c; b makes c stop, though a was used
        # longer ago (without the group, a would go).
        reads = self.log_text().count("pool: registry read again")
        with open(reg, "w") as f:
            f.write(text + "groups:\n  pair: [a, b]\nmax_loaded: 2\n")
        deadline = time.time() + 20
        while self.log_text().count("pool: registry read again") == reads:
            self.assertLess(time.time(), deadline, "the registry was not read again")
            time.sleep(0.05)
        self.assertEqual(tokenize("c")[0], 200)
        self.assertEqual(tokenize("b")[0], 200)
        m = self.models()
        self.assertEqual((m["a"]["state"], m["b"]["state"], m["c"]["state"]),
                         ("loaded", "loaded", "unloaded"))
        self.assertIn("pool: stopping c", self.log_text())
        self.assertEqual(self.starts("a"), 1)

    def test_models_on_the_cpu_take_turns(self):
        # llama.cpp's CPU threads spin while they wait for each other, so two
        # models computing at once on the same cores stall each other (32 s
        # against 0.95 s one after the other, docs/benchmarks.md). a, b and c
        # all compute on the CPU here. While a's request is in flight (its
        # toki serve stopped, so that it stays so), b's request waits, c's
        # start waits, and a's next request waits behind both (the turn
        # passes in order); a GET of b's goes at once. Once a's answer is
        # back: b's, then c's start and request, then a's.
        self.add_c()
        msgs = self.up_loaded(("a", "b"))
        stats, until = self.stats, self.until

        s, m = stats()
        self.assertEqual((m["a"]["cpu"], m["b"]["cpu"], s["cpu_turn"]), (True, True, None))
        self.assertEqual((m["a"]["turn_waits"], m["b"]["turn_waits"]), (0, 0))

        results, order = {}, []

        def ask(key, model):
            results[key] = th.request(self.port, "POST", "/v1/chat/completions",
                                      {"model": model, "messages": msgs, "max_tokens": 8})
            order.append(key)

        kept_alive = threading.Event()

        def ask_stream(key, model):
            # Read as it comes, to tell when the first keep-alive is in.
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            conn.request("POST", "/v1/chat/completions",
                         body=json.dumps({"model": model, "messages": msgs, "max_tokens": 8,
                                          "temperature": 0, "stream": True}),
                         headers={"Content-Type": "application/json",
                                  "Authorization": "Bearer " + th.TEST_TOKEN})
            resp = conn.getresponse()
            seen = b""
            while True:
                chunk = resp.read1(4096)
                if not chunk:
                    break
                seen += chunk
                if b"\n\n" in seen:
                    kept_alive.set()
            conn.close()
            events = [e for e in seen.decode().split("\n\n") if e.strip()]
            results[key] = (resp.status, events)
            order.append(key)

        def start(key, model, stream=False):
            t = threading.Thread(target=ask_stream if stream else ask, args=(key, model))
            t.start()
            return t

        pid = self.child_pid("a")
        os.kill(pid, signal.SIGSTOP)
        try:
            threads = [start("a1", "a")]
            until("a computes", lambda s, m: m["a"]["computing"] == 1 and s["cpu_turn"] == "a")
            threads.append(start("b1", "b", stream=True))
            until("b's request waits for the turn",
                  lambda s, m: m["b"]["turn_waits"] == 1 and m["b"]["queued"] == 1)
            threads.append(start("c1", "c"))
            until("c's start waits for the turn", lambda s, m: m["c"]["turn_waits"] == 1)
            self.assertIn("pool: c starts once the CPU is free", self.log_text())
            threads.append(start("a2", "a"))
            s, m = until("a's next request waits behind them",
                         lambda s, m: m["a"]["turn_waits"] == 1 and m["a"]["queued"] == 1)
            self.assertEqual((m["a"]["computing"], m["b"]["computing"], m["c"]["state"]),
                             (1, 0, "unloaded"))
            self.assertEqual(s["waiting"], 3)
            # toki status says who has the turn (a's own run, stopped,
            # is left out after its 3 s).
            r = self.toki("status")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("\n  cpu turn     a (the others on the CPU wait for it)\n", r.stdout)
            # A request that does not compute goes through at once.
            st, props = th.request(self.port, "GET", "/props?model=b")
            self.assertEqual(st, 200, props)
            self.assertTrue(kept_alive.wait(30), "b's stream got no keep-alive")
            self.assertEqual(order, [])
        finally:
            os.kill(pid, signal.SIGCONT)
        for t in threads:
            t.join(120)
        for key in ("a1", "b1", "c1", "a2"):
            st, r = results[key]
            self.assertEqual(st, 200, r)
        # b's stream said what it waited for (a comment, every
        # keep-alive), then gave the answer as a stream does.
        events = results["b1"][1]
        self.assertEqual(events[0], ": toki b waits for the CPU", events)
        self.assertEqual(events[-1], "data: [DONE]", events)
        text = "".join(th.event_json(e)["choices"][0]["delta"].get("content") or ""
                       for e in events if e.startswith("data: {"))
        alone = self.chat("a", msgs, max_tokens=8)["choices"][0]["message"]["content"]
        self.assertEqual(text, alone)
        self.assertEqual(order, ["a1", "b1", "c1", "a2"])
        self.wait_turn_free()
        s, m = stats()
        self.assertEqual([m[k]["turn_waits"] for k in "abc"], [1, 1, 1])
        self.assertEqual((s["cpu_turn"], s["waiting"]), (None, 0))
        st, metrics = th.request(self.port, "GET", "/metrics")
        self.assertIn('toki_endpoint_model_turn_waits_total{model="c"} 1', str(metrics))
        r = self.toki("status")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"(?m)^  model +b loaded: loads 1, unloads 0, "
                         r"CPU turn waits 1, last start")

    def test_models_whose_threads_fit_share_the_cpu(self):
        # a and b run with -t 1, and two threads fit this machine's CPUs:
        # each has a CPU of its own, so neither spins for the other, and
        # they compute at once. c is left to llama.cpp's choice (a thread
        # per core): it shares with no one, and its start waits for both.
        cpus = len(os.sched_getaffinity(0))
        if cpus < 2:
            self.skipTest("one CPU: two models' threads never fit it")
        reg = self.env["TOKI_MODEL_REGISTRY"]
        with open(reg) as f:
            text = f.read()
        with open(reg, "w") as f:
            f.write(text.replace("    ctx: 1024\n", "    ctx: 1024\n    args: [\"-t\", \"1\"]\n"))
        self.add_c()
        msgs = self.up_loaded(("a", "b"))
        s, m = self.stats()
        self.assertEqual((m["a"]["threads"], m["b"]["threads"], s["cpus"]), (1, 1, cpus))
        self.assertEqual((m["a"]["cpu"], m["b"]["cpu"], s["cpu_turn"]), (True, True, None))

        results, order = {}, []

        def ask(key, model):
            results[key] = th.request(self.port, "POST", "/v1/chat/completions",
                                      {"model": model, "messages": msgs, "max_tokens": 8,
                                       "temperature": 0})
            order.append(key)

        threads = []

        def start(key, model):
            t = threading.Thread(target=ask, args=(key, model))
            t.start()
            threads.append(t)

        # Each child stopped, so that its request stays in flight.
        pa, pb = self.child_pid("a"), self.child_pid("b")
        os.kill(pa, signal.SIGSTOP)
        os.kill(pb, signal.SIGSTOP)
        try:
            start("a1", "a")
            self.until("a computes", lambda s, m: m["a"]["computing"] == 1)
            start("b1", "b")
            s, m = self.until("b computes beside a",
                              lambda s, m: m["b"]["computing"] == 1 and s["waiting"] == 0)
            self.assertEqual((s["cpu_turn"], m["b"]["turn_waits"]), ("a, b", 0))
            start("c1", "c")
            self.until("c's start waits for both", lambda s, m: m["c"]["turn_waits"] == 1)
            r = self.toki("status")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("\n  cpu turn     a, b (their threads fit the %d CPUs together; "
                          "the others on the CPU wait)\n" % cpus, r.stdout)
            self.assertRegex(r.stdout, r"(?m)^  model +a loaded \(1 in flight\): loads 1, unloads 0, "
                             r"threads 1, last start")
            self.assertEqual(order, [])
        finally:
            os.kill(pa, signal.SIGCONT)
            os.kill(pb, signal.SIGCONT)
        for t in threads:
            t.join(120)
        for key in ("a1", "b1", "c1"):
            st, r = results[key]
            self.assertEqual(st, 200, r)
        # Computing beside each other changed no answer of theirs (the
        # same weights: the same text as alone).
        self.wait_turn_free()
        alone = self.chat("a", msgs, max_tokens=8)["choices"][0]["message"]["content"]
        self.assertEqual([results[k][1]["choices"][0]["message"]["content"]
                          for k in ("a1", "b1")], [alone, alone])
        s, m = self.stats()
        self.assertEqual([m[k]["turn_waits"] for k in "abc"], [0, 0, 1])
        self.assertIsNone(m["c"]["threads"])

    def test_the_turn_passes_when_a_request_times_out(self):
        # TOKI_BACKEND_TIMEOUT=5. a's and b's toki serves are stopped; a's
        # request holds the CPU turn, b's and c's wait for it. After 5 s the
        # endpoint gives up on a's (504) and b's goes, to be given up on 5 s
        # later; only then does c's go, about 10 s after it came: the wait for the
        # turn does not count against a request's own timeout (else c's
        # would be a 504 at 5 s), and a model that hangs holds the turn no
        # longer than a timeout.
        self.env["TOKI_BACKEND_TIMEOUT"] = "5"
        self.add_c()
        msgs = self.up_loaded(("a", "b", "c"), starts_past_timeout=True)
        log_from = len(self.log_text())  # the warm-ups' own 504s are before it
        results, ends = {}, {}

        def ask(model):
            results[model] = th.request(self.port, "POST", "/v1/chat/completions",
                                        {"model": model, "messages": msgs, "max_tokens": 8})
            ends[model] = time.time()

        def models():
            st, s = th.request(self.port, "GET", "/toki/stats")
            return {m["name"]: m for m in s["models"]}

        pids = [self.child_pid("a"), self.child_pid("b")]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        threads = []
        try:
            for name, ready in (("a", lambda m: m["a"]["computing"] == 1),
                                ("b", lambda m: m["b"]["turn_waits"] == 1),
                                ("c", lambda m: m["c"]["turn_waits"] == 1)):
                threads.append(threading.Thread(target=ask, args=(name,)))
                threads[-1].start()
                deadline = time.time() + 20
                while not ready(models()):
                    self.assertLess(time.time(), deadline, name)
                    time.sleep(0.02)
            c_came = time.time()
            threads[-1].join(60)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        for t in threads:
            t.join(60)
        self.assertEqual(results["a"][0], 504, results["a"])
        self.assertEqual(results["b"][0], 504, results["b"])
        self.assertEqual(results["c"][0], 200, results["c"])
        self.assertLess(ends["a"], ends["b"])
        self.assertLess(ends["b"], ends["c"])
        self.assertGreater(ends["c"] - c_came, 5.0)
        self.assertNotIn("timed out waiting for model c", self.log_text()[log_from:])
        # Both stopped models answer again.
        for name in ("a", "b"):
            self.assertEqual(self.chat(name, msgs)["model"], name)

    def test_the_turn_waits_for_the_work_after_an_answer(self):
        # A model's answer is not the end of its work on the cores: after a
        # client leaves, exact mode's toki serve waits for its llama-server to
        # stop (and a keep or a tail cut follows an answer). The endpoint
        # keeps the CPU turn until the model's toki serve says, through GET
        # /toki/idle, that nothing runs there. a's llama-server is stopped
        # with a's request in it, and the client leaves: a computes no
        # request any more, but its toki serve still works, so b's request
        # waits; once a's llama-server goes on, a's work ends, and b's goes.
        msgs = self.up_loaded(("a", "b"))
        stats, until = self.stats, self.until

        s, m = stats()
        self.assertEqual((m["a"]["settling"], m["a"]["settle_s"] >= 0), (False, True))
        with open(os.path.join(self.tmp, "state", "run", "a", "serve.json")) as f:
            info = json.load(f)
        llama = info["llama_pid"]
        # a's own toki serve, asked directly: idle now, at once.
        t0 = time.time()
        st, idle = th.request(info["port"], "GET", "/toki/idle?wait_ms=5000")
        self.assertEqual((st, idle), (200, {"idle": True, "requests": 0, "saving": False}))
        self.assertLess(time.time() - t0, 5)
        results = {}
        os.kill(llama, signal.SIGSTOP)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            conn.request("POST", "/v1/chat/completions",
                         body=json.dumps({"model": "a", "stream": True, "max_tokens": 40,
                                          "messages": [{"role": "user",
                                                        "content": "A long story, please"}]}),
                         headers={"Content-Type": "application/json",
                                  "Authorization": "Bearer " + th.TEST_TOKEN})
            until("a computes", lambda s, m: m["a"]["computing"] == 1 and s["cpu_turn"] == "a")
            conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
            until("a's client left, its toki serve still works",
                  lambda s, m: m["a"]["computing"] == 0 and m["a"]["settling"]
                  and s["cpu_turn"] == "a")

            def ask():
                results["b"] = th.request(self.port, "POST", "/v1/chat/completions",
                                          {"model": "b", "messages": msgs, "max_tokens": 8})

            t = threading.Thread(target=ask)
            t.start()
            until("b's request waits for a's work to end",
                  lambda s, m: m["b"]["turn_waits"] == 1 and m["b"]["queued"] == 1)
            # A client of a's /toki/idle that leaves before the answer.
            gone = socket.create_connection(("127.0.0.1", info["port"]))
            gone.sendall(b"GET /toki/idle HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                         + th.TEST_TOKEN.encode() + b"\r\n\r\n")
            gone.close()
            # a's toki serve, asked directly, still works after 1.1 s, and
            # says so when the wait asked for ends; the endpoint, whose own
            # call ends after 1 s, asked again, and b's request still waits.
            t0 = time.time()
            st, idle = th.request(info["port"], "GET", "/toki/idle?wait_ms=1100")
            self.assertEqual((st, idle), (200, {"idle": False, "requests": 1, "saving": False}))
            self.assertGreaterEqual(time.time() - t0, 1.0)
            s, m = stats()
            self.assertEqual((m["a"]["settling"], m["b"]["queued"], s["cpu_turn"]),
                             (True, 1, "a"))
            self.assertEqual(results, {})
        finally:
            os.kill(llama, signal.SIGCONT)
        t.join(120)
        self.assertEqual(results["b"][0], 200, results["b"])
        s, m = until("a's and b's work ended", lambda s, m: s["cpu_turn"] is None)
        self.assertEqual((m["a"]["settling"], s["waiting"]), (False, 0))
        self.assertGreater(m["a"]["settle_s"], 0)
        self.assertEqual(self.chat("a", msgs)["model"], "a")

    def in_flight(self, name):
        st, stats = th.request(self.port, "GET", "/toki/stats")
        return [m["in_flight"] for m in stats["models"] if m["name"] == name][0]

    def test_a_server_that_dies_mid_request(self):
        # Both loaded; a's toki serve is stopped (SIGSTOP) with two requests
        # relayed to it, a whole one and a stream, then killed. Each gets an
        # error (the stream's in its own shape once it began), b is not
        # touched, and a's next request starts it again. Repeated: whether
        # the child's exit or its connection's end comes first is the
        # kernel's choice, and the endpoint freed the child's client under
        # its own callback in one of the two orders.
        self.env.pop("TOKI_MAX_LOADED")
        r = self.toki("up", "--port", str(self.port))
        self.assertEqual(r.returncode, 0, r.stderr)
        for name in ("a", "b"):
            self.assertEqual(self.chat(name, [{"role": "user", "content": "hi"}])["model"],
                             name)
        msgs = [{"role": "user", "content": "Once upon a time"}]
        for round_ in range(1, 4):
            pid = self.child_pid("a")
            os.kill(pid, signal.SIGSTOP)
            results = {}

            def whole():
                results["whole"] = th.request(self.port, "POST", "/v1/chat/completions",
                                              {"model": "a", "messages": msgs,
                                               "max_tokens": 8})

            def streamed():
                results["stream"] = th.stream(self.port, "/v1/chat/completions",
                                              {"model": "a", "messages": msgs,
                                               "max_tokens": 8, "stream": True})

            threads = [threading.Thread(target=t) for t in (whole, streamed)]
            for t in threads:
                t.start()
            deadline = time.time() + 20
            while self.in_flight("a") < 2 and time.time() < deadline:
                time.sleep(0.02)
            self.assertEqual(self.in_flight("a"), 2)
            os.kill(pid, signal.SIGKILL)
            for t in threads:
                t.join(60)
            st, e = results["whole"]
            self.assertEqual(st, 502, e)
            self.assertIn("error", e)
            st, events = results["stream"]
            self.assertIn(st, (200, 502), events)
            if st == 200:
                self.assertIn("error", th.event_json(events[-1]), events)
            # b answers all along; a starts again on its next request.
            self.assertEqual(self.chat("b", msgs)["model"], "b")
            self.assertEqual(self.chat("a", msgs)["model"], "a")
            self.assertEqual(self.starts("a"), 1 + round_)
            self.assertEqual(self.starts("b"), 1)
        self.assertEqual(self.toki("down").returncode, 0)
        self.assertEqual(self.processes_with(self.tmp), [])


if __name__ == "__main__":
    th.run_tests()
