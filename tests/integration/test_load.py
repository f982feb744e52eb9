"""Load and abuse: many concurrent streaming clients through toki (fast mode,
a real llama-server with -np 4 and a tiny model), side by side with the same
load sent to llama-server directly; toki's RSS sampled from /proc; then
slow-loris clients, header floods, an oversized body and more connections
than the limit, each with its status asserted.

  python3 tests/integration/test_load.py            the CI run (100 clients, 20 s)
  python3 tests/integration/test_load.py --long     200 clients for 60 s
  TOKI_LOAD_CLIENTS / TOKI_LOAD_SECONDS override either.

The figures (requests, errors, RSS start/peak/end, p50/p99 TTFT and total,
added latency) are printed and written to $TOKI_TEST_WORK/load-report.json."""
import asyncio
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th  # noqa: E402

LONG = "--long" in sys.argv
if LONG:
    sys.argv.remove("--long")
CLIENTS = int(os.environ.get("TOKI_LOAD_CLIENTS", 200 if LONG else 100))
SECONDS = float(os.environ.get("TOKI_LOAD_SECONDS", 60 if LONG else 20))
MAX_TOKENS = 8
IDLE_TIMEOUT_S = 8  # toki serve --client-timeout, for Limits (60 by default)
REQUEST_TIMEOUT_S = 180  # a request that takes longer counts as an error (not a hang)


# ------------------------------------------------------------------ load generator

def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


async def one_request(port, body, headers):
    """One streamed POST over a fresh connection. Returns a dict: ok, status,
    ttft (first data event), total, error (text)."""
    t0 = time.monotonic()
    r = {"ok": False, "status": None, "ttft": None, "total": None, "error": None}
    writer = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data = json.dumps(body).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n")
        for k, v in headers.items():
            head += f"{k}: {v}\r\n"
        writer.write(head.encode() + b"\r\n" + data)
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.split()
        r["status"] = int(parts[1]) if len(parts) > 1 else None
        hdrs = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()
        body_bytes = b""
        saw_done = False
        buf = b""
        if hdrs.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await reader.readline()
                if not size_line:
                    raise ConnectionError("cut inside the chunked body")
                size = int(size_line.split(b";")[0].strip() or b"x", 16)
                if size == 0:
                    await reader.readline()
                    break
                chunk = await reader.readexactly(size)
                await reader.readexactly(2)
                buf += chunk
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    for ln in ev.split(b"\n"):
                        if not ln.startswith(b"data:"):
                            continue
                        d = ln[5:].strip()
                        if r["ttft"] is None:
                            r["ttft"] = time.monotonic() - t0
                        if d == b"[DONE]":
                            saw_done = True
                        elif b'"error"' in d:
                            r["error"] = d.decode("utf-8", "replace")[:300]
        else:
            n = int(hdrs.get("content-length", "0"))
            body_bytes = await reader.readexactly(n)
            r["error"] = body_bytes.decode("utf-8", "replace")[:300]
        r["total"] = time.monotonic() - t0
        r["ok"] = r["status"] == 200 and saw_done and r["error"] is None
        if not r["ok"] and r["error"] is None:
            r["error"] = f"status {r['status']}, [DONE] {'seen' if saw_done else 'missing'}"
    except Exception as e:  # noqa: BLE001 - every failure is a counted error
        r["error"] = f"{type(e).__name__}: {e}"
        r["total"] = time.monotonic() - t0
    finally:
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except Exception:  # noqa: BLE001
                pass
    return r


async def run_load(port, clients, seconds, headers, tag):
    results = []
    stop_at = time.monotonic() + seconds

    async def client(i):
        k = 0
        while time.monotonic() < stop_at:
            # A few conversations shared by many clients (prefix reuse), and
            # a unique tail each time.
            body = {"messages": [
                {"role": "system", "content": f"You are storyteller {i % 8}."},
                {"role": "user", "content": f"{tag} client {i} request {k}: tell a story"}],
                "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
            try:
                r = await asyncio.wait_for(one_request(port, body, headers), REQUEST_TIMEOUT_S)
            except asyncio.TimeoutError:
                r = {"ok": False, "status": None, "ttft": None, "total": REQUEST_TIMEOUT_S,
                     "error": f"no answer within {REQUEST_TIMEOUT_S}s"}
            results.append(r)
            k += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    return results


def summarize(results):
    ok = [r for r in results if r["ok"]]
    errs = [r for r in results if not r["ok"]]
    return {
        "requests": len(results), "ok": len(ok), "errors": len(errs),
        "error_kinds": sorted({(r["error"] or "")[:120] for r in errs})[:10],
        "ttft_p50_ms": round(pct([r["ttft"] for r in ok if r["ttft"]], 50) * 1000, 1) if ok else None,
        "ttft_p99_ms": round(pct([r["ttft"] for r in ok if r["ttft"]], 99) * 1000, 1) if ok else None,
        "total_p50_ms": round(pct([r["total"] for r in ok], 50) * 1000, 1) if ok else None,
        "total_p99_ms": round(pct([r["total"] for r in ok], 99) * 1000, 1) if ok else None,
    }


class RSS:
    """Samples a process's resident set from /proc every 0.2 s."""

    def __init__(self, pid):
        self.pid = pid
        self.samples = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def now(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])  # kB
        return 0

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append(self.now())
            except OSError:
                return
            time.sleep(0.2)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *a):
        self._stop.set()
        self._t.join()


def report(name, data):
    path = os.path.join(th.WORK_DIR, "load-report.json")
    try:
        with open(path) as f:
            all_ = json.load(f)
    except (OSError, ValueError):
        all_ = {}
    all_[name] = data
    os.makedirs(th.WORK_DIR, exist_ok=True)
    with open(path, "w") as f:
        json.dump(all_, f, indent=2)
    print(f"\n{name}: " + json.dumps(data, indent=2), flush=True)


class Load(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # llama-server serves each HTTP connection on a thread of its own
        # pool (cpp-httplib): enough of them for every client, so that the
        # direct baseline is not throttled by the pool.
        cls.llama = th.LlamaServer(slots=4, ctx=512,
                                   extra=["--threads-http", str(CLIENTS + 32)])
        cls.toki = th.Toki([cls.llama], mode="fast")

    @classmethod
    def tearDownClass(cls):
        cls.toki.kill(signal.SIGTERM)
        cls.llama.kill()

    def test_concurrent_streams(self):
        auth = {"Authorization": "Bearer " + th.TEST_TOKEN}
        # Warm both paths (the first requests measure rates, load the model's pages).
        asyncio.run(run_load(self.toki.port, 4, 1.0, auth, "warm"))
        asyncio.run(run_load(self.llama.port, 4, 1.0, {}, "warm"))

        # Unloaded, request by request, interleaved (which goes first
        # alternates; the prompts differ, so neither reuses the other's
        # cache): toki's own overhead, its tokenizing round trips included.
        direct, via = [], []
        for i in range(60):
            def body(who):
                return {"messages": [{"role": "user", "content": f"probe {who}{i:03d}"}],
                        "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
            pair = [("d", self.llama.port, {}, direct), ("t", self.toki.port, auth, via)]
            for who, port, hdrs, out in (pair if i % 2 == 0 else pair[::-1]):
                out.append(asyncio.run(one_request(port, body(who), hdrs)))
        d, v = summarize(direct), summarize(via)
        unloaded = {"direct": d, "toki": v,
                    "added_ttft_p50_ms": round(v["ttft_p50_ms"] - d["ttft_p50_ms"], 1),
                    "added_ttft_p99_ms": round(v["ttft_p99_ms"] - d["ttft_p99_ms"], 1),
                    "added_total_p50_ms": round(v["total_p50_ms"] - d["total_p50_ms"], 1),
                    "added_total_p99_ms": round(v["total_p99_ms"] - d["total_p99_ms"], 1)}
        self.assertEqual(v["errors"], 0, v)

        # Loaded: the same load straight to llama-server, then through toki.
        base = asyncio.run(run_load(self.llama.port, CLIENTS, SECONDS / 2, {}, "direct"))
        rss0 = RSS(self.toki.proc.pid).now()
        with RSS(self.toki.proc.pid) as rss:
            t0 = time.time()
            got = asyncio.run(run_load(self.toki.port, CLIENTS, SECONDS, auth, "toki"))
            wall = time.time() - t0
        # The memory left once the load is over: no request in flight.
        deadline = time.time() + 30
        while True:
            st = self.toki.stats()
            if not st["waiting"] and not any(s["busy"] for b in st["backends"]
                                             for s in b["slots"]):
                break
            self.assertLess(time.time(), deadline, f"requests still in flight: {st}")
            time.sleep(0.1)
        rss_end = RSS(self.toki.proc.pid).now()
        b, g = summarize(base), summarize(got)
        stats = self.toki.stats()
        result = {
            "clients": CLIENTS, "seconds": SECONDS, "max_tokens": MAX_TOKENS,
            "backend": "llama-server -np 4 -c 2048 (stories260K), toki --reuse fast",
            "direct": b, "toki": g, "toki_wall_s": round(wall, 1),
            "toki_req_per_s": round(g["requests"] / wall, 1),
            "added_ttft_p50_ms": round(g["ttft_p50_ms"] - b["ttft_p50_ms"], 1),
            "added_ttft_p99_ms": round(g["ttft_p99_ms"] - b["ttft_p99_ms"], 1),
            "added_total_p50_ms": round(g["total_p50_ms"] - b["total_p50_ms"], 1),
            "added_total_p99_ms": round(g["total_p99_ms"] - b["total_p99_ms"], 1),
            "unloaded": unloaded,
            "rss_kb": {"start": rss0, "peak": max(rss.samples or [rss0]), "end": rss_end},
            "toki_errors_counter": stats["errors"], "routed": stats["routed"],
        }
        report(f"load-{CLIENTS}x{int(SECONDS)}s", result)
        self.assertEqual(g["errors"], 0, g["error_kinds"])
        self.assertGreater(g["ok"], CLIENTS)  # every client got through, repeatedly
        # Bounded memory: what a load adds is given back, and the peak stays small.
        self.assertLess(result["rss_kb"]["peak"], 512 * 1024, result["rss_kb"])
        self.assertLess(rss_end - rss0, 64 * 1024, result["rss_kb"])
        self.assertIsNone(self.toki.proc.poll())
        # The backend's own work still matches what toki thinks: nothing stuck.
        self.assertFalse(any(s["busy"] for be in stats["backends"] for s in be["slots"]),
                         stats)


# ------------------------------------------------------------------ abuse

def read_status(s, timeout):
    """The status of the answer on socket s, or None if it closed silently."""
    s.settimeout(timeout)
    got = b""
    try:
        while b"\r\n" not in got:
            d = s.recv(4096)
            if not d:
                break
            got += d
    except (socket.timeout, ConnectionResetError):
        pass
    if not got.startswith(b"HTTP/1."):
        return None, got
    # The rest of the answer (the error body): to its Content-Length, or
    # to the close (a kept-alive connection would otherwise hold the read
    # for the whole timeout).
    def whole():
        head, sep, body = got.partition(b"\r\n\r\n")
        if not sep:
            return False
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                return len(body) >= int(v)
        return False
    try:
        while not whole():
            d = s.recv(65536)
            if not d:
                break
            got += d
    except (socket.timeout, OSError):
        pass
    return int(got.split()[1]), got


class Limits(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.llama = th.LlamaServer(slots=1, ctx=512)
        cls.toki = th.Toki([cls.llama], extra=["--max-body-mb", "1", "--client-timeout",
                                               str(IDLE_TIMEOUT_S)])

    @classmethod
    def tearDownClass(cls):
        cls.toki.kill(signal.SIGTERM)
        cls.llama.kill()

    def conn(self):
        return socket.create_connection(("127.0.0.1", self.toki.port), timeout=10)

    def send(self, s, data):
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered early and closed; read the answer

    def assertJsonError(self, raw, status):
        body = raw.split(b"\r\n\r\n", 1)[1]
        err = json.loads(body)
        self.assertEqual(err["error"]["code"], status)

    def assertStillServes(self):
        st, body = self.toki.chat([{"role": "user", "content": "hi"}], max_tokens=2)
        self.assertEqual(st, 200, body)

    def test_slow_loris_gets_408(self):
        """A client that trickles a header byte every few seconds, and one
        that sends half a head and stops: the idle timeout closes both with
        408 (not later than the timeout plus a little). Meanwhile others are
        served."""
        stalled, trickle = self.conn(), self.conn()
        self.send(stalled, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        self.send(trickle, b"POST /v1/chat/completions HTTP/1.1\r\n")
        t0 = time.time()
        out = {}
        trickling = threading.Event()

        def trickler():
            line = b"X-Slow: 1\r\n"
            i = 0
            while time.time() - t0 < IDLE_TIMEOUT_S + 20 and "trickle" not in out:
                try:
                    trickle.sendall(line[i % len(line):i % len(line) + 1])
                except OSError:
                    return
                i += 1
                if i == 2:
                    trickling.set()  # two bytes apart: it is trickling
                time.sleep(3)

        def reader(name, s):
            st, raw = read_status(s, IDLE_TIMEOUT_S + 25)
            out[name] = (st, raw, time.time() - t0)

        ts = [threading.Thread(target=trickler), threading.Thread(target=reader,
                                                                  args=("stalled", stalled)),
              threading.Thread(target=reader, args=("trickle", trickle))]
        for t in ts:
            t.start()
        self.assertTrue(trickling.wait(30), "the trickler never sent its second byte")
        self.assertStillServes()
        for t in ts:
            t.join(IDLE_TIMEOUT_S + 40)
        st, raw, took = out["stalled"]
        self.assertEqual(st, 408, raw[:300])
        self.assertJsonError(raw, 408)
        self.assertLess(took, IDLE_TIMEOUT_S + 10)
        st, raw, took = out["trickle"]
        self.assertEqual(st, 408, f"a slow-loris client trickling a header line every 3 s "
                                  f"was not timed out after {took:.0f}s: {raw[:200]!r}")
        self.assertLess(took, IDLE_TIMEOUT_S + 10)
        self.assertStillServes()

    def test_huge_header_is_431(self):
        s = self.conn()
        self.send(s, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (70 << 10) +
                  b"\r\n\r\n")
        st, raw = read_status(s, 10)
        self.assertEqual(st, 431, raw[:300])
        self.assertJsonError(raw, 431)
        # A head that never ends gets the same.
        s = self.conn()
        self.send(s, b"GET /v1/models HTTP/1.1\r\n" + b"X-A: b\r\n" * 10000)
        st, raw = read_status(s, 10)
        self.assertEqual(st, 431, raw[:300])
        self.assertStillServes()

    def test_too_many_headers_is_431(self):
        s = self.conn()
        head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(
            b"X-H%d: %d\r\n" % (i, i) for i in range(150)) + b"\r\n"
        self.send(s, head)
        st, raw = read_status(s, 10)
        self.assertEqual(st, 431, raw[:300])
        self.assertJsonError(raw, 431)
        self.assertStillServes()

    def test_body_over_limit_is_413(self):
        auth = b"Authorization: Bearer " + th.TEST_TOKEN.encode() + b"\r\n"
        # Announced too large: refused before the body is read.
        s = self.conn()
        self.send(s, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth +
                  b"Content-Length: %d\r\n\r\n" % (2 << 20) + b"{" * 1000)
        st, raw = read_status(s, 10)
        self.assertEqual(st, 413, raw[:300])
        self.assertJsonError(raw, 413)
        # Chunked, growing past the limit.
        s = self.conn()
        self.send(s, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth +
                  b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        for _ in range(20):
            self.send(s, b"10000\r\n" + chunk + b"\r\n")
        self.send(s, b"0\r\n\r\n")
        st, raw = read_status(s, 10)
        self.assertEqual(st, 413, raw[:300])
        # Anthropic's route answers in its own shape.
        s = self.conn()
        self.send(s, b"POST /anthropic/v1/messages HTTP/1.1\r\nHost: x\r\n" + auth +
                  b"Content-Length: %d\r\n\r\n" % (5 << 20))
        st, raw = read_status(s, 10)
        self.assertEqual(st, 413, raw[:300])
        err = json.loads(raw.split(b"\r\n\r\n", 1)[1])
        self.assertEqual(err["type"], "error")
        self.assertEqual(err["error"]["type"], "request_too_large")
        self.assertStillServes()


class ConnectionLimit(unittest.TestCase):
    LIMIT = 1024  # http_server_default_limits()

    def test_over_the_limit_is_503_then_recovers(self):
        llama = th.LlamaServer(slots=1, ctx=512)
        toki = th.Toki([llama])
        socks = []
        try:
            for _ in range(self.LIMIT):
                socks.append(socket.create_connection(("127.0.0.1", toki.port), timeout=10))
            # All accepted: connections are accepted in order, so once the
            # last one is answered, every one before it holds its place.
            socks[-1].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            st, raw = read_status(socks[-1], 10)
            self.assertEqual(st, 200, raw[:300])
            extra = socket.create_connection(("127.0.0.1", toki.port), timeout=10)
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            st, raw = read_status(extra, 10)
            self.assertEqual(st, 503, raw[:300])
            self.assertIn(b"too many connections", raw)
            extra.close()
            # The ones inside are served.
            socks[0].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            st, raw = read_status(socks[0], 10)
            self.assertEqual(st, 200, raw[:300])
        finally:
            for s in socks:
                s.close()
        try:
            deadline = time.time() + 10
            st = None
            while time.time() < deadline:
                try:
                    st, _ = th.request(toki.port, "GET", "/health", timeout=5)
                    if st == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.2)
            self.assertEqual(st, 200)
            st, body = toki.chat([{"role": "user", "content": "back"}], max_tokens=2)
            self.assertEqual(st, 200, body)
            self.assertIsNone(toki.proc.poll())
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()


if __name__ == "__main__":
    th.run_tests()
