"""`toki serve` against a real llama-server: routing, the cache block,
streaming, pass-through routes, and every error the issue names."""
import json
import os
import signal
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th

SYSTEM_A = ("You are a careful assistant who tells long stories about a small cat named Tom "
            "and his friend the big brown dog who lives by the river. ") * 3
SYSTEM_B = ("You are a helpful helper who answers questions about the sun, the moon, the trees "
            "and the birds in the park near the old house. ") * 3


class ServeCore(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.llama = th.LlamaServer(slots=2, ctx=2048)
        cls.toki = th.Toki([cls.llama], mode="fast")

    @classmethod
    def tearDownClass(cls):
        cls.toki.kill(signal.SIGTERM)
        cls.llama.kill()

    def chat(self, messages, **kw):
        st, body = self.toki.chat(messages, **kw)
        self.assertEqual(st, 200, body)
        return body

    def test_back_to_back_streams_on_one_connection(self):
        """llama-server closes a keep-alive connection after a streamed
        response without saying so; toki's next request on that pooled
        connection meets EOF. toki must send it again on a new connection,
        not answer 502 and mark the backend down (before the fix, 8 of 60 in a row passed, sometimes all)."""
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", self.toki.port, timeout=60)
        statuses = []
        for i in range(200):
            body = json.dumps({"messages": [{"role": "user", "content": f"Tell me a story number {i % 3}"}],
                               "max_tokens": 8, "stream": True})
            conn.request("POST", "/v1/chat/completions", body, th._auth_headers(None, True))
            r = conn.getresponse()
            data = r.read()
            statuses.append(r.status if b"[DONE]" in data else (r.status, data[:120]))
        conn.close()
        self.assertEqual(statuses, [200] * 200)
        self.assertTrue(all(b["up"] for b in self.toki.stats()["backends"]))

    def test_more_clients_than_slots_all_get_answers(self):
        """24 streaming clients at once on 2 slots, with llama-server's
        default HTTP thread pool: requests wait for a slot and each one is
        woken when a slot ends. Before the fix, requests waiting for a slot
        were woken only when a request failed, and every backend call had a
        connection of its own: 64 clients stalled with 16 answers."""
        results = []

        def client(k):
            for j in range(2):
                try:
                    st, events = th.stream(self.toki.port, "/v1/chat/completions", {
                        "messages": [{"role": "user", "content": f"Client {k} asks {j}: why?"}],
                        "max_tokens": 8, "stream": True}, timeout=60)
                    results.append(st == 200 and any("[DONE]" in e for e in events))
                except Exception as e:  # a timeout is the failure this test is about
                    results.append(repr(e))
        threads = [threading.Thread(target=client, args=(k,)) for k in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        self.assertEqual(results, [True] * 48)
        stats = self.toki.stats()
        self.assertEqual(stats["waiting"], 0)
        self.assertTrue(all(b["up"] for b in stats["backends"]))

    def test_a_client_of_llama_server_itself_does_not_take_the_backend_down(self):
        """Someone else uses the backend directly and overwrites a slot toki
        knows with a shorter prompt. The health check used to read that as
        a restart: backend down, every slot forgotten, 503 for whoever asked
        meanwhile. Now only that slot is forgotten."""
        msgs = [{"role": "system", "content": SYSTEM_A},
                {"role": "user", "content": "Tell me about the dog."}]
        r = self.chat(msgs, max_tokens=4)
        slot = r["cache"]["slot"]
        before = self.toki.stats()["backends"][0]["discoveries"]
        st, _ = th.request(self.llama.port, "POST", "/completion",
                           {"prompt": "Hi", "n_predict": 1, "id_slot": slot}, auth=False)
        self.assertEqual(st, 200)
        time.sleep(3)  # a health check (every 2 s) sees it
        stats = self.toki.stats()
        self.assertTrue(stats["backends"][0]["up"])
        self.assertEqual(stats["backends"][0]["discoveries"], before)
        r2 = self.chat(msgs, max_tokens=4)
        self.assertNotEqual(r2["cache"]["route"], "hit", "that slot holds something else now")
        self.assertEqual(r2["cache"]["evaluated"], r2["timings"]["prompt_n"])

    def test_a_client_pinned_slot_is_busy_for_the_router(self):
        """A request that names id_slot goes to that slot as it is; while it
        runs, the router must count the slot as busy. It did not: a routed
        request could be sent to wait behind a long pinned stream while the
        other slot was free (seen in test_faults with the generated model)."""
        # One slot holds a routed conversation; the other one, pinned below,
        # then looks empty to the router (a pinned slot's content is unknown).
        msgs = [{"role": "system", "content": SYSTEM_B},
                {"role": "user", "content": "Pinned test, keep this."}]
        held = self.chat(msgs, max_tokens=4)["cache"]["slot"]
        pin = 1 - held
        results = {}

        def pinned():
            results["pinned"] = th.stream(self.toki.port, "/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Tell me a long story"}],
                "max_tokens": 1500, "ignore_eos": True, "temperature": 0, "stream": True,
                "id_slot": pin}, timeout=120)
        t = threading.Thread(target=pinned)
        t.start()
        try:
            deadline = time.time() + 10
            while time.time() < deadline:  # until the pinned stream runs
                if any(s["is_processing"] for s in th.request(self.llama.port, "GET", "/slots",
                                                               auth=False)[1] if s["id"] == pin):
                    break
                time.sleep(0.02)
            t0 = time.time()
            r = self.chat([{"role": "user", "content": "A one-off question while the pin runs"}],
                          max_tokens=4)
            waited = time.time() - t0
            self.assertEqual(r["cache"]["slot"], held, r["cache"])
            self.assertTrue(t.is_alive(), "the pinned stream ended before the routed request")
            self.assertLess(waited, 5)
        finally:
            t.join(120)
        self.assertEqual(results["pinned"][0], 200)
        self.assertFalse(any(s["busy"] for b in self.toki.stats()["backends"]
                             for s in b["slots"]), "the pinned slot was not released")

    def test_conversations_return_to_their_slot(self):
        a1 = [{"role": "system", "content": SYSTEM_A}, {"role": "user", "content": "Hello"}]
        b1 = [{"role": "system", "content": SYSTEM_B}, {"role": "user", "content": "Why?"}]
        ra = self.chat(a1)
        rb = self.chat(b1)
        self.assertNotEqual(ra["cache"]["slot"], rb["cache"]["slot"],
                            "a second conversation must not evict the first while a slot is free")
        a2 = a1 + [ra["choices"][0]["message"], {"role": "user", "content": "And then?"}]
        ra2 = self.chat(a2)
        c = ra2["cache"]
        self.assertEqual(c["slot"], ra["cache"]["slot"])
        self.assertEqual(c["route"], "hit")
        self.assertEqual(c["prompt_tokens"], ra2["usage"]["prompt_tokens"])
        # Every token of turn 1's prompt was reused: only the new suffix was evaluated.
        self.assertGreaterEqual(ra2["timings"]["cache_n"], ra["cache"]["prompt_tokens"])
        self.assertEqual(c["cached"], ra2["timings"]["cache_n"])
        self.assertEqual(c["evaluated"], ra2["timings"]["prompt_n"])
        self.assertLessEqual(ra2["timings"]["prompt_n"],
                             c["prompt_tokens"] - ra["cache"]["prompt_tokens"])
        # The same for B, interleaved.
        b2 = b1 + [rb["choices"][0]["message"], {"role": "user", "content": "Tell me more."}]
        rb2 = self.chat(b2)
        self.assertEqual(rb2["cache"]["slot"], rb["cache"]["slot"])
        self.assertGreaterEqual(rb2["timings"]["cache_n"], rb["cache"]["prompt_tokens"])

    def test_response_is_the_backends_plus_cache(self):
        msgs = [{"role": "user", "content": "Once upon a time"}]
        st, direct = th.request(self.llama.port, "POST", "/v1/chat/completions",
                                {"messages": msgs, "temperature": 0, "max_tokens": 12,
                                 "cache_prompt": False})
        got = self.chat(msgs, max_tokens=12)
        self.assertIn("cache", got)
        for key in ("choices", "usage", "object", "model", "timings"):
            self.assertIn(key, got)
        self.assertEqual(got["choices"][0]["message"]["content"],
                         direct["choices"][0]["message"]["content"])
        self.assertEqual(set(got["cache"]) >= {"backend", "slot", "matched", "prompt_tokens",
                                               "route", "mode"}, True)
        self.assertEqual(got["cache"]["backend"], self.llama.url)
        self.assertEqual(got["cache"]["mode"], "fast")

    def test_stream_carries_cache_in_last_chunk(self):
        msgs = [{"role": "user", "content": "The little dog"}]
        st, events = th.stream(self.toki.port, "/v1/chat/completions",
                               {"messages": msgs, "temperature": 0, "max_tokens": 10,
                                "stream": True})
        self.assertEqual(st, 200)
        # First event: a comment with the prefill estimate.
        self.assertTrue(events[0].startswith(": toki "), events[0])
        self.assertIn("est_prefill_ms=", events[0])
        self.assertEqual(events[-1].strip(), "data: [DONE]")
        last = th.event_json(events[-2])
        self.assertIn("cache", last)
        self.assertIn("timings", last)
        self.assertEqual(last["cache"]["evaluated"], last["timings"]["prompt_n"])
        # No other chunk carries it.
        for ev in events[1:-2]:
            j = th.event_json(ev)
            if j:
                self.assertNotIn("cache", j)
        # Streamed text equals the non-streamed text at temperature 0.
        body = self.chat(msgs, max_tokens=10)
        self.assertEqual(th.stream_text(events), body["choices"][0]["message"]["content"])

    def test_completions_route(self):
        body = {"prompt": "Once upon a time there was", "max_tokens": 8, "temperature": 0}
        st, r1 = th.request(self.toki.port, "POST", "/v1/completions", body)
        self.assertEqual(st, 200, r1)
        self.assertIn("cache", r1)
        st, r2 = th.request(self.toki.port, "POST", "/v1/completions", body)
        self.assertEqual(r2["cache"]["slot"], r1["cache"]["slot"])
        self.assertEqual(r2["cache"]["route"], "hit")
        self.assertEqual(r2["timings"]["prompt_n"], 1)
        # Token-id prompts are routed as they are.
        st, tok = th.request(self.toki.port, "POST", "/tokenize",
                             {"content": "Once upon a time there was", "add_special": True})
        st, r3 = th.request(self.toki.port, "POST", "/completion",
                            {"prompt": tok["tokens"], "n_predict": 4, "temperature": 0})
        self.assertEqual(st, 200, r3)
        self.assertEqual(r3["cache"]["prompt_tokens"], len(tok["tokens"]))
        self.assertEqual(r3["cache"]["route"], "hit")

    def test_passthrough_routes(self):
        st, tok = th.request(self.toki.port, "POST", "/tokenize", {"content": "Hello world"})
        self.assertEqual(st, 200)
        self.assertTrue(tok["tokens"])
        st, det = th.request(self.toki.port, "POST", "/detokenize", {"tokens": tok["tokens"]})
        self.assertEqual(st, 200)
        self.assertIn("Hello", det["content"])
        st, props = th.request(self.toki.port, "GET", "/props")
        self.assertEqual(props["total_slots"], 2)
        st, slots = th.request(self.toki.port, "GET", "/slots")
        self.assertEqual(len(slots), 2)
        st, models = th.request(self.toki.port, "GET", "/v1/models")
        self.assertEqual(st, 200)
        self.assertTrue(models["data"][0]["id"])
        st, h = th.request(self.toki.port, "GET", "/health")
        self.assertEqual((st, h["status"]), (200, "ok"))

    def test_bad_input_gets_openai_errors(self):
        p = self.toki.port
        cases = [
            ("POST", "/v1/chat/completions", "{not json", 400),
            ("POST", "/v1/chat/completions", "[1,2]", 400),
            ("POST", "/v1/chat/completions", json.dumps({"messages": "hi"}), 400),
            ("POST", "/v1/chat/completions", json.dumps({"messages": []}), 400),
            ("POST", "/v1/chat/completions",
             json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}), 400),
            ("POST", "/v1/chat/completions",
             json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}), 400),
            ("POST", "/v1/completions", json.dumps({"prompt": 5}), 400),
            ("POST", "/v1/completions", json.dumps({}), 400),
            ("GET", "/v1/chat/completions", None, 405),
            ("GET", "/v1/nothing-here", None, 404),
            ("POST", "/admin", "{}", 404),
        ]
        for method, path, body, want in cases:
            st, err = th.request(p, method, path, body)
            self.assertEqual(st, want, (method, path, body, err))
            self.assertIsInstance(err, dict, err)
            self.assertIn("message", err["error"])
            self.assertIn("type", err["error"])
        # Still serving.
        self.chat([{"role": "user", "content": "ok"}], max_tokens=2)

    def test_prompt_longer_than_context_is_400(self):
        """In each API's own shape: llama-server's on the OpenAI-compatible
        routes, the Messages API's words (which Claude Code parses) on
        /v1/messages, OpenAI's context_length_exceeded on /v1/responses."""
        long = "the cat and the dog " * 1200
        st, err = self.toki.chat([{"role": "user", "content": long}])
        self.assertEqual(st, 400, err)
        e = err["error"]
        self.assertEqual(e["type"], "exceed_context_size_error", e)
        n, ctx = e["n_prompt_tokens"], e["n_ctx"]
        self.assertGreater(n, ctx)
        self.assertEqual(e["message"], f"request ({n} tokens) exceeds the available context "
                         f"size ({ctx} tokens), try increasing it")
        msg = {"role": "user", "content": long}
        for path in ("/v1/messages", "/anthropic/v1/messages"):
            st, err = th.request(self.toki.port, "POST", path,
                                 {"model": "m", "max_tokens": 8, "messages": [msg]})
            self.assertEqual(st, 400, err)
            self.assertEqual(err["type"], "error")
            self.assertEqual(err["error"]["type"], "invalid_request_error")
            self.assertRegex(err["error"]["message"], r"^prompt is too long: \d+ tokens > \d+ maximum$")
        st, err = th.request(self.toki.port, "POST", "/v1/responses", {"input": long,
                                                                       "max_output_tokens": 8})
        self.assertEqual(st, 400, err)
        self.assertEqual(err["error"]["code"], "context_length_exceeded", err)

    def test_backend_statuses_and_response_fields(self):
        """Where the backend answered, its status and message reach the client
        (an image sent to a text-only model is llama-server's 500, not a 502);
        a client that filters the answer with response_fields gets the cache
        block only if it asks for it."""
        image = {"role": "user", "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}
        st, direct = th.request(self.llama.port, "POST", "/v1/chat/completions",
                                {"messages": [image], "max_tokens": 2}, auth=False)
        st2, err = self.toki.chat([image], max_tokens=2)
        self.assertEqual(st2, st, err)
        self.assertEqual(err["error"]["message"], direct["error"]["message"])
        # Streamed too: the refusal comes before any answer, so it keeps its
        # status, as from llama-server alone (toki began every stream with a
        # 200 before the backend had answered).
        st3, events = th.stream(self.toki.port, "/v1/chat/completions",
                                {"messages": [image], "max_tokens": 2, "stream": True})
        self.assertEqual(st3, st, events)
        st, r = self.toki.chat([{"role": "user", "content": "Filtered"}], max_tokens=2,
                               response_fields=["content"])
        self.assertEqual(st, 200, r)
        self.assertNotIn("cache", r)
        st, r = self.toki.chat([{"role": "user", "content": "Filtered"}], max_tokens=2,
                               response_fields=["content", "cache"])
        self.assertIn("cache", r)

    def test_client_disconnect_cancels_backend(self):
        body = json.dumps({"messages": [{"role": "user", "content": "Tell a story"}],
                           "max_tokens": 1500, "stream": True, "ignore_eos": True}).encode()
        s = socket.create_connection(("127.0.0.1", self.toki.port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nAuthorization: Bearer " + th.TEST_TOKEN.encode() +
                  b"\r\nContent-Length: " + str(len(body)).encode() +
                  b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data:") < 3:
            got += s.recv(4096)
        s.close()
        deadline = time.time() + 10
        busy = True
        while time.time() < deadline and busy:
            st, slots = th.request(self.llama.port, "GET", "/slots")
            busy = any(x["is_processing"] for x in slots)
            time.sleep(0.1)
        self.assertFalse(busy, "the backend kept generating for a client that left")
        self.chat([{"role": "user", "content": "still there?"}], max_tokens=2)


    def test_token_is_required_everywhere_but_health(self):
        p = self.toki.port
        wrong = "x" * len(th.TEST_TOKEN)  # the right length, the wrong bytes
        routes = [("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                  ("POST", "/v1/completions", {"prompt": "x"}), ("GET", "/v1/models", None),
                  ("GET", "/toki/stats", None), ("POST", "/tokenize", {"content": "x"}),
                  ("GET", "/props", None), ("GET", "/slots", None), ("GET", "/nowhere", None)]
        for method, path, body in routes:
            for headers in ({}, {"Authorization": "Bearer " + wrong}, {"x-api-key": wrong},
                            {"Authorization": "Bearer " + th.TEST_TOKEN[:-1]},
                            {"Authorization": th.TEST_TOKEN}):
                st, err = th.request(p, method, path, body, headers=headers, auth=False)
                self.assertEqual(st, 401, (method, path, headers, err))
                self.assertEqual(err["error"]["type"], "authentication_error")
        st, _ = th.request(p, "GET", "/health", auth=False)
        self.assertEqual(st, 200)
        # Both header forms work.
        st, _ = th.request(p, "GET", "/v1/models", headers={"x-api-key": th.TEST_TOKEN},
                           auth=False)
        self.assertEqual(st, 200)
        st, _ = th.request(p, "GET", "/v1/models",
                           headers={"Authorization": "Bearer " + th.TEST_TOKEN}, auth=False)
        self.assertEqual(st, 200)


class Token(unittest.TestCase):
    def test_token_file_is_created_0600_and_used(self):
        import stat
        import subprocess
        import tempfile
        state = tempfile.mkdtemp(prefix="toki-state-")
        env = dict(os.environ, TOKI_STATE_DIR=state)
        env.pop("TOKI_TOKEN")
        llama = th.LlamaServer(slots=1)
        p = subprocess.Popen([th.TOKI_BIN, "serve", "--port", "0", "--backend", llama.url],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        try:
            port = int(p.stdout.readline().strip().rsplit(":", 1)[1])
            th.wait_http(port)
            path = os.path.join(state, "token")
            mode = stat.S_IMODE(os.stat(path).st_mode)
            self.assertEqual(mode, 0o600)
            token = open(path).read().strip()
            self.assertEqual(len(token), 64)
            st, _ = th.request(port, "GET", "/v1/models", auth=False,
                               headers={"Authorization": "Bearer " + token})
            self.assertEqual(st, 200)
            st, _ = th.request(port, "GET", "/v1/models")  # the test token is not this one
            self.assertEqual(st, 401)
        finally:
            p.terminate()
            p.wait(timeout=30)
            llama.kill()

    def test_remote_bind_needs_the_flag(self):
        import subprocess
        r = subprocess.run([th.TOKI_BIN, "serve", "--host", "0.0.0.0", "--port", "0",
                            "--backend", "http://127.0.0.1:9"], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--allow-remote", r.stderr)


class BodyLimit(unittest.TestCase):
    def test_oversized_body_is_413(self):
        llama = th.LlamaServer(slots=1)
        toki = th.Toki([llama], extra=["--max-body-mb", "1"])
        try:
            big = json.dumps({"messages": [{"role": "user", "content": "x" * (2 << 20)}]})
            st, err = th.request(toki.port, "POST", "/v1/chat/completions", big)
            self.assertEqual(st, 413)
            self.assertEqual(err["error"]["type"], "invalid_request_error")
            st, _ = toki.chat([{"role": "user", "content": "small"}], max_tokens=2)
            self.assertEqual(st, 200)
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()


class BackendFailures(unittest.TestCase):
    def test_backend_down_then_back(self):
        llama = th.LlamaServer(slots=1)
        toki = th.Toki([llama])
        try:
            llama.kill()
            st, err = toki.chat([{"role": "user", "content": "anyone?"}])
            self.assertIn(st, (502, 503), err)
            self.assertIn("error", err)
            # Health notices, and says so.
            deadline = time.time() + 10
            while time.time() < deadline:
                st, h = th.request(toki.port, "GET", "/health")
                if st == 503:
                    break
                time.sleep(0.2)
            self.assertEqual(st, 503)
            llama.restart()
            th.wait_http(toki.port, "/health", timeout=20)
            st, body = toki.chat([{"role": "user", "content": "back?"}], max_tokens=2)
            self.assertEqual(st, 200, body)
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()

    def test_backend_killed_mid_stream(self):
        llama = th.LlamaServer(slots=1)
        toki = th.Toki([llama])
        try:
            result = {}

            def run():
                result["r"] = th.stream(toki.port, "/v1/chat/completions",
                                        {"messages": [{"role": "user", "content": "Go"}],
                                         "max_tokens": 20000, "ignore_eos": True,
                                         "stream": True})
            t = threading.Thread(target=run)
            t.start()
            # Wait until tokens flow, then kill the backend.
            deadline = time.time() + 20
            while time.time() < deadline:
                st, slots = th.request(llama.port, "GET", "/slots")
                if any(x["is_processing"] for x in slots):
                    break
                time.sleep(0.05)
            time.sleep(0.3)
            llama.kill()
            t.join(30)
            self.assertFalse(t.is_alive(), "the client was left hanging")
            st, events = result["r"]
            self.assertEqual(st, 200)
            last = th.event_json(events[-1])
            self.assertIn("error", last, events[-3:])
            self.assertEqual(last["error"]["code"], 502)
            llama.restart()
            th.wait_http(toki.port, "/health", timeout=20)
            st, body = toki.chat([{"role": "user", "content": "again"}], max_tokens=2)
            self.assertEqual(st, 200, body)
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()

    def test_stalled_backend_times_out_with_504(self):
        llama = th.LlamaServer(slots=1)
        toki = th.Toki([llama], env={"TOKI_BACKEND_TIMEOUT": "2"})
        try:
            os.kill(llama.proc.pid, signal.SIGSTOP)
            t0 = time.time()
            st, err = toki.chat([{"role": "user", "content": "stuck?"}])
            self.assertEqual(st, 504, err)
            self.assertLess(time.time() - t0, 15)
        finally:
            os.kill(llama.proc.pid, signal.SIGCONT)
            toki.kill(signal.SIGTERM)
            llama.kill()


if __name__ == "__main__":
    th.run_tests()
