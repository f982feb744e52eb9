"""Faults, each against a real llama-server (and, where a real one cannot be
made to misbehave on demand, the hand-made one in slow_backend.py): the
backend killed mid-stream and before the first byte, a stalled backend, a
backend that answers garbage, a client that disconnects, a slot directory
that is full or read-only while slot files are written, SIGTERM during a
stream, and two `toki model` writers at once. After each: the daemon still
serves, no file is half-written, nothing the user had is lost."""
import hashlib
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
import toki_harness as th  # noqa: E402
from slow_backend import SlowBackend  # noqa: E402
from fake_hosts import FakeHosts  # noqa: E402

TIMEOUT_S = 3  # TOKI_BACKEND_TIMEOUT for the stall tests

STORY = ("Once upon a time there was a little girl named Lily who loved to play in the park "
         "with her big red ball and her friend Tom the happy dog. ")


def auth():
    return {"Authorization": "Bearer " + th.TEST_TOKEN, "Content-Type": "application/json"}


class SSE:
    """A streamed response read as it arrives. `clean` is True when the
    chunked body ended properly (its last chunk came), False when the
    connection was cut or the framing broke."""

    def __init__(self, port, path, body, timeout=60):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self.conn.request("POST", path, body=json.dumps(body), headers=auth())
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.buf = b""
        self.events = []
        self.clean = None

    def next(self):
        """The next event (text), or None at the end."""
        while b"\n\n" not in self.buf:
            if self.clean is not None:
                return None
            try:
                d = self.resp.read1(65536)
            except (http.client.IncompleteRead, ConnectionError, OSError):
                self.clean = False
                continue
            if not d:
                self.clean = True
                continue
            self.buf += d.replace(b"\r\n", b"\n")
        ev, self.buf = self.buf.split(b"\n\n", 1)
        ev = ev.decode("utf-8", "replace")
        self.events.append(ev)
        return ev

    def until_data(self, n):
        """Reads until n data events have come; False if the stream ended first."""
        while sum(1 for e in self.events if "data:" in e) < n:
            if self.next() is None:
                return False
        return True

    def rest(self):
        while self.next() is not None:
            pass
        self.conn.close()
        return self.events

    def data(self):
        out = []
        for e in self.events:
            for line in e.split("\n"):
                if line.startswith("data:"):
                    d = line[5:].strip()
                    out.append(d if d == "[DONE]" else json.loads(d))
        return out


def slots_idle(port, within=10):
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            st, slots = th.request(port, "GET", "/slots", timeout=5)
            if st == 200 and not any(s["is_processing"] for s in slots):
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def wait_processing(port, within=20):
    deadline = time.time() + within
    while time.time() < deadline:
        st, slots = th.request(port, "GET", "/slots")
        if any(s["is_processing"] for s in slots):
            return True
        time.sleep(0.05)
    return False


def long_chat(stream=True, **kw):
    b = {"messages": [{"role": "user", "content": "Tell me a long story"}],
         "max_tokens": 20000, "ignore_eos": True, "stream": stream, "temperature": 0}
    b.update(kw)
    return b


class Served:
    """Mixin: asserts that toki is alive and answers, streamed and not."""

    def assertServes(self, toki, backend_port=None):
        self.assertIsNone(toki.proc.poll(), "toki died:\n" + toki.log_text()[-3000:])
        th.wait_http(toki.port, "/health", timeout=30)
        deadline = time.time() + 30
        while True:
            st, body = toki.chat([{"role": "user", "content": "still there?"}], max_tokens=4)
            if st == 200 or time.time() > deadline:
                break
            time.sleep(0.3)
        self.assertEqual(st, 200, body)
        s = SSE(toki.port, "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "and streamed?"}], "max_tokens": 4,
                 "stream": True})
        self.assertEqual(s.status, 200)
        s.rest()
        self.assertTrue(s.clean)
        self.assertEqual(s.data()[-1], "[DONE]")

    def assertCleanError(self, s, code):
        """A stream that ended with an error event and then a proper end."""
        s.rest()
        self.assertTrue(s.clean, f"the chunked body was cut: {s.events[-3:]}")
        data = [d for d in s.data() if d != "[DONE]"]
        self.assertTrue(data, s.events)
        last = data[-1]
        self.assertIn("error", last, s.events[-3:])
        if "type" in last and last["type"] == "error":  # Anthropic's shape
            self.assertIn("type", last["error"])
        else:
            self.assertEqual(last["error"]["code"], code, last)


class BackendKilled(Served, unittest.TestCase):
    def setUp(self):
        self.llama = th.LlamaServer(slots=2, ctx=2048)
        self.toki = th.Toki([self.llama], mode="fast", extra=["--keepalive-ms", "300"],
                            env={"TOKI_BACKEND_TIMEOUT": str(TIMEOUT_S)})

    def tearDown(self):
        try:
            os.killpg(self.llama.proc.pid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass
        self.toki.kill(signal.SIGTERM)
        self.llama.kill()

    def test_sigkill_mid_stream_openai_and_anthropic(self):
        chat = SSE(self.toki.port, "/v1/chat/completions", long_chat())
        anth = SSE(self.toki.port, "/anthropic/v1/messages",
                   {"model": "m", "max_tokens": 20000, "stream": True, "ignore_eos": True,
                    "messages": [{"role": "user", "content": "Tell another story"}]})
        self.assertEqual(chat.status, 200)
        self.assertEqual(anth.status, 200)
        self.assertTrue(chat.until_data(5))
        self.assertTrue(anth.until_data(5))
        self.llama.kill(signal.SIGKILL)
        self.assertCleanError(chat, 502)
        self.assertCleanError(anth, 502)
        self.assertEqual(anth.data()[-1]["type"], "error")
        self.llama.restart()
        self.assertServes(self.toki)

    def test_sigkill_before_first_byte(self):
        # The server is stopped, so the request (pinned to a slot: no
        # tokenizing first) sits unanswered in its socket; then it dies.
        os.killpg(self.llama.proc.pid, signal.SIGSTOP)
        res = {}

        def go(name, body):
            try:
                s = SSE(self.toki.port, "/v1/chat/completions", body)
                if s.status == 200 and body.get("stream"):
                    s.rest()
                    res[name] = ("stream", s)
                else:
                    res[name] = ("plain", s.status, s.resp.read())
            except Exception as e:  # noqa: BLE001 - reported below
                res[name] = ("exception", e)

        ts = [threading.Thread(target=go, args=("stream", long_chat(id_slot=0))),
              threading.Thread(target=go, args=("plain", long_chat(stream=False, id_slot=1)))]
        for t in ts:
            t.start()
        # Both requests are on their slots (sent to the stopped server).
        deadline = time.time() + 30
        while sum(s["busy"] for b in self.toki.stats()["backends"] for s in b["slots"]) < 2:
            self.assertLess(time.time(), deadline, "the requests never reached their slots")
            time.sleep(0.05)
        self.llama.kill(signal.SIGKILL)
        for t in ts:
            t.join(30)
            self.assertFalse(t.is_alive(), "a client was left hanging")
        kind = res["stream"][0]
        if kind == "stream":
            self.assertCleanError(res["stream"][1], 502)
        else:
            self.assertEqual(kind, "plain", res["stream"])
            self.assertIn(res["stream"][1], (502, 503), res["stream"])
        self.assertEqual(res["plain"][0], "plain", res["plain"])
        self.assertIn(res["plain"][1], (502, 503), res["plain"])
        err = json.loads(res["plain"][2])
        self.assertIn("message", err["error"])
        self.llama.restart()
        self.assertServes(self.toki)

    def test_sigstop_mid_stream_times_out_cleanly(self):
        s = SSE(self.toki.port, "/v1/chat/completions", long_chat())
        self.assertTrue(s.until_data(5))
        os.killpg(self.llama.proc.pid, signal.SIGSTOP)
        t0 = time.time()
        self.assertCleanError(s, 504)
        took = time.time() - t0
        self.assertLess(took, TIMEOUT_S + 10)
        # While the backend was silent the client heard keep-alives.
        self.assertTrue(any(e.startswith(": keep-alive") for e in s.events), s.events[-5:])
        os.killpg(self.llama.proc.pid, signal.SIGCONT)
        self.assertTrue(slots_idle(self.llama.port, 15),
                        "the stalled request was not cancelled on the backend")
        self.assertServes(self.toki)

    def test_sigstop_before_first_byte(self):
        os.killpg(self.llama.proc.pid, signal.SIGSTOP)
        t0 = time.time()
        s = SSE(self.toki.port, "/v1/chat/completions", long_chat(), timeout=60)
        if s.status == 200:
            self.assertCleanError(s, 504)
        else:
            self.assertEqual(s.status, 504, s.resp.read())
        self.assertLess(time.time() - t0, TIMEOUT_S + 15)
        os.killpg(self.llama.proc.pid, signal.SIGCONT)
        self.assertServes(self.toki)


class MisbehavingBackend(Served, unittest.TestCase):
    """slow_backend.py in front of a real llama-server."""

    @classmethod
    def setUpClass(cls):
        cls.llama = th.LlamaServer(slots=2, ctx=2048)

    @classmethod
    def tearDownClass(cls):
        cls.llama.kill()

    def setUp(self):
        self.fake = SlowBackend(self.llama.url)
        self.toki = th.Toki([self.fake], mode="fast", extra=["--keepalive-ms", "300"],
                            env={"TOKI_BACKEND_TIMEOUT": str(TIMEOUT_S)})

    def tearDown(self):
        self.toki.kill(signal.SIGTERM)
        self.fake.close()

    def recover(self):
        self.fake.mode = "pass"
        self.assertServes(self.toki)
        self.assertTrue(slots_idle(self.llama.port, 15))

    def test_stall_after_headers(self):
        self.fake.mode = "stall_headers"
        t0 = time.time()
        s = SSE(self.toki.port, "/v1/chat/completions", long_chat())
        self.assertEqual(s.status, 200)
        self.assertCleanError(s, 504)
        self.assertLess(time.time() - t0, TIMEOUT_S + 10)
        self.assertTrue(any(e.startswith(": keep-alive") for e in s.events), s.events)
        st, err = th.request(self.toki.port, "POST", "/v1/chat/completions",
                             long_chat(stream=False), timeout=60)
        self.assertEqual(st, 504, err)
        # toki hung up on the stalled backend requests (that is the cancel).
        deadline = time.time() + 10
        while self.fake.closed_by_peer < 2 and time.time() < deadline:
            time.sleep(0.1)
        self.assertGreaterEqual(self.fake.closed_by_peer, 2)
        self.recover()

    def test_stall_mid_stream(self):
        self.fake.mode = "stall_mid"
        self.fake.events = 4
        s = SSE(self.toki.port, "/v1/chat/completions", long_chat())
        self.assertEqual(s.status, 200)
        self.assertCleanError(s, 504)
        content = [d for d in s.data() if d != "[DONE]" and "choices" in d]
        self.assertGreaterEqual(len(content), 3, s.events)  # what came, came through
        # A stall after the answer's last chunk (held back for the cache
        # block) and before [DONE]: the chunk comes, then the error.
        self.fake.events = 4
        s = SSE(self.toki.port, "/v1/chat/completions", long_chat(max_tokens=2))
        self.assertCleanError(s, 504)
        content = [d for d in s.data() if d != "[DONE]" and "choices" in d]
        self.assertEqual(content[-1]["choices"][0]["finish_reason"], "length", s.events)
        self.recover()

    def test_timings_per_token_chunks_are_not_held(self):
        """With timings_per_token every token's chunk carries timings. toki
        holds back only a chunk that may be the answer's last (its cache
        block goes there), so each token reaches the client when the server
        sends it. The fake sends the first events of the real stream and then
        nothing: every one of them must come through while the backend
        stalls (a long timeout: no error event flushes anything)."""
        self.toki.kill(signal.SIGTERM)
        self.toki = th.Toki([self.fake], mode="fast", extra=["--keepalive-ms", "300"],
                            env={"TOKI_BACKEND_TIMEOUT": "600"})
        self.fake.mode = "stall_mid"
        cases = [("/v1/chat/completions", long_chat(timings_per_token=True), 3),
                 ("/completion", {"prompt": STORY, "n_predict": 20000, "ignore_eos": True,
                                  "stream": True, "timings_per_token": True}, 3),
                 ("/v1/responses", {"input": "Tell me a long story", "stream": True,
                                    "max_output_tokens": 20000, "timings_per_token": True}, 6)]
        for path, body, n in cases:
            with self.subTest(path=path):
                self.fake.events = n
                s = SSE(self.toki.port, path, body)
                self.assertEqual(s.status, 200)
                deadline = time.time() + 30
                while sum(1 for e in s.events if "data:" in e) < n and time.time() < deadline:
                    s.next()  # keep-alives come every 300 ms
                data = s.data()
                self.assertEqual(len(data), n, [e for e in s.events if "data:" in e])
                self.assertIn("timings", data[-1])  # a token's chunk, with its timings
                self.assertNotIn("cache", data[-1])
                s.conn.close()
        self.recover()

    def test_garbage_instead_of_http(self):
        self.fake.mode = "garbage"
        st, err = th.request(self.toki.port, "POST", "/v1/chat/completions",
                             long_chat(stream=False), timeout=60)
        self.assertEqual(st, 502, err)
        self.assertEqual(err["error"]["code"], 502)
        s = SSE(self.toki.port, "/v1/chat/completions", long_chat())
        if s.status == 200:
            self.assertCleanError(s, 502)
        else:
            self.assertEqual(s.status, 502)
        self.recover()

    def test_garbage_body(self):
        self.fake.mode = "garbage_http"
        st, body = th.request(self.toki.port, "POST", "/v1/chat/completions",
                              long_chat(stream=False), timeout=60, raw=True)
        # A 200 whose body is not JSON: passed on as the backend's answer, or
        # refused as a bad gateway; never a crash or a hang.
        self.assertIn(st, (200, 502), body[:300])
        s = SSE(self.toki.port, "/v1/chat/completions", long_chat())
        self.assertEqual(s.status, 200)
        s.rest()
        self.assertTrue(s.clean, s.events[-3:])
        self.recover()

    def test_broken_and_cut_event_streams(self):
        for mode in ("broken_sse", "cut_sse"):
            with self.subTest(mode=mode):
                self.fake.mode = mode
                s = SSE(self.toki.port, "/v1/chat/completions", long_chat())
                self.assertEqual(s.status, 200)
                self.assertCleanError(s, 502)
                a = SSE(self.toki.port, "/anthropic/v1/messages",
                        {"model": "m", "max_tokens": 50, "stream": True,
                         "messages": [{"role": "user", "content": "hi"}]})
                self.assertEqual(a.status, 200)
                self.assertCleanError(a, 502)
                self.assertEqual(a.data()[-1]["type"], "error")
        self.recover()

    def test_backend_marked_down_and_back_while_streaming(self):
        """A request's failure marks the backend down while another stream
        on it goes on; the health check brings it back (rediscovery) before
        that stream ends. The stream must still end cleanly, with its cache
        block (the slot it holds survived the rediscovery)."""
        self.fake.event_delay = 0.04  # 250 events: 10 s at least, on any machine
        t0 = time.time()
        s = SSE(self.toki.port, "/v1/chat/completions", long_chat(max_tokens=250))
        self.assertTrue(s.until_data(3))
        self.fake.mode = "close"
        st, err = th.request(self.toki.port, "POST", "/v1/chat/completions",
                             long_chat(stream=False, max_tokens=4), timeout=60)
        self.assertIn(st, (502, 503), err)
        deadline = time.time() + 20
        while time.time() < deadline:
            if th.request(self.toki.port, "GET", "/health")[0] == 200:
                break
            time.sleep(0.1)
        self.fake.mode = "pass"
        self.assertLess(time.time() - t0, 8, "the backend came back after the stream ended")
        s.rest()
        self.fake.event_delay = 0
        self.assertTrue(s.clean, s.events[-3:])
        data = s.data()
        self.assertEqual(data[-1], "[DONE]", s.events[-3:])
        cache = [d["cache"] for d in data if isinstance(d, dict) and "cache" in d]
        self.assertTrue(cache, s.events[-3:])
        self.assertIsNone(self.toki.proc.poll(), self.toki.log_text()[-3000:])
        self.recover()

    def test_close_before_first_byte(self):
        self.fake.mode = "close"
        st, err = th.request(self.toki.port, "POST", "/v1/chat/completions",
                             long_chat(stream=False), timeout=60)
        self.assertEqual(st, 502, err)
        s = SSE(self.toki.port, "/v1/chat/completions", long_chat())
        if s.status == 200:
            self.assertCleanError(s, 502)
        else:
            # After the first failure the backend may be marked down: then
            # "no backend is up" (503) is the truthful answer.
            self.assertIn(s.status, (502, 503))
            self.assertIn("message", json.loads(s.resp.read())["error"])
        self.recover()


class ClientDisconnects(Served, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.llama = th.LlamaServer(slots=2, ctx=4096)
        cls.toki = th.Toki([cls.llama], mode="fast")

    @classmethod
    def tearDownClass(cls):
        cls.toki.kill(signal.SIGTERM)
        cls.llama.kill()

    def raw_post(self, path, body):
        data = json.dumps(body).encode()
        s = socket.create_connection(("127.0.0.1", self.toki.port))
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nAuthorization: Bearer " + th.TEST_TOKEN.encode() +
                  b"\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        return s

    def test_disconnect_mid_stream_cancels_backend_on_every_route(self):
        routes = [
            ("/v1/chat/completions", long_chat(max_tokens=3000)),
            ("/v1/completions", {"prompt": STORY, "max_tokens": 3000, "ignore_eos": True,
                                 "stream": True}),
            ("/completion", {"prompt": STORY, "n_predict": 3000, "ignore_eos": True,
                             "stream": True}),
            ("/anthropic/v1/messages", {"model": "m", "max_tokens": 3000, "ignore_eos": True,
                                        "stream": True,
                                        "messages": [{"role": "user", "content": STORY}]}),
            ("/v1/responses", {"input": STORY, "max_output_tokens": 3000, "ignore_eos": True,
                               "stream": True}),
        ]
        for path, body in routes:
            with self.subTest(path=path):
                s = self.raw_post(path, body)
                got = b""
                while got.count(b"data:") < 3:
                    d = s.recv(65536)
                    self.assertTrue(d, got[-500:])
                    got += d
                self.assertTrue(got.startswith(b"HTTP/1.1 200"), got[:200])
                s.close()
                self.assertTrue(slots_idle(self.llama.port, 10),
                                f"{path}: the backend kept generating for a client that left")
        self.assertServes(self.toki)

    def wait_busy_slots(self, ok, within=30):
        deadline = time.time() + within
        while True:
            st = self.toki.stats()
            n = sum(s["busy"] for b in st["backends"] for s in b["slots"])
            if ok(n):
                return
            self.assertLess(time.time(), deadline, f"busy slots stayed at {n}: {st}")
            time.sleep(0.05)

    def test_disconnect_before_first_byte(self):
        os.killpg(self.llama.proc.pid, signal.SIGSTOP)
        try:
            socks = [self.raw_post("/v1/chat/completions", long_chat(max_tokens=3000,
                                                                     id_slot=i))
                     for i in range(2)]
            # Both are on their slots, sent to the stopped server; then the
            # clients leave, and toki frees the slots (cancelling the calls)
            # before the server runs again.
            self.wait_busy_slots(lambda n: n == 2)
            for s in socks:
                s.close()
            self.wait_busy_slots(lambda n: n == 0)
        finally:
            os.killpg(self.llama.proc.pid, signal.SIGCONT)
        self.assertTrue(slots_idle(self.llama.port, 10),
                        "a request whose client left before the first byte kept running")
        self.assertServes(self.toki)


def have_mount():
    if os.geteuid() != 0:
        return False
    d = tempfile.mkdtemp(prefix="toki-mnt-probe-")
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d],
                           capture_output=True)
        if r.returncode != 0:
            return False
        subprocess.run(["umount", d])
        return True
    finally:
        os.rmdir(d)


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@unittest.skipUnless(have_mount(), "needs root and mount -t tmpfs (for a small or read-only "
                     "slot directory)")
class SlotDirFaults(Served, unittest.TestCase):
    """--slot-dir on a small tmpfs: full, then read-only, while slot files
    are being written."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="toki-slotfs-")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m,mode=0700", "tmpfs", self.dir],
                       check=True)
        self.mounts = [self.dir]
        self.llama = th.LlamaServer(slots=2, ctx=2048, ubatch=64,
                                    extra=["--slot-save-path", self.dir])
        self.toki = None
        self.start_toki()

    def start_toki(self):
        self.toki = th.Toki([self.llama], ubatch=64,
                            extra=["--slot-dir", self.dir, "--slot-save-idle-ms", "200",
                                   "--slot-disk-mb", "64"])

    def tearDown(self):
        if self.toki:
            self.toki.kill(signal.SIGTERM)
        self.llama.kill()
        for m in reversed(self.mounts):
            subprocess.run(["umount", "-l", m], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def conversation(self, seed):
        msgs = [{"role": "system", "content": f"Story {seed}. " + STORY * 6},
                {"role": "user", "content": f"Tell story number {seed}"}]
        st, r = self.toki.chat(msgs, max_tokens=8)
        self.assertEqual(st, 200, r)
        self.assertGreaterEqual(r["cache"]["prompt_tokens"], 256)
        return msgs

    def wait_saves(self, n, within=30):
        deadline = time.time() + within
        while time.time() < deadline:
            st = self.toki.stats()
            if st["saves"] >= n:
                return st
            time.sleep(0.1)
        self.fail(f"fewer than {n} saves: {self.toki.stats()}\n{self.toki.log_text()[-2000:]}")

    SAVE_FAILED = re.compile(r"saving slot \d+ failed|slot file \S+ could not be finished|"
                             r"cannot write the index file")

    def save_failures(self):
        return len(self.SAVE_FAILED.findall(self.toki.log_text()))

    def wait_save_failures(self, n, within=30):
        """Waits until n saves have failed (the log says so for each)."""
        deadline = time.time() + within
        while self.save_failures() < n:
            self.assertLess(time.time(), deadline,
                            f"no failed save was logged:\n{self.toki.log_text()[-2000:]}")
            time.sleep(0.05)

    def snapshot(self):
        return {f: sha(os.path.join(self.dir, f)) for f in os.listdir(self.dir)
                if f.startswith("toki-") and (f.endswith(".bin") or f.endswith(".json"))}

    def assertConsistent(self):
        """Nothing half-written: no .part/.tmp left behind, every index file
        has its state of the size it says, every state its index file."""
        names = os.listdir(self.dir)
        leftovers = [f for f in names if f.endswith(".part") or f.endswith(".tmp")]
        self.assertEqual(leftovers, [], "half-written files left in the slot directory")
        for f in names:
            p = os.path.join(self.dir, f)
            if f.endswith(".json"):
                with open(p) as fh:
                    idx = json.load(fh)  # parses: never half-written
                stem = f[:-5]
                ext = ".zst" if idx.get("compressed") else ".bin"
                self.assertIn(stem + ext, names, f"{f} indexes a missing state")
                self.assertEqual(os.path.getsize(os.path.join(self.dir, stem + ext)),
                                 idx["bytes"], f"{stem}{ext} is not the size its index says")
                self.assertEqual(len(idx["tokens"]), idx["n_tokens"])
            elif f.endswith(".bin") and f.startswith("toki-"):
                self.assertIn(f[:-4] + ".json", names, f"{f} has no index file")

    def settle(self, seconds=3):
        deadline = time.time() + seconds
        while time.time() < deadline:
            st = self.toki.stats()
            if not any(s["busy"] for b in st["backends"] for s in b["slots"]):
                time.sleep(0.3)
                return
            time.sleep(0.1)

    def test_full_then_freed(self):
        self.conversation(1)
        self.wait_saves(1)
        before = self.snapshot()
        self.assertTrue(before)
        # Fill the file system to within a few KB.
        filler = os.path.join(self.dir, "filler")
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        # Now a second conversation's save fails (no space) — again and again.
        saves = self.toki.stats()["saves"]
        failed = self.save_failures()
        self.conversation(2)
        self.wait_save_failures(failed + 1)
        self.assertServes(self.toki)
        self.settle()
        self.assertEqual(self.toki.stats()["saves"], saves, "a save into a full disk 'succeeded'")
        self.assertConsistent()
        after = self.snapshot()
        for f, h in before.items():
            self.assertEqual(after.get(f), h, f"{f} changed or vanished while the disk was full")
        # Space again: the next save lands.
        os.unlink(filler)
        self.conversation(3)
        self.wait_saves(saves + 1)
        self.settle()
        self.assertConsistent()
        # A restarted toki trusts every file there and discards none.
        self.toki.kill(signal.SIGTERM)
        self.assertConsistent()
        self.start_toki()
        st = self.toki.stats()
        self.assertEqual(st["discarded_files"], 0, st)
        self.assertGreaterEqual(st["saved_files"], 2, st)
        self.assertServes(self.toki)

    def test_read_only_then_writable(self):
        self.conversation(1)
        self.wait_saves(1)
        before = self.snapshot()
        subprocess.run(["mount", "--bind", self.dir, self.dir], check=True)
        self.mounts.append(self.dir)
        subprocess.run(["mount", "-o", "remount,ro,bind", self.dir], check=True)
        saves = self.toki.stats()["saves"]
        failed = self.save_failures()
        self.conversation(2)
        self.wait_save_failures(failed + 1)
        self.assertServes(self.toki)
        self.settle()
        self.assertEqual(self.toki.stats()["saves"], saves)
        self.assertConsistent()
        self.assertEqual(self.snapshot(), before)
        # SIGTERM while read-only: the shutdown saves fail, toki still ends.
        self.toki.kill(signal.SIGTERM)
        self.assertIn(self.toki.proc.returncode, (0,), self.toki.log_text()[-2000:])
        self.assertEqual(self.snapshot(), before)
        subprocess.run(["umount", self.dir], check=True)
        self.mounts.pop()
        self.start_toki()
        self.assertEqual(self.toki.stats()["discarded_files"], 0)
        self.conversation(3)
        self.wait_saves(1)
        self.settle()
        self.assertConsistent()
        for f, h in before.items():
            self.assertEqual(self.snapshot().get(f), h)


class Shutdown(Served, unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="toki-term-")
        # Three slots: the conversation keeps its slot while two streams run.
        # 8192 tokens a slot: the long streams must still run when SIGTERM
        # comes (at 2048 they ended in 3 s on a quiet machine).
        self.llama = th.LlamaServer(slots=3, ctx=8192, ubatch=64,
                                    extra=["--slot-save-path", self.dir])

    def tearDown(self):
        self.llama.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_sigterm_during_stream(self):
        toki = th.Toki([self.llama], mode="fast", ubatch=64,
                       extra=["--slot-dir", self.dir, "--slot-save-idle-ms", "0"])
        try:
            msgs = [{"role": "system", "content": STORY * 6},
                    {"role": "user", "content": "Tell a story"}]
            st, r = toki.chat(msgs, max_tokens=8)
            self.assertEqual(st, 200, r)
            self.assertEqual(os.listdir(self.dir), [])  # idle saves are off
            # The streams run on the other slots (one pinned, one routed to
            # the empty slot), so the conversation stays idle, worth saving.
            free = [i for i in range(3) if i != r["cache"]["slot"]]
            s = SSE(toki.port, "/v1/chat/completions", long_chat(id_slot=free[0]))
            self.assertTrue(s.until_data(5))
            a = SSE(toki.port, "/anthropic/v1/messages",
                    {"model": "m", "max_tokens": 20000, "stream": True, "ignore_eos": True,
                     "messages": [{"role": "user", "content": "Go on"}]})
            self.assertTrue(a.until_data(3))
            t0 = time.time()
            os.kill(toki.proc.pid, signal.SIGTERM)
            self.assertCleanError(s, 503)
            self.assertCleanError(a, 503)
            self.assertEqual(a.data()[-1]["type"], "error")
            toki.proc.wait(timeout=40)
            self.assertEqual(toki.proc.returncode, 0, toki.log_text()[-2000:])
            self.assertLess(time.time() - t0, 35)
        finally:
            toki.kill(signal.SIGKILL)
        files = os.listdir(self.dir)
        self.assertTrue(any(f.endswith(".bin") for f in files), files)
        self.assertTrue(any(f.endswith(".json") for f in files), files)
        self.assertFalse([f for f in files if f.endswith(".part") or f.endswith(".tmp")], files)
        # The next toki indexes them.
        toki = th.Toki([self.llama], mode="fast", ubatch=64,
                       extra=["--slot-dir", self.dir, "--slot-save-idle-ms", "0"])
        try:
            st = toki.stats()
            self.assertGreaterEqual(st["saved_files"], 1, st)
            self.assertEqual(st["discarded_files"], 0, st)
            self.assertServes(toki)
        finally:
            toki.kill(signal.SIGTERM)


class RegistryWriters(unittest.TestCase):
    """Many `toki model` writers at once on one registry: every change lands,
    the file always parses, nobody's entry is lost."""

    N = 8

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="toki-reg-")
        self.reg = os.path.join(self.tmp, "models.yaml")
        self.env = dict(os.environ, TOKI_MODEL_REGISTRY=self.reg,
                        TOKI_STATE_DIR=os.path.join(self.tmp, "state"))
        lines = ["models:"]
        for i in range(2 * self.N):
            lines += [f"  m{i}:", f"    path: /models/m{i}.gguf", f"    ctx: {1024 + i}",
                      '    args: ["-ngl", "99"]']
        lines.append("active: m15")
        with open(self.reg, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.hosts = FakeHosts()

    def tearDown(self):
        self.hosts.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def listing(self):
        r = subprocess.run([th.TOKI_BIN, "model", "list", "--json"], capture_output=True,
                           text=True, env=self.env, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def test_parallel_removes_and_pulls_all_land(self):
        with open(th.test_model(), "rb") as f:
            model = f.read()
        repo = "tiny-org/tiny-GGUF"
        self.hosts.add_file(repo, "stories260K.gguf", model)
        env = dict(self.env, HF_ENDPOINT=self.hosts.url)
        procs = []
        for i in range(self.N):
            procs.append(subprocess.Popen([th.TOKI_BIN, "model", "remove", f"m{i}"], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        for i in range(4):
            procs.append(subprocess.Popen([th.TOKI_BIN, "model", "pull", repo, "--file",
                                           "stories260K.gguf", "--name", f"p{i}"], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        for p in procs:
            out, err = p.communicate(timeout=300)
            self.assertEqual(p.returncode, 0, (p.args, err.decode()))
        text = self.listing()
        got = json.loads(text)
        models = got["models"] if isinstance(got, dict) else got
        names = {m["name"] for m in models}
        want = {f"m{i}" for i in range(self.N, 2 * self.N)} | {f"p{i}" for i in range(4)}
        self.assertEqual(names, want)
        for m in models:  # the survivors are intact
            if m["name"].startswith("m"):
                self.assertEqual(m["path"], f"/models/{m['name']}.gguf")
        with open(self.reg) as f:
            raw = f.read()
        self.assertIn("active: m15", raw)
        self.assertIn('"-ngl"', raw)
        self.assertFalse([f for f in os.listdir(self.tmp) if f.endswith(".tmp")])
        for i in range(4):
            p = os.path.join(self.tmp, "state", "models", f"p{i}", "stories260K.gguf")
            self.assertEqual(sha(p), hashlib.sha256(model).hexdigest())

    def test_racing_removes_of_one_model(self):
        procs = [subprocess.Popen([th.TOKI_BIN, "model", "remove", "m3"], env=self.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(6)]
        rcs = [p.wait(timeout=60) for p in procs]
        self.assertEqual(rcs.count(0), 1, rcs)  # exactly one removed it
        names = {m["name"] for m in (lambda g: g["models"] if isinstance(g, dict) else g)(
            json.loads(self.listing()))}
        self.assertEqual(names, {f"m{i}" for i in range(2 * self.N)} - {"m3"})


if __name__ == "__main__":
    th.run_tests()
