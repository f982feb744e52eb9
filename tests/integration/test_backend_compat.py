"""llama-servers as their users start them, with toki in front (issue 13):
one with --api-key (toki sends the key on every call, and says why
discovery fails without it), one with --no-slots (refused with the reason,
not a silent 503), one with --no-jinja (the start-up probes send only what
it takes), browsers' CORS preflights answered as llama-server answers them,
another client's requests during exact mode's self-test, NULs in a
request's text, and managed runs whose llama-server arguments set a key or change the
model's context."""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from slow_backend import SlowBackend

KEY = "backend-secret-1"
HELLO = [{"role": "user", "content": "Tell me a story about Lily."}]
# Long enough for a slot file (toki saves slots of 256 tokens or more).
LONG = [{"role": "system", "content": "Lily and her dog Max live near the woods. " * 30},
        {"role": "user", "content": "Tell me a story about Lily."}]


def wait_prompts(toki, timeout=30):
    """The backend's prompts object once its start-up probes have ended."""
    deadline = time.time() + timeout
    while True:
        b = toki.stats()["backends"][0]
        p = b.get("prompts", {})
        if b.get("up") and "probing" not in p.get("status", "probing"):
            return p
        if time.time() > deadline:
            raise AssertionError(f"probes did not end: {b}")
        time.sleep(0.05)


def raw(port, method, path, headers, body=None):
    """(status, headers as a dict of lower-case names, body) of one request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


class ApiKey(unittest.TestCase):
    """Item 2: a backend started with --api-key."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="toki-key-")
        self.llama = th.LlamaServer(slots=1, extra=["--api-key", KEY, "--slot-save-path",
                                                    self.dir])
        self.toki = None

    def tearDown(self):
        for p in (self.toki, self.llama):
            if p:
                p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_without_the_key_the_log_says_why(self):
        self.toki = th.Toki([self.llama], wait=False)
        log = self.toki.wait_log("GET /props answered 401")
        self.assertIn("Invalid API Key", log)
        self.assertIn("--backend-key or TOKI_BACKEND_KEY", log)
        st, _ = th.request(self.toki.port, "GET", "/health")
        self.assertEqual(st, 503)
        # Once, not at every attempt (200 ms apart while it is not up): the
        # server has refused three, toki said so once.
        deadline = time.time() + 30
        while self.llama.log_text().count("unauthorized") < 3:
            self.assertLess(time.time(), deadline, self.llama.log_text())
            time.sleep(0.05)
        self.assertEqual(self.toki.log_text().count("answered 401"), 1)

    def test_key_from_the_environment_on_every_call(self):
        self.toki = th.Toki([self.llama], env={"TOKI_BACKEND_KEY": KEY},
                            extra=["--slot-dir", self.dir, "--slot-save-idle-ms", "100"])
        # Discovery, then the probes (/tokenize, /apply-template) with the key.
        prompts = wait_prompts(self.toki)
        self.assertTrue(prompts["local_template"], prompts)
        st, r1 = self.toki.chat(LONG, max_tokens=8)  # /completion
        self.assertEqual(st, 200, r1)
        self.toki.wait_log("saved slot")  # /slots/0?action=save
        st, r2 = self.toki.chat(LONG, max_tokens=8)
        self.assertEqual(st, 200, r2)
        self.assertEqual(r2["choices"][0]["message"]["content"],
                         r1["choices"][0]["message"]["content"])
        st, models = th.request(self.toki.port, "GET", "/v1/models")  # passed through
        self.assertEqual(st, 200, models)
        self.assertNotIn("unauthorized", self.llama.log_text())

    def test_key_option(self):
        self.toki = th.Toki([self.llama], extra=["--backend-key", KEY])
        st, r = self.toki.chat(HELLO, max_tokens=4)
        self.assertEqual(st, 200, r)


class NoSlots(unittest.TestCase):
    """Item 3: a backend started with --no-slots."""

    def setUp(self):
        self.llama = th.LlamaServer(slots=1, extra=["--no-slots"], name="noslots")
        self.others = []

    def tearDown(self):
        for p in [self.llama] + self.others:
            p.kill()

    def test_only_backend_is_refused_with_the_reason(self):
        toki = th.Toki([self.llama], wait=False)
        self.others.append(toki)
        rc = toki.proc.wait(timeout=30)
        self.assertEqual(rc, 1)
        log = toki.log_text()
        self.assertIn("llama-server runs with --no-slots", log)
        self.assertIn("GET /slots", log)
        self.assertIn("only backend: stopping", log)

    def test_beside_another_backend_it_is_left_out_and_said_so(self):
        good = th.LlamaServer(slots=1)
        self.others.append(good)
        toki = th.Toki([good, self.llama])
        self.others.append(toki)
        toki.wait_log("llama-server runs with --no-slots")
        st, r = toki.chat(HELLO, max_tokens=4)
        self.assertEqual(st, 200, r)
        self.assertIsNone(toki.proc.poll())


class DefaultSlots(unittest.TestCase):
    """Item 10: llama-server as most users start it, without -np: its slots
    share one KV cache, and at every new task it empties its idle slots into
    its RAM cache (--cache-ram, on by default), loading from there only into
    a slot it picks itself. toki finds that out, says so once, and lets the
    server pick (fast mode): a conversation that comes back is loaded from
    the server's RAM. On main toki kept sending it to the slot it had
    filled, which the server had emptied: every such turn was a full miss.
    Fast mode without slot files asks at start (backend.c, ram_probe); exact
    mode, which does not ask, sees it on /slots after its second answer."""

    other = [{"role": "system", "content": "Tom has a red ball and a big kite. " * 30},
             {"role": "user", "content": "Tell me a story about Tom."}]

    def setUp(self):
        self.llama = th.LlamaServer(slots=4, cache_ram=8192, np_flag=False)
        self.toki = None

    def tearDown(self):
        if self.toki:
            self.toki.kill(signal.SIGTERM)
        self.llama.kill()

    def test_fast_mode_knows_at_start_and_the_conversation_comes_back(self):
        self.toki = th.Toki([self.llama], mode="fast")
        log = self.toki.wait_log(" up: ")
        b = self.toki.stats()["backends"][0]
        self.assertTrue(b["self_cached"] and b["ram_cache"], log)
        self.assertIn("empties its idle slots into its RAM cache", log)
        self.assertIn("-np N", log)
        st, r = self.toki.chat(LONG, max_tokens=4)
        self.assertEqual(st, 200, r)
        st, r = self.toki.chat(self.other, max_tokens=4)
        self.assertEqual(st, 200, r)
        st, r = self.toki.chat(LONG + [{"role": "assistant", "content": "Once upon a time"},
                                       {"role": "user", "content": "And then?"}], max_tokens=4)
        self.assertEqual(st, 200, r)
        # Loaded from the server's RAM cache: the first turn's prompt.
        self.assertGreater(r["timings"]["cache_n"], 200, r["timings"])

    def test_exact_mode_keeps_to_one_slot_and_loads_from_ram(self):
        # Exact mode runs the RAM probe too, which finds the shared KV cache
        # before the first request. There an answer depends on what the
        # other slots hold, so exact mode keeps to the first slot, and the
        # server's RAM cache brings a conversation back into it (issue 24,
        # bench n without -np: 2.45x llama-server alone's tokens before).
        self.toki = th.Toki([self.llama], mode="exact")
        log = self.toki.wait_log(" up: ")
        b = self.toki.stats()["backends"][0]
        self.assertTrue(b["self_cached"] and b["shared_kv"], log)
        # The self-test holds here: the server empties the idle slot at
        # each of its tasks, so each run is alone in the cache.
        self.assertEqual(b["exact"]["selftest"], "verified", b["exact"])
        self.assertIn("Exact mode uses only its first slot", log)
        self.assertIn("-np N", log)
        turn2 = LONG + [{"role": "assistant", "content": "Once upon a time"},
                        {"role": "user", "content": "And then?"}]
        sent = []
        for msgs in (LONG, self.other, turn2, self.other):
            st, r = self.toki.chat(msgs, max_tokens=4, logprobs=True, top_logprobs=1)
            self.assertEqual(st, 200, r)
            self.assertEqual(r["cache"]["slot"], 0, r["cache"])
            sent.append((msgs, r))
        b = self.toki.stats()["backends"][0]
        self.assertTrue(b["ram_states"]["used"], b)
        # The first turn came back from the server's RAM: a load, not a miss.
        self.assertGreater(sent[2][1]["timings"]["cache_n"], 200, sent[2][1]["timings"])
        self.assertGreaterEqual(b["ram_states"]["loads"], 2, b["ram_states"])
        for msgs, r in sent:
            st, u = self.toki.chat(msgs, max_tokens=4, logprobs=True, top_logprobs=1,
                                   cache_prompt=False)
            self.assertEqual(st, 200, u)
            self.assertEqual((u["choices"][0]["message"]["content"],
                              u["choices"][0]["logprobs"]),
                             (r["choices"][0]["message"]["content"],
                              r["choices"][0]["logprobs"]))


class SharedKvNoRam(unittest.TestCase):
    """Issue 24: llama-server without -np (its slots share one KV cache) and
    with --cache-ram 0. It empties no slot, and /props and /slots look like
    -np 4's, so nothing but an answer tells: exact mode used every slot there,
    and bench n gave 19 of 24 answers identical. The self-test now replaces
    the other run's slot in the middle of its second run (which changes the
    answer only where the slots share a cache), and confirms on one slot
    that the answer depends on the other slots, not on its own history.
    Exact mode then keeps to the first slot. What the other slots hold moves
    where its tokens go, so they must be empty: with --slot-save-path toki
    erases them, and every answer is the one a one-slot server gives; without
    it nothing empties a slot, and the verdict says the promise fails."""

    other = [{"role": "system", "content": "Tom has a red ball and a big kite. " * 30},
             {"role": "user", "content": "Tell me a story about Tom."}]
    turn2 = LONG + [{"role": "assistant", "content": "Once upon a time"},
                    {"role": "user", "content": "And then?"}]

    def turns(self, toki, cache_prompt=True):
        out = []
        for msgs in (LONG, self.other, self.turn2, self.other):
            st, r = toki.chat(msgs, max_tokens=4, logprobs=True, top_logprobs=1,
                              cache_prompt=cache_prompt)
            self.assertEqual(st, 200, r)
            self.assertEqual(r["cache"]["slot"], 0, r["cache"])
            out.append((r["choices"][0]["message"]["content"], r["choices"][0]["logprobs"]))
        return out

    def test_with_a_slot_save_path_the_others_are_erased(self):
        folder = tempfile.mkdtemp(prefix="toki-shared-kv-")
        self.addCleanup(shutil.rmtree, folder, True)
        # Something in the other slots before toki starts, as a user's
        # server has: the erase must take it away.
        llama = th.LlamaServer(slots=4, cache_ram=0, np_flag=False,
                               extra=["--slot-save-path", folder])
        self.addCleanup(llama.kill)
        for slot, text in ((1, "Lily likes cats. " * 20), (2, "Max runs fast. " * 40)):
            st, r = th.request(llama.port, "POST", "/completion",
                               {"prompt": text, "n_predict": 0, "id_slot": slot})
            self.assertEqual(st, 200, r)
        toki = th.Toki([llama], mode="exact")
        self.addCleanup(toki.kill, signal.SIGTERM)
        log = toki.wait_log(" up: ")
        b = toki.stats()["backends"][0]
        self.assertTrue(b["shared_kv"], log)
        self.assertFalse(b["self_cached"] or b["ram_cache"], log)
        self.assertEqual(b["exact"]["selftest"], "verified", b["exact"])
        self.assertIn("on its first slot (its slots share one KV cache)", b["exact"]["verdict"])
        self.assertIn("its slots share one KV cache", log)
        self.assertIn("Exact mode uses only its first slot", log)
        self.assertIn("toki erased the others", log)
        self.assertIn("-np N", log)
        slots = th.request(llama.port, "GET", "/slots")[1]
        self.assertEqual([s.get("n_prompt_tokens") or 0 for s in slots[1:]], [0, 0, 0], slots)
        cached = self.turns(toki)
        uncached = self.turns(toki, cache_prompt=False)
        self.assertEqual(cached, uncached)
        # The answers of a server whose slots are each its own, as if the
        # others had never held anything.
        one = th.LlamaServer(slots=1, cache_ram=0)
        self.addCleanup(one.kill)
        ref = th.Toki([one], mode="exact", name="toki-ref")
        self.addCleanup(ref.kill, signal.SIGTERM)
        self.assertEqual(self.turns(ref, cache_prompt=False), cached)

    def test_without_one_it_fails_and_says_why(self):
        llama = th.LlamaServer(slots=4, cache_ram=0, np_flag=False)
        self.addCleanup(llama.kill)
        toki = th.Toki([llama], mode="exact")
        self.addCleanup(toki.kill, signal.SIGTERM)
        log = toki.wait_log(" up: ")
        b = toki.stats()["backends"][0]
        self.assertTrue(b["shared_kv"], log)
        self.assertEqual(b["exact"]["selftest"], "failed", b["exact"])
        self.assertIn("its slots share one KV cache", b["exact"]["verdict"])
        self.assertIn("without --slot-save-path toki cannot erase", b["exact"]["verdict"])
        self.assertIn("exact mode's promise does not hold on this server", log)
        self.assertNotIn("GGML_VK_DISABLE_COOPMAT", log)
        # Still one slot: the others at least do not change.
        cached = self.turns(toki)
        self.assertEqual(cached, self.turns(toki, cache_prompt=False))


class RamCache(unittest.TestCase):
    """Item 10: llama-server's own RAM cache (--cache-ram, on by default)
    keeps what a slot held when another conversation takes it, and loads it
    back into whichever slot the conversation lands on. toki, without slot
    files, cannot see into it: once the server reuses more than a slot could
    lend, toki says so and lets the server pick slots in fast mode. (On a
    server with one slot, as here, toki does not ask at start: RamCacheProbe.)
    A server without one is never taken for one."""

    def run_three(self, cache_ram):
        llama = th.LlamaServer(slots=1, cache_ram=cache_ram)
        toki = th.Toki([llama], mode="fast")
        try:
            other = [{"role": "system", "content": "Tom has a red ball and a big kite. " * 30},
                     {"role": "user", "content": "Tell me a story about Tom."}]
            for msgs in (LONG, other, LONG):
                st, r = toki.chat(msgs, max_tokens=4)
                self.assertEqual(st, 200, r)
            return r, toki.stats()["backends"][0], toki.log_text()
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()

    def test_loads_from_the_servers_ram_are_seen(self):
        r, b, log = self.run_three(8192)
        # The first conversation came back from the server's RAM.
        self.assertGreater(r["timings"]["cache_n"], 200, r["timings"])
        self.assertTrue(b["ram_cache"], b)
        self.assertIn("loaded a state from its RAM cache", log)
        r, b, log = self.run_three(0)
        self.assertLess(r["timings"]["cache_n"], 32, r["timings"])
        self.assertFalse(b["ram_cache"], b)


class RamCacheProbe(unittest.TestCase):
    """Item 10: learning of the RAM cache at its first load came too late:
    the requests toki pinned before it had cut states the server would have
    kept (bench n, -np 2 --cache-ram 8192: fast 12,408 against 10,854
    alone). In fast mode without slot files, on a server with two slots or
    more, toki now asks at start (three tiny prompts in one slot), and so
    does exact mode, which loads its own states back from that RAM. Slot
    files need no answer, so they do not ask."""

    def started(self, cache_ram, mode="fast", slots=2, model=None):
        llama = th.LlamaServer(model=model, slots=slots, cache_ram=cache_ram)
        toki = th.Toki([llama], mode=mode)
        try:
            log = toki.wait_log(" up: ")
            return toki.stats()["backends"][0], log, llama.log_text()
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()

    def test_fast_mode_asks_at_start(self):
        b, log, server_log = self.started(8192)
        self.assertTrue(b["ram_cache"], log)
        self.assertIn("keeps the states of its slots in RAM", log)
        # -np 2: its own KV cache a slot, not emptied at other tasks.
        self.assertFalse(b["self_cached"], log)
        b, log, server_log = self.started(0)
        self.assertFalse(b["ram_cache"], log)
        self.assertNotIn("keeps the states of its slots in RAM", log)
        self.assertNotIn("could not tell", log)
        # The three prompts ran on the server, in one slot.
        self.assertEqual(server_log.count("selected slot by id"), 3, server_log[-3000:])

    def test_sliding_window_and_hybrid_models(self):
        # Issue 24, item 3: on these llama-server takes A back from its RAM
        # cache only as far as a context checkpoint (46 or 47 of 51 tokens
        # on gemma3 and gpt-oss), and without a RAM cache reuses what A and
        # B share (their first token): the probe tells the two apart.
        for arch in ("gemma3", "gpt-oss", "qwen35"):
            model = th.arch_model(arch)
            b, log, _ = self.started(8192, model=model)
            self.assertTrue(b["ram_cache"], f"{arch}: {log}")
            self.assertFalse(b["self_cached"], f"{arch}: {log}")
            b, log, _ = self.started(0, model=model)
            self.assertFalse(b["ram_cache"], f"{arch}: {log}")
            self.assertNotIn("could not tell", log)

    def test_an_embeddings_server_gets_no_prompts(self):
        # llama-server 11669 crashes on a completion under --embeddings: the
        # probe asks /embeddings first, which such a server answers (400
        # here), and sends it no prompt.
        # Nor does exact mode's self-test, which then cannot tell.
        for mode, said in (("fast", "could not tell whether it has a RAM cache (it serves "
                                    "embeddings)"),
                           ("exact", "exact: unknown on this backend: the self-test could not "
                                     "run (it serves embeddings)")):
            llama = th.LlamaServer(slots=2, cache_ram=8192,
                                   extra=["--embeddings", "--pooling", "mean"])
            toki = th.Toki([llama], mode=mode)
            try:
                toki.wait_log(said)
                st, r = th.request(toki.port, "POST", "/v1/embeddings",
                                   {"input": "Tom has a ball."})
                self.assertEqual(st, 200, r)
                self.assertIsNone(llama.proc.poll(), llama.log_text()[-2000:])
            finally:
                toki.kill(signal.SIGTERM)
                llama.kill()

    def test_exact_mode_asks_one_slot_does_not(self):
        # Exact mode asks too (issue 24, item 2): it loads its own states
        # back from that RAM (router/ram.h). One slot: nothing to ask for.
        for mode, slots in (("exact", 2), ("fast", 1)):
            b, log, server_log = self.started(8192, mode=mode, slots=slots)
            self.assertEqual(b["ram_cache"], mode == "exact", log)
            self.assertEqual(b["ram_states"]["used"], mode == "exact", b)
            if mode == "exact":
                self.assertIn("exact mode loads its own states back from there", log)
            # Exact mode's self-test pins its slot for its own 11 requests (two
            # runs of a history and four steps, and the prompt that replaces
            # the first run's slot in the middle of the second), then 11 for
            # the steps check (a generation, the request after it, the
            # prompt again, 7 tokens one at a time, the request after
            # them); the RAM probe pins 4.
            pinned = 15 + 11 if mode == "exact" else 0
            self.assertEqual(server_log.count("selected slot by id"), pinned, server_log)
            # And the self-test holds with the server's RAM cache on
            # (--cache-ram 8192 here): each run in a slot of its own, nothing
            # loaded back.
            self.assertEqual(b["exact"]["selftest"], "verified" if mode == "exact" else "off",
                             b["exact"])
            # The steps check held too (with the RAM cache on).
            self.assertEqual(b["exact"]["steps"], mode == "exact", b["exact"])
            # -np 2: slots of their own, which the self-test tells.
            self.assertFalse(b["shared_kv"], b)


class NulBytes(unittest.TestCase):
    """A model that writes NUL bytes, as a random-weight model's byte tokens
    do (here llama-server's --logit-bias 3+100 makes stories260K write
    <0x00> every time). toki's start-up probes read its answers as any
    other: before, the RAM-cache probe could not tell, and the self-test
    ended "unknown", which left exact mode without steps, so that the same
    request got another answer on a server whose probes had sampled a NUL
    at its start (1 start in 15 of a random 24M model's)."""

    def test_the_start_up_probes_read_them(self):
        slots = tempfile.mkdtemp(prefix="toki-nul-")
        llama = th.LlamaServer(slots=2, ctx=1024, cache_ram=8192, name="nul",
                               extra=["--logit-bias", "3+100", "--slot-save-path", slots])
        # A state folder of its own: no verdict kept from another start.
        toki = th.Toki([llama], env={"TOKI_STATE_DIR": os.path.join(slots, "state")})
        try:
            b = toki.stats()["backends"][0]
            self.assertEqual((b["exact"]["selftest"], b["exact"]["steps"]),
                             ("verified", True), b["exact"])
            self.assertTrue(b["ram_cache"], b)
            self.assertNotIn("could not tell whether it has a RAM cache", toki.log_text())
            st, r = toki.chat(HELLO, max_tokens=4, logprobs=True)
            self.assertEqual(st, 200, r)
            self.assertEqual(r["choices"][0]["message"]["content"], "\x00" * 4)
            st, again = toki.chat(HELLO, max_tokens=4, logprobs=True, cache_prompt=False)
            self.assertEqual(st, 200, again)
            self.assertEqual(again["choices"][0]["logprobs"], r["choices"][0]["logprobs"])
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()
            shutil.rmtree(slots, ignore_errors=True)

    def test_a_request_that_holds_them(self):
        """A client sends NULs: an agent's tool read a binary file. llama-
        server serves the request; so does toki, through each API and
        with either tokenizer, its prompt as long as the server's and its
        answer the uncached one. Before, toki refused it (400)."""
        tool = {"type": "function", "function": {"name": "cat", "parameters": {
            "type": "object", "properties": {"f": {"type": "string"}}}}}
        chat = [{"role": "system", "content": "You read \x00 files."},
                {"role": "user", "content": "Read a\x00b."},
                {"role": "assistant", "content": "", "tool_calls": [{
                    "id": "c1", "type": "function",
                    "function": {"name": "cat", "arguments": '{"f": "a\\u0000b"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "\x7fELF\x02\x00\x00"}]
        body = {"messages": chat, "tools": [tool], "max_tokens": 4, "temperature": 0,
                "logprobs": True}
        llama = th.LlamaServer(slots=2, ctx=1024, name="nul-client")
        local = th.Toki([llama], name="nul-local")
        server = th.Toki([llama], extra=["--tokenize", "server"], name="nul-server")
        try:
            st, alone = th.request(llama.port, "POST", "/v1/chat/completions", body)
            self.assertEqual(st, 200, alone)
            n = alone["usage"]["prompt_tokens"]
            wait_prompts(local)
            for toki in (local, server):
                answers = []
                for extra in ({}, {}, {"cache_prompt": False}):
                    st, r = th.request(toki.port, "POST", "/v1/chat/completions",
                                       dict(body, **extra))
                    self.assertEqual(st, 200, r)
                    self.assertEqual(r["usage"]["prompt_tokens"], n, r)
                    answers.append(r["choices"][0]["logprobs"])
                self.assertEqual(answers[1:], answers[:2])
                # No count toki disagreed with the server on.
                self.assertNotIn("prompt tokens, toki", toki.log_text())
            # Each was templated where asked: toki, or the server.
            p = local.stats()["backends"][0]["prompts"]
            self.assertEqual((p["local"], p["server"], p["mismatches"]), (3, 0, 0), p)
            p = server.stats()["backends"][0]["prompts"]
            self.assertEqual((p["local"], p["server"]), (0, 3), p)

            # The same conversation as an Anthropic request and a Responses
            # one: the prompt the chat request had, NULs and all.
            st, r = th.request(local.port, "POST", "/v1/messages", {
                "system": "You read \x00 files.", "max_tokens": 4, "temperature": 0,
                "tools": [{"name": "cat", "input_schema": tool["function"]["parameters"]}],
                "messages": [
                    {"role": "user", "content": "Read a\x00b."},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "c1",
                                                       "name": "cat",
                                                       "input": {"f": "a\x00b"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1",
                                                  "content": "\x7fELF\x02\x00\x00"}]}]})
            self.assertEqual(st, 200, r)
            self.assertEqual(r["cache"]["prompt_tokens"], n, r)
            st, r = th.request(local.port, "POST", "/v1/responses", {
                "instructions": "You read \x00 files.", "max_output_tokens": 4,
                "temperature": 0, "tools": [dict(tool["function"], type="function")],
                "input": [
                    {"role": "user", "content": "Read a\x00b."},
                    {"type": "function_call", "call_id": "c1", "name": "cat",
                     "arguments": '{"f": "a\\u0000b"}'},
                    {"type": "function_call_output", "call_id": "c1",
                     "output": "\x7fELF\x02\x00\x00"}]})
            self.assertEqual(st, 200, r)
            self.assertEqual(r["cache"]["prompt_tokens"], n, r)
        finally:
            local.kill(signal.SIGTERM)
            server.kill(signal.SIGTERM)
            llama.kill()


class SeveralCompletions(unittest.TestCase):
    """A request for several completions (`n`): llama-server runs the others
    on slots of its own choice, which toki does not pin. Exact mode keeps
    every answer the uncached one: the request's completions are
    llama-server alone's, and a conversation whose slot a completion took
    gets its uncached answer next (toki's check of the server's reuse
    catches the slot it held wrong)."""

    def test_n_2(self):
        llama = th.LlamaServer(model=th.generated_model("several", params="1M", ctx=4096),
                               slots=2, ctx=2048, name="several")
        a = [{"role": "user", "content": "Once upon a time"}]
        b = [{"role": "system", "content": "You tell long stories about dogs."},
             {"role": "user", "content": "Tell me one"}]
        several = dict(n=2, temperature=0.8, seed=3, max_tokens=8, logprobs=True)
        try:
            st, alone = th.request(llama.port, "POST", "/v1/chat/completions",
                                   dict(several, messages=a))
            self.assertEqual((st, len(alone["choices"])), (200, 2), alone)
            toki = th.Toki([llama], mode="exact")
            try:
                st, first = toki.chat(b, max_tokens=8, logprobs=True)
                self.assertEqual(st, 200, first)
                st, r = toki.chat(a, **several)
                self.assertEqual(st, 200, r)
                self.assertEqual([c["message"]["content"] for c in r["choices"]],
                                 [c["message"]["content"] for c in alone["choices"]])
                self.assertEqual([c["logprobs"] for c in r["choices"]],
                                 [c["logprobs"] for c in alone["choices"]])
                # The other completion ran on the slot that held b.
                st, again = toki.chat(b, max_tokens=8, logprobs=True)
                self.assertEqual(st, 200, again)
                self.assertNotEqual(again["cache"]["route"], "hit", again["cache"])
                st, ref = toki.chat(b, max_tokens=8, logprobs=True, cache_prompt=False)
                self.assertEqual(st, 200, ref)
                for got in (first, again):
                    self.assertEqual(got["choices"][0]["logprobs"], ref["choices"][0]["logprobs"])
            finally:
                toki.kill(signal.SIGTERM)
        finally:
            llama.kill()


class LoraScales(unittest.TestCase):
    """A request with adapter scales of its own (`lora`), on a server with a
    LoRA adapter (tests/integration/lora_adapter.py's, on a generated
    model). llama-server reuses a slot's rows whatever scales computed
    them, so in exact mode such a request reuses nothing, computes every
    row with its scales, and leaves no row for a later request to reuse.
    Before, a plain request after it was a hit on rows of the other scales,
    and its answer was not its uncached one."""

    def test_rows_of_other_scales_are_never_reused(self):
        sys.path.insert(0, os.path.dirname(__file__))
        import lora_adapter
        model = th.generated_model("lora", params="1M", ctx=4096)
        adapter = lora_adapter.write(os.path.join(th.WORK_DIR, "lora-1M.gguf"), 128, 2)
        llama = th.LlamaServer(model=model, slots=2, ctx=2048, name="lora",
                               extra=["--lora", adapter])
        msgs = [{"role": "system", "content": "You are a storyteller. " * 10},
                {"role": "user", "content": "Once upon a time"}]
        own = [{"id": 0, "scale": 0.3}]  # the server's own is 1.0
        kw = dict(max_tokens=8, logprobs=True, top_logprobs=2)
        try:
            toki = th.Toki([llama], mode="exact")
            try:
                def ask(**extra):
                    st, r = toki.chat(msgs, **kw, **extra)
                    self.assertEqual(st, 200, r)
                    return r["choices"][0]["logprobs"], r["cache"]
                plain, _ = ask()
                scaled, cache = ask(lora=own)
                self.assertEqual((cache["route"], cache["cached"]), ("miss", 0), cache)
                scaled_ref, _ = ask(lora=own, cache_prompt=False)
                after, _ = ask()
                plain_ref, _ = ask(cache_prompt=False)
                self.assertNotEqual(scaled_ref, plain_ref)  # the scales matter here
                self.assertEqual(scaled, scaled_ref)
                self.assertEqual(after, plain_ref)
                self.assertEqual(plain, plain_ref)
            finally:
                toki.kill(signal.SIGTERM)
        finally:
            llama.kill()


class ServerScales(unittest.TestCase):
    """The server's own adapter scales, which every request without a `lora`
    of its own is computed with: changed through toki (POST /lora-adapters)
    or between two runs. llama-server reuses a slot's rows, restores a saved
    state and loads its RAM cache by tokens alone, whatever scales computed
    them; llama-server alone answers a prompt it holds with rows of the old
    scales. Through toki in exact mode, every answer after a change is the
    uncached one of the new scales."""

    MSGS = [{"role": "system", "content": "You are a storyteller. " * 120},
            {"role": "user", "content": "Once upon a time"}]
    KW = dict(max_tokens=8, logprobs=True, top_logprobs=2)

    def setUp(self):
        import lora_adapter
        self.dir = tempfile.mkdtemp(prefix="toki-lora-")
        self.model = th.generated_model("lora", params="1M", ctx=4096)
        self.adapter = lora_adapter.write(os.path.join(th.WORK_DIR, "lora-1M.gguf"), 128, 2)
        self.procs = []

    def tearDown(self):
        for p in reversed(self.procs):
            p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, adapter_args, idle_ms=100, mode="exact"):
        llama = th.LlamaServer(model=self.model, slots=2, ctx=2048, name="lora",
                               extra=adapter_args + ["--slot-save-path", self.dir])
        self.procs.append(llama)
        toki = th.Toki([llama], mode=mode,
                       extra=["--slot-dir", self.dir, "--slot-save-idle-ms", str(idle_ms)])
        self.procs.append(toki)
        return llama, toki

    def ask(self, toki, msgs=None, **extra):
        st, r = toki.chat(msgs or self.MSGS, **self.KW, **extra)
        self.assertEqual(st, 200, r)
        self.answer = r["choices"][0]["message"]["content"]
        return r["choices"][0]["logprobs"], r["cache"]

    def wait_idle_saved(self, toki, saves):
        deadline = time.time() + 30
        while True:
            st = toki.stats()
            if st["saves"] >= saves and not any(s["busy"] for b in st["backends"]
                                                for s in b["slots"]):
                return st
            self.assertLess(time.time(), deadline, f"no idle save: {st}")
            time.sleep(0.1)

    def test_a_change_of_scales_through_toki(self):
        llama, toki = self.start(["--lora", self.adapter])
        before, _ = self.ask(toki)
        self.wait_idle_saved(toki, 1)
        discoveries = toki.stats()["backends"][0]["discoveries"]
        # While a request runs, a change would give it either scales: refused.
        conn = http.client.HTTPConnection("127.0.0.1", toki.port, timeout=60)
        conn.request("POST", "/v1/chat/completions", headers={
            "Authorization": "Bearer " + th.TEST_TOKEN, "Content-Type": "application/json"},
            body=json.dumps({"messages": HELLO, "max_tokens": 4000, "ignore_eos": True,
                             "stream": True}))
        resp = conn.getresponse()
        while not resp.readline().startswith(b"data:"):  # its first token: it runs
            pass
        st, r = th.request(toki.port, "POST", "/lora-adapters", [{"id": 0, "scale": 0.3}])
        self.assertEqual(st, 409, r)
        self.assertIn("a request is running", r["error"]["message"])
        conn.close()
        # The stream's slot is busy until its cancel settles, and then while
        # its idle save runs: a change waits for both (409 meanwhile).
        deadline = time.time() + 30
        while True:
            st, r = th.request(toki.port, "POST", "/lora-adapters", [{"id": 0, "scale": 0.3}])
            if st != 409 or time.time() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual((st, r), (200, {"success": True}))
        st, r = th.request(toki.port, "GET", "/lora-adapters")
        self.assertEqual(st, 200, r)
        self.assertAlmostEqual(r[0]["scale"], 0.3, places=5)
        # The backend was found again, its states of the old scales dropped.
        after, cache = self.ask(toki)
        stats = toki.stats()
        self.assertGreater(stats["backends"][0]["discoveries"], discoveries)
        self.assertNotEqual(cache["route"], "disk", cache)
        self.assertGreaterEqual(stats["discarded_files"], 1, stats)
        ref, _ = self.ask(toki, cache_prompt=False)
        self.assertNotEqual(before, ref)  # the scales matter here
        self.assertEqual(after, ref)
        self.assertIn("made under other settings", toki.log_text())

    def test_saved_states_of_other_scales_are_not_restored(self):
        """In fast mode, where the fingerprint is all that keeps them apart
        (exact mode's self-test bits differ too)."""
        llama, toki = self.start(["--lora", self.adapter], idle_ms=0, mode="fast")
        self.ask(toki)
        turn = self.MSGS + [{"role": "assistant", "content": self.answer},
                            {"role": "user", "content": "And then?"}]
        toki.kill(signal.SIGTERM)  # its shutdown saves the slots
        self.assertIn("shutdown: saving", toki.log_text())
        self.assertTrue([f for f in os.listdir(self.dir) if f.startswith("toki-")])
        llama.kill()
        # The next run: the same model and adapter at another scale, and the
        # conversation's next turn, which the saved state begins.
        llama, toki = self.start(["--lora-scaled", self.adapter + ":0.3"], idle_ms=0, mode="fast")
        after, cache = self.ask(toki, turn)
        self.assertNotEqual(cache["route"], "disk", cache)
        self.assertIn("does not match this backend", toki.log_text())
        ref, _ = self.ask(toki, turn, cache_prompt=False)
        self.assertEqual(after, ref)
        # At the first run's scale the state is restored: the test can fail.
        toki.kill(signal.SIGTERM)
        llama.kill()
        shutil.rmtree(self.dir)
        os.mkdir(self.dir)
        llama, toki = self.start(["--lora", self.adapter], idle_ms=0, mode="fast")
        self.ask(toki)
        toki.kill(signal.SIGTERM)
        llama.kill()
        llama, toki = self.start(["--lora", self.adapter], idle_ms=0, mode="fast")
        _, cache = self.ask(toki, turn)
        self.assertEqual(cache["route"], "disk", cache)


class AnotherClient(unittest.TestCase):
    """The user's server has another client while toki's self-test runs (an
    agent still pointed at it when toki starts). Its request beside the
    test's gives other bits, and one on the test's slot other cache counts:
    before, the verdict was then "failed" or "unknown" for as long as toki
    ran, and with it exact mode's schedule and answers. Now a try that saw
    another client's task is run again once no slot runs one, and its
    verdict is a clean start's. slow_backend.py plays the other client on
    the real server (mode intrude), at the moment that matters."""

    @classmethod
    def setUpClass(cls):
        # --context-shift: the other client's stream runs until it leaves.
        cls.llama = th.LlamaServer(slots=2, ctx=1024, name="another-client",
                                   extra=["--context-shift"])
        cls.state = tempfile.mkdtemp(prefix="toki-another-")
        clean = th.Toki([cls.llama], env={"TOKI_STATE_DIR": cls.state}, name="clean")
        try:
            cls.clean = wait_exact(clean)
        finally:
            clean.kill(signal.SIGTERM)
        assert cls.clean["selftest"] == "verified" and cls.clean["steps"], cls.clean

    @classmethod
    def tearDownClass(cls):
        cls.llama.kill()
        shutil.rmtree(cls.state, ignore_errors=True)

    def start(self, intrusions, where="other", hold=False):
        self.proxy = SlowBackend(self.llama.url, mode="intrude")
        self.proxy.intrusions, self.proxy.intrude_slot = intrusions, where
        self.proxy.intrude_hold = hold
        self.toki = th.Toki([self.proxy], env={"TOKI_STATE_DIR": self.state}, wait=False)

    def tearDown(self):
        self.toki.kill(signal.SIGTERM)
        self.proxy.release()
        self.proxy.close()

    def assert_like_a_clean_start(self, exact, first):
        self.assertEqual((exact["selftest"], exact["steps"], exact["tries"]),
                         ("verified", True, 2), exact)
        self.assertIn(first, exact["first_try"])
        self.assertEqual(exact["bits"], self.clean["bits"])

    def test_a_request_beside_the_test(self):
        self.start(1, hold=True)
        # The stream still runs: the second try waits for it to end.
        self.toki.wait_log("the self-test waits until no slot runs a task")
        self.proxy.release()
        exact = wait_exact(self.toki)
        self.assert_like_a_clean_start(exact, "another client's request ran on slot")
        self.assertIn("it runs again once no slot runs a task", self.toki.log_text())

    def test_a_request_on_the_tests_slot(self):
        self.start(1, where="same")
        exact = wait_exact(self.toki)
        self.assert_like_a_clean_start(exact, "reused")
        self.assertEqual(len(self.proxy.intruded), 1)

    def test_another_client_at_both_tries(self):
        self.start(2)
        exact = wait_exact(self.toki)
        self.assertEqual((exact["selftest"], exact["steps"], exact["tries"]),
                         ("unknown", False, 2), exact)
        self.assertIn("another client's request ran on slot", exact["verdict"])
        self.assertIn("the first ended early: another client's", self.toki.log_text())


def wait_exact(toki, timeout=60):
    """The backend's exact object once its self-test has ended."""
    th.wait_http(toki.port, timeout=timeout)
    deadline = time.time() + timeout
    while True:
        b = toki.stats()["backends"][0]
        # "off" before discovery reaches the test.
        if b["exact"]["selftest"] not in ("running", "off"):
            return b["exact"]
        if time.time() > deadline:
            raise AssertionError(f"the self-test did not end: {b}")
        time.sleep(0.05)


class SlotSavePathOnly(unittest.TestCase):
    """Item 10: a server started with --slot-save-path, toki without
    --slot-dir. toki cannot see that folder, but the server saves and
    restores by name: toki saves the conversations it evicts there, under a
    bounded set of names, and restores them when they come back; the answer
    is still the uncached one (exact mode). On main toki never saved."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="toki-server-slots-")
        self.llama = th.LlamaServer(slots=1, extra=["--slot-save-path", self.dir])
        # A cap of 1 MiB: about one of these states (stories260K, ~300 tokens).
        self.toki = th.Toki([self.llama], extra=["--slot-disk-mb", "1"])

    def tearDown(self):
        self.toki.kill(signal.SIGTERM)
        self.llama.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def conversation(self, i):
        return [{"role": "system", "content": f"Story {i}: Lily and her dog Max, day {i}. " * 30},
                {"role": "user", "content": "Tell me a story about Lily."}]

    def test_evicted_conversations_come_back_from_the_servers_folder(self):
        self.toki.wait_log("has a --slot-save-path")
        st, first = self.toki.chat(self.conversation(0), max_tokens=4, logprobs=True)
        self.assertEqual(st, 200, first)
        saves = 0
        # Each new conversation takes the only slot: the one before is saved.
        for i in range(1, 6):
            st, r = self.toki.chat(self.conversation(i), max_tokens=4)
            self.assertEqual(st, 200, r)
            saves += 1
            deadline = time.time() + 30
            while self.toki.stats()["saves"] < saves:
                self.assertLess(time.time(), deadline, self.toki.log_text())
                time.sleep(0.02)
        # The last conversation comes back: restored, not recomputed.
        st, again = self.toki.chat(self.conversation(4), max_tokens=4, logprobs=True)
        self.assertEqual(st, 200, again)
        self.assertEqual(again["cache"]["route"], "disk", again["cache"])
        self.assertRegex(again["cache"]["restored"], r"^toki-[0-9a-f]+-n[0-9]+$")
        st, raw = self.toki.chat(self.conversation(4), max_tokens=4, logprobs=True,
                                 cache_prompt=False)
        self.assertEqual(st, 200, raw)
        self.assertEqual(again["choices"][0], raw["choices"][0])
        # Six saves, within the cap: names were used again, and the folder
        # holds no more than the cap and the one state that may overrun it.
        files = sorted(os.listdir(self.dir))
        sizes = [os.path.getsize(os.path.join(self.dir, f)) for f in files]
        self.assertLess(len(files), 6, files)
        self.assertLessEqual(sum(sizes), (1 << 20) + max(sizes), list(zip(files, sizes)))
        for f in files:
            self.assertRegex(f, r"^toki-[0-9a-f]+-n[0-9]+\.bin$")


class Cors(unittest.TestCase):
    """Item 5: browsers' preflights, answered as llama-server answers them."""

    ORIGIN = "http://localhost:5173"

    @classmethod
    def setUpClass(cls):
        cls.llama = th.LlamaServer(slots=1)
        cls.toki = th.Toki([cls.llama])

    @classmethod
    def tearDownClass(cls):
        cls.toki.kill()
        cls.llama.kill()

    def test_preflight_like_llama_server(self):
        pre = {"Origin": self.ORIGIN, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization, content-type"}
        names = ("access-control-allow-origin", "access-control-allow-credentials",
                 "access-control-allow-methods", "access-control-allow-headers")
        for path in ("/v1/chat/completions", "/anthropic/v1/messages", "/toki/stats"):
            with self.subTest(path=path):
                st_l, h_l, _ = raw(self.llama.port, "OPTIONS", path, pre)
                st_t, h_t, body = raw(self.toki.port, "OPTIONS", path, pre)  # no token
                self.assertEqual(st_l, 200)
                self.assertEqual(st_t, 200, body)
                self.assertEqual(h_t["access-control-allow-origin"], self.ORIGIN)
                self.assertEqual({n: h_t.get(n) for n in names},
                                 {n: h_l.get(n) for n in names})

    def test_answers_carry_the_origin_and_still_need_the_token(self):
        token = {"Authorization": "Bearer " + th.TEST_TOKEN}
        body = json.dumps({"messages": HELLO, "max_tokens": 2})
        hdr = dict(token, Origin=self.ORIGIN, **{"Content-Type": "application/json"})
        st, h, data = raw(self.toki.port, "POST", "/v1/chat/completions", hdr, body)
        self.assertEqual(st, 200, data)
        self.assertEqual(h["access-control-allow-origin"], self.ORIGIN)
        # Without the token: refused, readable by the page that asked.
        st, h, _ = raw(self.toki.port, "POST", "/v1/chat/completions",
                       {"Origin": self.ORIGIN, "Content-Type": "application/json"}, body)
        self.assertEqual(st, 401)
        self.assertEqual(h["access-control-allow-origin"], self.ORIGIN)
        # An OPTIONS that is not a preflight is a request like any other.
        st, _, _ = raw(self.toki.port, "OPTIONS", "/v1/chat/completions", {"Origin": self.ORIGIN})
        self.assertEqual(st, 401)
        # No Origin, no CORS header (same-origin and non-browser clients).
        st, h, _ = raw(self.toki.port, "GET", "/v1/models", token)
        self.assertEqual(st, 200)
        self.assertNotIn("access-control-allow-origin", h)


class NoJinja(unittest.TestCase):
    """Item 9: the start-up probes send a --no-jinja server only what it takes."""

    def test_probes_leave_no_error_in_the_server_log(self):
        llama = th.LlamaServer(slots=1, extra=["--no-jinja"], name="nojinja")
        toki = th.Toki([llama])
        try:
            prompts = wait_prompts(toki)
            self.assertTrue(prompts["local_template"], prompts)
            log = llama.log_text()
            self.assertNotIn("tools param requires --jinja", log)
            self.assertNotIn("got exception", log)
        finally:
            toki.kill()
            llama.kill()


class Managed(unittest.TestCase):
    """Items 2 and 12 in managed runs: `toki up --model NAME|FILE`."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="toki-compat-")
        self.env = dict(os.environ, TOKI_STATE_DIR=os.path.join(self.tmp, "state"),
                        TOKI_MODEL_REGISTRY=os.path.join(self.tmp, "models.yaml"),
                        TOKI_LLAMA_SERVER=th.llama_server_path())
        self.env.pop("TOKI_TOKEN", None)
        self.model = th.test_model()  # stories260K: trained on 2048 tokens

    def tearDown(self):
        self.toki("down")
        shutil.rmtree(self.tmp, ignore_errors=True)

    def toki(self, *args):
        return subprocess.run([th.TOKI_BIN, *args], capture_output=True, text=True,
                              env=self.env, timeout=120)

    def token(self):
        return open(os.path.join(self.env["TOKI_STATE_DIR"], "token")).read().strip()

    def test_context_override_in_registry_args(self):
        with open(self.env["TOKI_MODEL_REGISTRY"], "w") as f:
            f.write("models:\n  tiny:\n    path: %s\n    ctx: 8192\n"
                    "    args: [\"--override-kv\", \"llama.context_length=int:65536\"]\n"
                    % self.model)
        port = th.free_port()
        r = self.toki("up", "--model", "tiny", "--port", str(port), "--slots", "1",
                      "--wait", "60")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("context 8192 tokens per slot", r.stderr)
        self.assertIn("from --override-kv llama.context_length=int:65536", r.stderr)
        auth = {"Authorization": "Bearer " + self.token()}
        st, models = th.request(port, "GET", "/v1/models", headers=auth, auth=False)
        self.assertEqual(models["data"][0]["context_length"], 8192)

    def test_rope_scale_in_up_args(self):
        # 2048 stretched twice is 4096: more than that is still refused,
        # naming the argument it counted.
        r = self.toki("up", "--model", self.model, "--ctx", "8192", "--port",
                      str(th.free_port()), "--", "--rope-scale", "2")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("trained on 4096 (with --rope-scale 2)", r.stderr)

    def test_kv_settings_in_up_args(self):
        """The settings that shape the KV go into the saved states'
        fingerprint as llama-server reads them: underscores are dashes, a
        flag without a value takes none (it took the next argument before,
        and the value of that one was lost)."""
        port = th.free_port()
        # And from the environment the server inherits.
        self.env["LLAMA_ARG_YARN_BETA_FAST"] = "32"
        r = self.toki("up", "--model", self.model, "--ctx", "512", "--slots", "1", "--port",
                      str(port), "--wait", "30", "--", "--swa-full", "--rope_freq_base",
                      "10000", "-fa", "off", "--api_key", KEY)
        self.assertEqual(r.returncode, 0, r.stderr)
        log = self.toki("logs").stdout
        self.assertIn('"kv_settings":"ctx=512 --swa-full --rope-freq-base 10000 -fa off '
                      'LLAMA_ARG_YARN_BETA_FAST=32"', log)
        # The key, with an underscore too, is the one toki sends.
        auth = {"Authorization": "Bearer " + self.token()}
        st, resp = th.request(port, "POST", "/v1/chat/completions",
                              {"messages": HELLO, "max_tokens": 2}, headers=auth, auth=False)
        self.assertEqual(st, 200, resp)

    def test_layers_where_llama_server_puts_them(self):
        """Unasked (no -ngl), llama-server b11669 puts every layer that fits
        on the GPUs it lists (its -ngl default is "auto"): the context is
        sized against their free memory, as with -ngl. The stand-in answers
        --help and --list-devices as a CUDA build on an H100 does and runs
        the real server otherwise. -ngl 0, or a build that lists no device
        (the CPU one), is sized against RAM."""
        fake = os.path.join(self.tmp, "llama-server")
        real = th.llama_server_path()
        with open(fake, "w") as f:
            f.write("#!/bin/sh\ncase \"$1\" in\n"
                    "--help) exec %s --help ;;\n"
                    "--list-devices) printf 'Available devices:\\n  CUDA0: NVIDIA H100 80GB HBM3 "
                    "(81559 MiB, 80000 MiB free)\\n' ;;\n"
                    "*) exec %s \"$@\" ;;\nesac\n" % (real, real))
        os.chmod(fake, 0o755)

        def up(server, *args):
            self.env["TOKI_LLAMA_SERVER"] = server
            r = self.toki("up", "--model", self.model, "--ctx", "512", "--slots", "1", "--port",
                          str(th.free_port()), "--wait", "30", *args)
            self.toki("down")
            self.assertEqual(r.returncode, 0, r.stderr)
            return r.stderr

        self.assertIn("of 78.1 GiB of free VRAM", up(fake))
        self.assertIn("available", up(fake, "--", "-ngl", "0"))
        self.assertNotIn("VRAM", up(real))

    def test_api_key_in_up_args(self):
        port = th.free_port()
        r = self.toki("up", "--model", self.model, "--ctx", "512", "--slots", "1", "--port",
                      str(port), "--wait", "30", "--", "--api-key", KEY)
        self.assertEqual(r.returncode, 0, r.stderr)
        auth = {"Authorization": "Bearer " + self.token()}
        st, resp = th.request(port, "POST", "/v1/chat/completions",
                              {"messages": HELLO, "max_tokens": 2}, headers=auth, auth=False)
        self.assertEqual(st, 200, resp)


if __name__ == "__main__":
    th.run_tests()
