"""A hand-made misbehaving llama-server, for the faults a real one cannot be
made to show on demand. Standard library only.

It stands in front of a real llama-server (`upstream`) and passes every
request through to it -- so toki's discovery, health checks, /apply-template
and /tokenize see the real thing -- except the generation routes
(POST /v1/chat/completions, /v1/completions, /completion, /v1/responses),
where it does what `mode` says:

  pass           forward to the upstream, as a proxy (the default); with
                 `event_delay` set, a stream's events are paced that far apart
  stall_headers  send the response head (200, chunked event-stream or JSON),
                 then nothing, ever: the connection stays open
  stall_mid      forward `events` SSE events of the real stream, then stall
  garbage        answer random bytes that are not HTTP at all, then close
  garbage_http   a valid 200 head, then a body of random bytes (for a stream:
                 `events` real events, then random bytes as chunk data)
  broken_sse     forward `events` real events, then a malformed chunk-size
                 line, then close
  cut_sse        forward `events` real events, then half a chunk, then close
  close          accept the request and close without a byte (before the
                 first byte)

and two that only touch a POST /completion whose grammar forces token ids
(`<[id]>`, exact mode's forced runs), passing everything else through:

  no_token_grammar  answer 400, as a llama-server older than token-id
                    grammars does
  grammar_ignored   forward it without its grammar: the server generates
                    what it likes, as one that ignores the field would

and one that plays another client of the real server:

  intrude           before each of the next `intrusions` requests of toki's
                    self-test (a POST /completion of token ids with n_probs
                    and id_slot), runs a short request of its own on the real
                    server, to its end, then forwards the test's: on the slot
                    after the one the test's names (`intrude_slot` "other",
                    of `intrude_slots`), or on that slot before a step that
                    reuses its cache ("same"). `intruded` lists the slots.
                    With `intrude_hold`, the request is a stream that runs
                    beside the test's until release() (n_predict -1: the
                    server needs --context-shift), as an agent's does.

`mode` and `events` may be changed while it runs. `grammar_runs` counts the
requests those two touched. `seen` lists the
(method, path) of every request; `fault_conns` counts connections that got a
fault, and `closed_by_peer` how many of the stalled ones toki closed (it
must: that is how a stalled backend request is cancelled).

Run by hand: python3 slow_backend.py --upstream http://127.0.0.1:8080 --mode stall_headers
"""
import argparse
import http.client
import json
import os
import random
import socket
import threading
import time
import urllib.parse

GRAMMAR_MODES = ("no_token_grammar", "grammar_ignored")
FAULT_PATHS = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions",
               "/completion", "/v1/responses")


class SlowBackend:
    def __init__(self, upstream, mode="pass", events=3, port=0, seed=1):
        u = urllib.parse.urlparse(upstream)
        self.up_host, self.up_port = u.hostname, u.port
        self.mode = mode
        self.events = events
        self.event_delay = 0.0  # pass mode: seconds between forwarded events (0: as they come)
        self.seen = []
        self.fault_conns = 0
        self.closed_by_peer = 0
        self.grammar_runs = 0
        self.intrusions = 0
        self.intrude_slot = "other"
        self.intrude_slots = 2
        self.intruded = []
        self.intrude_hold = False
        self._released = threading.Event()
        self.rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conns = set()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ lifecycle

    def close(self):
        self._stop.set()
        try:
            self.sock.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass

    def kill(self, *a):  # the harness's Process interface
        self.close()

    def _accept(self):
        while not self._stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    # ------------------------------------------------------------ one connection

    def _serve(self, c):
        try:
            while not self._stop.is_set():
                req = self._read_request(c)
                if req is None:
                    return
                method, path, headers, body = req
                with self._lock:
                    self.seen.append((method, path))
                route = path.split("?", 1)[0]
                if method == "POST" and route == "/completion" and self.mode in GRAMMAR_MODES:
                    body = self._token_grammar(c, body)
                    if body is None:
                        continue
                elif method == "POST" and route == "/completion" and self.mode == "intrude":
                    self._intrude(body)
                elif (method == "POST" and route in FAULT_PATHS and self.mode != "pass" and
                      self.mode != "intrude" and self.mode not in GRAMMAR_MODES):
                    with self._lock:
                        self.fault_conns += 1
                    self._fault(c, route, body)
                    return
                if not self._forward(c, method, path, headers, body):
                    return
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns.discard(c)
            try:
                c.close()
            except OSError:
                pass

    def _read_request(self, c):
        buf = b""
        while b"\r\n\r\n" not in buf:
            d = c.recv(65536)
            if not d:
                return None
            buf += d
        head, rest = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0") or 0)
        while len(rest) < n:
            d = c.recv(65536)
            if not d:
                return None
            rest += d
        return method, path, headers, rest[:n]

    def _forward(self, c, method, path, headers, body):
        up = http.client.HTTPConnection(self.up_host, self.up_port, timeout=600)
        h = {k: v for k, v in headers.items()
             if k not in ("host", "connection", "content-length", "transfer-encoding")}
        up.request(method, path, body=body if body else None, headers=h)
        r = up.getresponse()
        out = [f"HTTP/1.1 {r.status} {r.reason}"]
        for k, v in r.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection",
                                 "keep-alive"):
                out.append(f"{k}: {v}")
        streaming = "event-stream" in (r.getheader("Content-Type") or "")
        if streaming:
            out.append("Transfer-Encoding: chunked")
            c.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
            buf = b""
            while True:
                d = r.read1(65536)
                if not d:
                    break
                if not self.event_delay:
                    c.sendall(b"%x\r\n" % len(d) + d + b"\r\n")
                    continue
                # Paced: one event at a time, so that a stream lasts as long
                # as a test needs whatever the machine's speed.
                buf += d
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    ev += b"\n\n"
                    c.sendall(b"%x\r\n" % len(ev) + ev + b"\r\n")
                    time.sleep(self.event_delay)
            if buf:
                c.sendall(b"%x\r\n" % len(buf) + buf + b"\r\n")
            c.sendall(b"0\r\n\r\n")
        else:
            data = r.read()
            out.append(f"Content-Length: {len(data)}")
            c.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + data)
        up.close()
        return True

    # ------------------------------------------------------------ faults

    def _token_grammar(self, c, body):
        """The body to forward, or None when answered here."""
        req = json.loads(body or b"{}")
        if "<[" not in req.get("grammar", ""):
            return body
        with self._lock:
            self.grammar_runs += 1
        if self.mode == "grammar_ignored":
            del req["grammar"]
            return json.dumps(req).encode()
        msg = json.dumps({"error": {"code": 400, "message": "Failed to parse grammar",
                                    "type": "invalid_request_error"}}).encode()
        c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(msg) + msg)
        return None

    def _intrude(self, body):
        """Another client's request on the real server, run to its end
        before a request of the self-test (mode intrude)."""
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            return
        if not (isinstance(req.get("prompt"), list) and "n_probs" in req and "id_slot" in req):
            return
        slot = req["id_slot"]
        if self.intrude_slot == "same":
            if not req.get("cache_prompt"):
                return
        else:
            slot = (slot + 1) % self.intrude_slots
        with self._lock:
            if self.intrusions <= 0:
                return
            self.intrusions -= 1
            self.intruded.append(slot)
        if self.intrude_hold:
            started = threading.Event()
            threading.Thread(target=self._held_client, args=(slot, started), daemon=True).start()
            started.wait(60)
            return
        up = http.client.HTTPConnection(self.up_host, self.up_port, timeout=600)
        up.request("POST", "/completion", body=json.dumps({
            "prompt": "Once upon a time, a cat sat on a mat.", "n_predict": 2,
            "id_slot": slot, "cache_prompt": True}),
            headers={"Content-Type": "application/json"})
        up.getresponse().read()
        up.close()

    def _held_client(self, slot, started):
        """A stream on the real server that runs until release()."""
        up = http.client.HTTPConnection(self.up_host, self.up_port, timeout=600)
        up.request("POST", "/completion", body=json.dumps({
            "prompt": "Once upon a time", "n_predict": -1, "stream": True, "id_slot": slot,
            "cache_prompt": False}), headers={"Content-Type": "application/json"})
        r = up.getresponse()
        r.read1(65536)  # its first event: the server runs it
        started.set()
        while not self._released.is_set() and not self._stop.is_set():
            if not r.read1(65536):
                break
        up.close()  # the server stops it at its next write

    def release(self):
        """Ends the streams intrude_hold started."""
        self._released.set()

    def _stall(self, c):
        """Send nothing more; return when the peer closes (or we stop)."""
        c.settimeout(0.2)
        while not self._stop.is_set():
            try:
                d = c.recv(4096)
                if not d:
                    with self._lock:
                        self.closed_by_peer += 1
                    return
            except socket.timeout:
                continue
            except OSError:
                with self._lock:
                    self.closed_by_peer += 1
                return

    def _upstream_events(self, route, body, n):
        """The real stream's events up to its n-th content event. Progress
        events (toki asks for them with return_progress) pass along but do
        not count: `events` means what the client would see."""
        up = http.client.HTTPConnection(self.up_host, self.up_port, timeout=600)
        up.request("POST", route, body=body,
                   headers={"Content-Type": "application/json"})
        r = up.getresponse()
        events, buf, counted = [], b"", 0
        while counted < n:
            d = r.read1(65536)
            if not d:
                break
            buf += d
            while b"\n\n" in buf and counted < n:
                ev, buf = buf.split(b"\n\n", 1)
                events.append(ev + b"\n\n")
                if b'"prompt_progress"' not in ev:
                    counted += 1
        up.close()  # the upstream request is cancelled
        return events

    def _fault(self, c, route, body):
        mode = self.mode
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            req = {}
        stream = bool(req.get("stream"))
        sse_head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n")
        if mode == "close":
            c.shutdown(socket.SHUT_RDWR)
            return
        if mode == "garbage":
            c.sendall(bytes(self.rng.randrange(256) for _ in range(512)))
            return
        if mode == "stall_headers":
            if stream:
                c.sendall(sse_head)
            else:
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 4096\r\n\r\n{\"choices\":")
            self._stall(c)
            return
        if mode == "garbage_http" and not stream:
            junk = bytes(self.rng.randrange(256) for _ in range(300))
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                      + str(len(junk)).encode() + b"\r\n\r\n" + junk)
            return
        # The stream modes: some real events first (the request made
        # streaming, so the upstream answers with events).
        req["stream"] = True
        events = self._upstream_events(route, json.dumps(req).encode(), self.events)
        c.sendall(sse_head)
        for ev in events:
            c.sendall(b"%x\r\n" % len(ev) + ev + b"\r\n")
        if mode == "stall_mid":
            self._stall(c)
        elif mode == "garbage_http":
            junk = bytes(self.rng.randrange(256) for _ in range(300))
            junk = b"data: " + junk.replace(b"\r", b"").replace(b"\n", b"") + b"\n\n"
            c.sendall(b"%x\r\n" % len(junk) + junk + b"\r\n")
            for _ in range(3):
                j = bytes(self.rng.randrange(256) for _ in range(64))
                c.sendall(b"%x\r\n" % len(j) + j + b"\r\n")
            c.sendall(b"0\r\n\r\n")
        elif mode == "broken_sse":
            c.sendall(b"zz-not-a-size\r\ndata: {\"oops\r\n")
        elif mode == "cut_sse":
            c.sendall(b"400\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"hal")
        c.shutdown(socket.SHUT_RDWR)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--mode", default="pass")
    ap.add_argument("--events", type=int, default=3)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    b = SlowBackend(a.upstream, a.mode, a.events, a.port)
    print(f"listening on {b.url} (mode {a.mode})", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        b.close()


if __name__ == "__main__":
    main()
