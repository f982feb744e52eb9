"""Shared pieces of the benchmarks: the integration harness (a real
llama-server and a real `toki serve`), keep-alive HTTP clients, a streaming
chat client that measures time to first token, statistics and markdown.
Python 3 standard library only."""
import http.client
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(BENCH_DIR)
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "integration"))

_private_bin = None


def use_toki_binary(path):
    """Copies the toki binary aside so a rebuild during the run cannot swap it
    out from under the benchmarks, and points the harness at the copy."""
    global _private_bin
    d = tempfile.mkdtemp(prefix="toki-bench-")
    _private_bin = os.path.join(d, "toki")
    shutil.copy2(path, _private_bin)
    os.environ["TOKI_BIN"] = _private_bin
    import toki_harness
    toki_harness.TOKI_BIN = _private_bin
    return _private_bin


def harness():
    import toki_harness
    return toki_harness


# ---- HTTP ----

class Client:
    """One keep-alive HTTP/1.1 connection; reconnects once if the server
    closed it between requests."""

    def __init__(self, port, timeout=600):
        self.port = port
        self.timeout = timeout
        self.conn = None

    def _conn(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        return self.conn

    def close(self):
        if self.conn:
            self.conn.close()
            self.conn = None

    def _send(self, method, path, body):
        data = None if body is None else json.dumps(body)
        h = {"Content-Type": "application/json", "Connection": "keep-alive"}
        token = getattr(harness(), "TEST_TOKEN", None)
        if token:  # toki's local token (the harness starts toki with it); llama-server ignores it
            h["Authorization"] = "Bearer " + token
        for attempt in (0, 1):
            try:
                c = self._conn()
                c.request(method, path, body=data, headers=h)
                return c.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                    http.client.CannotSendRequest):
                self.close()
                if attempt:
                    raise

    def json(self, method, path, body=None):
        resp = self._send(method, path, body)
        text = resp.read()
        if resp.getheader("Connection", "").lower() == "close":
            self.close()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text.decode("utf-8", "replace")

    def stream_chat(self, body):
        """POSTs a streamed chat completion. Returns a dict: status, text (the
        concatenated content), ttft (seconds to the first non-empty content
        delta; the end of the stream if none came), total (seconds), timings
        and cache (from the final chunk), route (toki's leading comment)."""
        body = dict(body, stream=True)
        t0 = time.perf_counter()
        resp = self._send("POST", "/v1/chat/completions", body)
        out = {"status": resp.status, "text": "", "ttft": None, "timings": None, "cache": None,
               "route": None, "usage": None}
        if resp.status != 200:
            out["error"] = resp.read().decode("utf-8", "replace")
            self.close()
            out["total"] = time.perf_counter() - t0
            out["ttft"] = out["total"]  # numbers, as on success: callers add to them
            return out
        parts = []
        logprobs = []
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.decode("utf-8", "replace").rstrip("\r\n")
            if line.startswith(": toki"):
                out["route"] = line[2:]
                continue
            if not line.startswith("data:"):
                continue
            d = line[5:].strip()
            if d == "[DONE]":
                continue
            j = json.loads(d)
            for ch in j.get("choices", []):
                c = (ch.get("delta") or {}).get("content")
                if c:
                    if out["ttft"] is None:
                        out["ttft"] = time.perf_counter() - t0
                    parts.append(c)
                for t in ((ch.get("logprobs") or {}).get("content") or []):
                    logprobs.append(t.get("logprob"))
            if "timings" in j:
                out["timings"] = j["timings"]
            if "cache" in j:
                out["cache"] = j["cache"]
            if j.get("usage"):
                out["usage"] = j["usage"]
        out["total"] = time.perf_counter() - t0
        if out["ttft"] is None:
            out["ttft"] = out["total"]
        out["text"] = "".join(parts)
        out["logprobs"] = logprobs
        if resp.getheader("Connection", "").lower() == "close":
            self.close()
        return out


def stream_chat_retrying(client, body, attempts=40, delay=0.25):
    """Client.stream_chat, retried (after `delay` seconds) when the answer is a
    502/503 before any content, as an agent harness retries a failed request.
    The result's ttft and total count from the first attempt; `failures` lists
    the failed attempts' errors."""
    t0 = time.perf_counter()
    failures = []
    for _ in range(attempts):
        t1 = time.perf_counter()
        r = client.stream_chat(body)
        if r["status"] in (502, 503) and not r["text"]:
            failures.append(f"{r['status']} {r.get('error', '')[:120]}")
            time.sleep(delay)
            continue
        shift = t1 - t0
        r["ttft"] += shift
        r["total"] += shift
        r["failures"] = failures
        return r
    r["failures"] = failures
    return r


def tokenize_chat(client, messages):
    """The prompt tokens the server evaluates for a chat request: its own
    chat template, then /tokenize with special tokens, as toki does."""
    st, t = client.json("POST", "/apply-template", {"messages": messages})
    if st != 200:
        raise RuntimeError(f"apply-template: {st} {t}")
    st, tok = client.json("POST", "/tokenize", {"content": t["prompt"], "add_special": True,
                                                "parse_special": True})
    if st != 200:
        raise RuntimeError(f"tokenize: {st} {tok}")
    return tok["tokens"]


def lcp(a, b):
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: most shared prefixes are long.
    step = 256
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefix_limit(token_lists):
    """Sum over requests of the tokens no earlier request could have left in
    a cache: n_i - max_j<i LCP(t_i, t_j), at least 1 each (the server always
    evaluates at least the last prompt token)."""
    total = 0
    per = []
    for i, t in enumerate(token_lists):
        best = 0
        for j in range(i):
            best = max(best, lcp(t, token_lists[j]))
        v = max(1, len(t) - best)
        per.append(v)
        total += v
    return total, per


# ---- processes ----

def proc_status(pid):
    """VmRSS and VmHWM of a process, in KiB."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    k, v = line.split(":", 1)
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def stop(*procs):
    """Stops toki processes with SIGTERM and llama-servers with SIGKILL."""
    import signal
    th = harness()
    for p in procs:
        if p is None:
            continue
        try:
            if isinstance(p, th.Toki):
                p.kill(signal.SIGTERM)
            else:
                p.kill()
        except Exception as e:  # keep tearing down the rest
            print(f"warning: could not stop {p}: {e}", file=sys.stderr)


# ---- machine ----

def machine_info(toki_bin):
    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                info["cpu"] = line.split(":", 1)[1].strip()
    except OSError:
        pass
    info["cores"] = os.cpu_count()
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["ram_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    def git(*a):
        # Only the end stripped: a porcelain line begins with its status,
        # whose first column may be a space.
        return subprocess.run(["git", "-C", SOURCE_DIR] + list(a), capture_output=True,
                              text=True).stdout.rstrip()
    info["commit"] = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    info["dirty"] = bool(dirty)
    info["dirty_files"] = [l[3:] for l in dirty.splitlines()]
    th = harness()
    ls = th.llama_server_path()
    v = subprocess.run([ls, "--version"], capture_output=True, text=True)
    info["llama_server"] = " ".join((v.stderr + v.stdout).split())
    tv = subprocess.run([toki_bin, "version"], capture_output=True, text=True)
    info["toki_version"] = (tv.stdout + tv.stderr).strip()
    import hashlib
    with open(toki_bin, "rb") as f:
        info["toki_sha256"] = hashlib.sha256(f.read()).hexdigest()[:16]
    info["loadavg_start"] = loadavg()
    return info


# ---- statistics and output ----

def pct(values, p):
    """Percentile by linear interpolation between closest ranks."""
    v = sorted(values)
    if not v:
        return float("nan")
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * p / 100.0
    f = int(k)
    c = min(f + 1, len(v) - 1)
    return v[f] + (v[c] - v[f]) * (k - f)


def median(values):
    return pct(values, 50)


def table(headers, rows):
    def cell(x):
        if isinstance(x, float):
            if x != x:
                return "n/a"
            return f"{x:.2f}" if abs(x) < 100 else f"{x:.0f}"
        return str(x)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(cell(x) for x in r) + " |")
    return "\n".join(lines)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- a light asyncio client for many concurrent streams ----

async def async_stream_chat(conn, port, body, timeout):
    """One streamed chat on an asyncio keep-alive connection. `conn` is a
    dict holding 'r'/'w' (opened here on first use). Returns the same dict as
    Client.stream_chat (status, text, ttft, total, timings, cache)."""
    import asyncio
    t0 = time.perf_counter()
    out = {"status": 0, "text": "", "ttft": None, "timings": None, "cache": None, "route": None}

    async def run():
        if conn.get("w") is None:
            conn["r"], conn["w"] = await asyncio.open_connection("127.0.0.1", port)
        r, w = conn["r"], conn["w"]
        data = json.dumps(dict(body, stream=True)).encode()
        token = getattr(harness(), "TEST_TOKEN", None)
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                f"Connection: keep-alive\r\n" +
                (f"Authorization: Bearer {token}\r\n" if token else "") + "\r\n")
        w.write(head.encode() + data)
        await w.drain()
        status_line = await r.readline()
        if not status_line:
            raise ConnectionError("connection closed before a response")
        out["status"] = int(status_line.split()[1])
        headers = {}
        while True:
            line = await r.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        parts = []
        buf = b""

        def feed(chunk):
            nonlocal buf
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.decode("utf-8", "replace").rstrip("\r")
                if line.startswith(": toki"):
                    out["route"] = line[2:]
                if not line.startswith("data:"):
                    continue
                d = line[5:].strip()
                if d == "[DONE]":
                    continue
                try:
                    j = json.loads(d)
                except ValueError:
                    continue
                for ch in j.get("choices", []):
                    c = (ch.get("delta") or {}).get("content")
                    if c:
                        if out["ttft"] is None:
                            out["ttft"] = time.perf_counter() - t0
                        parts.append(c)
                if "timings" in j:
                    out["timings"] = j["timings"]
                if "cache" in j:
                    out["cache"] = j["cache"]
                if "error" in j:
                    out["error"] = j["error"]

        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await r.readline()
                if not size_line:
                    raise ConnectionError("connection closed inside a chunked body")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await r.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunk = await r.readexactly(size + 2)
                feed(chunk[:-2])
        else:
            n = int(headers.get("content-length", "0"))
            body_bytes = await r.readexactly(n) if n else b""
            if out["status"] != 200:
                out["error"] = body_bytes.decode("utf-8", "replace")
            else:
                feed(body_bytes + b"\n")
        if headers.get("connection", "").lower() == "close":
            w.close()
            conn["w"] = None
        out["text"] = "".join(parts)

    async def run_retrying():
        # llama-server (build 11669) closes the connection after every streamed
        # response without saying so: a reused connection that ends before a
        # status line is retried once on a fresh one, as HTTP clients do.
        reused = conn.get("w") is not None
        try:
            await run()
        except (ConnectionError, asyncio.IncompleteReadError):
            if not reused or out["status"]:
                raise
            if conn.get("w") is not None:
                conn["w"].close()
            conn["w"] = None
            conn["retries"] = conn.get("retries", 0) + 1
            await run()

    try:
        await asyncio.wait_for(run_retrying(), timeout)
    except BaseException:
        if conn.get("w") is not None:
            conn["w"].close()
            conn["w"] = None
        raise
    out["total"] = time.perf_counter() - t0
    if out["ttft"] is None:
        out["ttft"] = out["total"]
    return out


# ---- cancelled streams, headers, settling ----

def stream_chat_cancel(port, body, after_tokens=None, after_s=None, timeout=600):
    """POSTs a streamed chat and closes the connection as a client that gives
    up does: after `after_tokens` content deltas (a cancel during generation)
    or `after_s` seconds if no content came by then (a cancel during prefill).
    Returns a dict: status, tokens (content deltas seen), text, closed_at
    (seconds from the request), route (toki's leading comment, if it came)."""
    import select
    import socket
    body = dict(body, stream=True)
    data = json.dumps(body).encode()
    token = getattr(harness(), "TEST_TOKEN", None)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n" +
            (f"Authorization: Bearer {token}\r\n" if token else "") + "\r\n")
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    t0 = time.perf_counter()
    s.sendall(head.encode() + data)
    out = {"status": None, "tokens": 0, "text": "", "route": None, "closed_at": None}
    buf = b""
    deadline = None if after_s is None else t0 + after_s
    try:
        while True:
            wait = timeout if deadline is None else max(0.0, deadline - time.perf_counter())
            if deadline is not None and wait <= 0:
                break
            r, _, _ = select.select([s], [], [], wait)
            if not r:
                if deadline is not None:
                    break
                continue
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            if out["status"] is None and b"\r\n" in buf:
                out["status"] = int(buf.split(b"\r\n", 1)[0].split()[1])
            for line in buf.decode("utf-8", "replace").split("\n"):
                if line.startswith(": toki"):
                    out["route"] = line[2:].strip()
            n = 0
            text = []
            for line in buf.decode("utf-8", "replace").split("\n"):
                line = line.strip()
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                try:
                    j = json.loads(line[5:].strip())
                except ValueError:
                    continue
                for ch in j.get("choices", []):
                    c = (ch.get("delta") or {}).get("content")
                    if c:
                        n += 1
                        text.append(c)
            out["tokens"], out["text"] = n, "".join(text)
            if after_tokens is not None and n >= after_tokens:
                break
            if after_s is not None and n:  # content came before the prefill deadline
                break
    finally:
        out["closed_at"] = time.perf_counter() - t0
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
    return out


def header_tokens(client, messages):
    """Tokens of the generation prompt (the assistant header) for a chat: the
    prompt with it minus the prompt without it, by the server's template."""
    with_h = tokenize_chat(client, messages)
    st, t = client.json("POST", "/apply-template", {"messages": messages,
                                                    "add_generation_prompt": False})
    st, tok = client.json("POST", "/tokenize", {"content": t["prompt"], "add_special": True,
                                                "parse_special": True})
    return len(with_h) - len(tok["tokens"])


def wait_idle(port, timeout=60):
    """Waits until llama-server's /slots says no slot is processing (a
    cancelled request has been let go), or the timeout; returns seconds."""
    t0 = time.perf_counter()
    c = Client(port, timeout=10)
    try:
        while time.perf_counter() - t0 < timeout:
            try:
                st, j = c.json("GET", "/slots")
            except Exception:
                st, j = 0, None
            if st == 200 and isinstance(j, list) and not any(s.get("is_processing") for s in j):
                break
            time.sleep(0.05)
    finally:
        c.close()
    return time.perf_counter() - t0


def answer_of(res):
    """(text, logprobs) of a streamed or a plain chat answer, for identity."""
    if "choices" in res:
        ch = res["choices"][0]
        return (ch["message"]["content"],
                [t.get("logprob") for t in ((ch.get("logprobs") or {}).get("content") or [])])
    return res["text"], res.get("logprobs")
