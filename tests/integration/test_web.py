"""`toki web` in front of a real `toki serve` and llama-server, driven by
headless Chromium (Debian's, via playwright-core: tests/web/web_test.js):
a turn in each mode with its numbers and the chart, the session secret, the
Host check, HTTPS with streaming, the daemon down, and the daemon's token
never reaching the browser.

Needs /usr/bin/chromium, node >= 20 and tests/web's packages:
scripts/install-test-browser.sh installs them (it runs from here).
TOKI_WEB_SCREENSHOT: where the chat screenshot goes (default web-screenshot.png in the
test work directory; the README's docs/web-screenshot.png is updated only on purpose,
with TOKI_WEB_SCREENSHOT=docs/web-screenshot.png).
"""
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th

# Long enough that prefilling it is visible next to a cached turn.
SYSTEM = " ".join(
    f"Rule {i}: you are a patient storyteller who talks about the little cat Tom, his friend "
    f"the big brown dog who lives by the river, the old oak tree number {i}, the red boat, "
    f"and the birds that sing in the morning near the farm."
    for i in range(40))
PROMPTS = [
    ["raw", "Tell me a story about Tom."],
    ["cached", "What happened next?"],
    ["compare", "And how did it end?"],
]
WEB_JS = os.path.join(th.SOURCE_DIR, "tests", "web", "web_test.js")
_node_path = None


def node_path():
    global _node_path
    if _node_path is None:
        out = subprocess.run([os.path.join(th.SOURCE_DIR, "scripts", "install-test-browser.sh")],
                             check=True, capture_output=True, text=True)
        _node_path = out.stdout.strip().splitlines()[-1]
    return _node_path


def browse(config, timeout=600):
    """Runs the browser script; returns what it saw (a dict)."""
    env = dict(os.environ, NODE_PATH=node_path())
    with tempfile.TemporaryDirectory(prefix="toki-web-out-") as d:
        out = os.path.join(d, "seen.json")
        # Its progress goes straight to the test's log; what it saw, to a file.
        p = subprocess.run(["node", WEB_JS, json.dumps(dict(config, out=out))],
                           stdin=subprocess.DEVNULL, env=env, timeout=timeout)
        if p.returncode != 0:
            raise AssertionError(f"the browser script failed ({p.returncode}); its log is above")
        with open(out) as f:
            return json.load(f)


class Web(th.Process):
    """A real `toki web`; .url is the link it prints (with the secret)."""

    def __init__(self, daemon_url, extra=(), env=None):
        e = dict(os.environ)
        e.update(env or {})
        args = [th.TOKI_BIN, "web", "--port", "0", "--url", daemon_url] + list(extra)
        super().__init__(args, f"web-{os.getpid()}-{id(self)}.log", env=e)
        lines = []
        for _ in range(3):
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
        opens = [l for l in lines if l.startswith("toki web: open ")]
        if not opens:
            self.kill()
            raise RuntimeError("toki web did not start: " + "\n".join(lines) + self.log_text())
        self.url = opens[0][len("toki web: open "):]
        self.base = self.url.split("/#", 1)[0]
        self.secret = self.url.split("#k=", 1)[1]
        self.port = int(self.base.rsplit(":", 1)[1])
        self.tls = self.base.startswith("https:")

    def get(self, path, headers=None, method="GET", body=None):
        if self.tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=120, context=ctx)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read().decode("utf-8", "replace")
        ctype = resp.getheader("Content-Type") or ""
        conn.close()
        return resp.status, data, ctype

    def auth(self):
        return {"Authorization": "Bearer " + self.secret}


class WebUI(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        node_path()  # install the browser first: a missing one fails early and clearly
        model = th.generated_model("web", params="4M", ctx=8192)
        cls.llama = th.LlamaServer(model=model, slots=2, ctx=8192, name="llama-web")
        cls.toki = th.Toki([cls.llama], name="toki-web")
        cls.daemon = f"http://127.0.0.1:{cls.toki.port}"
        cls.web = Web(cls.daemon + "/v1")
        cls.tmp = tempfile.mkdtemp(prefix="toki-web-test-")

    @classmethod
    def tearDownClass(cls):
        cls.web.kill(signal.SIGTERM)
        cls.toki.kill(signal.SIGTERM)
        cls.llama.kill()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    # ---- without a browser ----

    def test_api_needs_the_session_secret(self):
        st, body, _ = self.web.get("/api/info")
        self.assertEqual(st, 401, body)
        self.assertIn("session secret", json.loads(body)["error"]["message"])
        st, _, _ = self.web.get("/api/info", {"Authorization": "Bearer " + "0" * 64})
        self.assertEqual(st, 401)
        # Not even the daemon's own token opens toki web.
        st, _, _ = self.web.get("/api/v1/models", {"Authorization": "Bearer " + th.TEST_TOKEN})
        self.assertEqual(st, 401)
        st, _, _ = self.web.get("/api/v1/chat/completions", method="POST", body="{}")
        self.assertEqual(st, 401)
        st, body, _ = self.web.get("/api/info", self.web.auth())
        self.assertEqual(st, 200, body)
        self.assertEqual(json.loads(body)["daemon"], self.daemon)
        # The page itself needs no secret and holds none.
        for path in ("/", "/app.js", "/style.css"):
            st, body, _ = self.web.get(path)
            self.assertEqual(st, 200, path)
            self.assertNotIn(th.TEST_TOKEN, body)
            self.assertNotIn(self.web.secret, body)
        # Only the UI's routes are relayed.
        st, _, _ = self.web.get("/api/v1/completions", self.web.auth(), method="POST", body="{}")
        self.assertEqual(st, 404)
        st, _, _ = self.web.get("/api/slots", self.web.auth())
        self.assertEqual(st, 404)

    def test_wrong_host_is_refused(self):
        port = self.web.port
        for host in (f"evil.example:{port}", f"127.0.0.1.nip.io:{port}", "127.0.0.1:1", ""):
            st, body, _ = self.web.get("/", {"Host": host})
            self.assertEqual(st, 403, host)
            st, body, _ = self.web.get("/api/info", dict(self.web.auth(), Host=host))
            self.assertEqual(st, 403, host)
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
            st, _, _ = self.web.get("/api/info", dict(self.web.auth(), Host=host))
            self.assertEqual(st, 200, host)
        # A cross-origin page cannot use the API even with the secret.
        st, _, _ = self.web.get("/api/v1/chat/completions",
                                dict(self.web.auth(), Origin="http://evil.example"),
                                method="POST", body="{}")
        self.assertEqual(st, 403)

    def test_stream_is_relayed_with_the_cache_block(self):
        body = json.dumps({"messages": [{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": "Hello"}],
                           "stream": True, "max_tokens": 8, "temperature": 0})
        st, text, ctype = self.web.get("/api/v1/chat/completions",
                                       dict(self.web.auth(), **{"Content-Type": "application/json"}),
                                       method="POST", body=body)
        self.assertEqual(st, 200, text)
        self.assertTrue(ctype.startswith("text/event-stream"), ctype)
        self.assertIn(": toki route=", text)
        events = [e for e in text.split("\n\n") if e.strip()]
        caches = [th.event_json(e)["cache"] for e in events
                  if th.event_json(e) and "cache" in th.event_json(e)]
        self.assertEqual(len(caches), 1)
        self.assertTrue(text.rstrip().endswith("data: [DONE]"))

    def test_browser_leaving_cancels_the_generation(self):
        import socket
        import time
        body = json.dumps({"messages": [{"role": "user", "content": "Go on forever."}],
                           "stream": True, "max_tokens": 4000, "ignore_eos": True,
                           "temperature": 0})
        s = socket.create_connection(("127.0.0.1", self.web.port), timeout=60)
        s.sendall((f"POST /api/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{self.web.port}\r\n"
                   f"Authorization: Bearer {self.web.secret}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n{body}").encode())

        def busy():
            st, slots = th.request(self.llama.port, "GET", "/slots")
            return st == 200 and any(x.get("is_processing") for x in slots)
        got = b""
        while b"delta" not in got:
            chunk = s.recv(65536)
            self.assertTrue(chunk, "the stream ended early")
            got += chunk
        # Relayed as it came: the first delta is here while the server is
        # still generating (a proxy that held the stream back would pass it
        # on after the last of the 4000 tokens, and a slower machine only
        # makes the generation longer).
        self.assertTrue(busy(), "the first delta came after the generation ended")
        s.close()  # the browser goes away mid-answer
        # The first idle look is the event: the generation ran without a
        # gap until it stopped. A later look may catch toki's own short
        # step after a cancel (the tail cut), which is no generation.
        deadline = time.time() + 20
        while busy():
            self.assertLess(time.time(), deadline,
                            "llama-server kept generating for a browser that left")
            time.sleep(0.2)
        st, body, _ = self.web.get("/api/info", self.web.auth())
        self.assertEqual(st, 200)

    def test_refuses_a_token_the_daemon_does_not_know(self):
        other = Web(self.daemon, env={"TOKI_TOKEN": "not-the-daemons-token"})
        try:
            st, body, _ = other.get("/api/v1/models", other.auth())
            self.assertEqual(st, 502, body)
            self.assertIn("refused toki web's token", json.loads(body)["error"]["message"])
        finally:
            other.kill(signal.SIGTERM)

    def test_binds_loopback_only_unless_allowed(self):
        p = subprocess.run([th.TOKI_BIN, "web", "--host", "0.0.0.0", "--port", "0", "--url",
                            self.daemon], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--allow-remote", p.stderr)
        p = subprocess.run([th.TOKI_BIN, "web", "--tls-cert", "x.pem"], capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--tls-key", p.stderr)

    # ---- in the browser ----

    def check_chat(self, seen, prompts):
        self.assertEqual(seen["errors"], [], "page errors")
        self.assertEqual(seen["hashAfterLoad"], "", "the secret stays in the address bar")
        self.assertEqual(seen["leaks"], [], "the daemon's token reached the browser")
        self.assertEqual([t["state"] for t in seen["turns"]], ["done"] * len(prompts),
                         [t["error"] for t in seen["turns"]])
        for t, (mode, _) in zip(seen["turns"], prompts):
            want = {"raw": ["raw"], "cached": ["cached"], "compare": ["raw", "cached"]}[mode]
            self.assertEqual([a["mode"] for a in t["answers"]], want)
            for a in t["answers"]:
                self.assertTrue(a["text"].strip(), f"an answer in turn {t['n']} ({a['mode']})")
                self.assertIn(a["route"], ("hit", "partial", "miss", "disk"))
                for k in ("ttft", "evaluated", "cached", "total"):
                    self.assertNotEqual(a[k], "—", f"{k} in turn {t['n']} ({a['mode']})")
        m = seen["measured"]
        self.assertEqual(len(m), len(prompts))
        for t in m:
            for side in ("raw", "cached"):
                r = t[side]
                if r:
                    self.assertGreater(r["ttft"], 0)
                    self.assertGreaterEqual(r["total"], r["ttft"])
                    self.assertGreater(r["evaluated"], 0)
                    # Streamed: the page read the answer as several deltas. How
                    # many reads the browser needed is the machine's timing: a
                    # loaded one can hand a short stream over in one.
                    self.assertGreaterEqual(r["reads"], 1)
                    self.assertGreater(r["pieces"], 1, f"turn {t['n']} {side} came in one piece")
        return m

    def test_browser_chat_in_every_mode(self):
        # Never into the source tree by default: a test run must not rewrite
        # the README's picture.
        shot = os.environ.get("TOKI_WEB_SCREENSHOT") or os.path.join(
            th.WORK_DIR, "web-screenshot.png")
        os.makedirs(os.path.dirname(shot), exist_ok=True)
        seen = browse({"scenario": "chat", "url": self.web.url, "system": SYSTEM,
                       "prompts": PROMPTS, "screenshot": shot,
                       "watch": [th.TEST_TOKEN]})
        m = self.check_chat(seen, PROMPTS)
        # Turn 1 is raw: everything evaluated. Turn 2, cached, evaluates only
        # what is new (plus at most one micro-batch in exact mode).
        self.assertEqual(m[0]["raw"]["cached"], 0)
        self.assertLess(m[1]["cached"]["evaluated"], m[0]["raw"]["evaluated"])
        self.assertGreater(m[1]["cached"]["cached"], 0)
        # Compare: the same prompt raw then cached.
        self.assertLess(m[2]["cached"]["evaluated"], m[2]["raw"]["evaluated"])
        self.assertGreater(m[2]["cached"]["cached"], 0)
        self.assertEqual(m[2]["raw"]["cached"], 0)
        self.assertEqual(m[2]["route"], "hit")
        self.assertRegex(seen["turns"][2]["speedup"], r"\d+(\.\d)?× faster")
        # The chart has a point per run: raw in turns 1 and 3, cached in 2 and 3.
        self.assertEqual(sorted(t for t, _ in seen["chart"]["raw"]), ["1", "1", "3", "3"])
        self.assertEqual(sorted(t for t, _ in seen["chart"]["cached"]), ["2", "2", "3", "3"])
        self.assertGreaterEqual(seen["chart"]["lines"], 2)
        self.assertEqual(seen["summaryRows"], 3)
        # No token anywhere: page source, requests, responses, storage, cookies.
        self.assertNotIn(th.TEST_TOKEN, seen["html"])
        self.assertNotIn(th.TEST_TOKEN, seen["storage"])
        self.assertEqual(seen["cookies"], [])
        api = [r for r in seen["network"] if "/api/" in r["url"]]
        self.assertTrue(api)
        for r in seen["network"]:
            self.assertTrue(r["url"].startswith(self.web.base), r["url"])
            self.assertNotIn("#k=", r["url"])
            self.assertNotIn(self.web.secret, r["url"])
        for r in api:
            self.assertEqual(r["headers"].get("authorization"), "Bearer " + self.web.secret)
        self.assertTrue(os.path.getsize(shot) > 10000)

    def test_browser_without_the_link(self):
        seen = browse({"scenario": "nokey", "url": self.web.url})
        self.assertIn("link", seen["banner"])
        self.assertEqual(seen["apiStatus"], 401)

    def test_browser_over_https(self):
        cert = os.path.join(self.tmp, "cert.pem")
        key = os.path.join(self.tmp, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                        "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                       check=True, capture_output=True)
        web = Web(self.daemon, extra=["--tls-cert", cert, "--tls-key", key])
        try:
            self.assertTrue(web.url.startswith("https://127.0.0.1:"), web.url)
            st, _, _ = web.get("/api/info")
            self.assertEqual(st, 401)
            # Plain HTTP to the HTTPS port gets no answer.
            with self.assertRaises((http.client.HTTPException, OSError)):
                c = http.client.HTTPConnection("127.0.0.1", web.port, timeout=10)
                c.request("GET", "/")
                c.getresponse().read()
            prompts = [["compare", "Tell me about the red boat."]]
            seen = browse({"scenario": "chat", "url": web.url, "system": SYSTEM,
                           "prompts": prompts, "watch": [th.TEST_TOKEN]})
            self.assertEqual(seen["protocol"], "https:")
            self.assertTrue(seen["secureContext"])
            m = self.check_chat(seen, prompts)
            self.assertLess(m[0]["cached"]["evaluated"], m[0]["raw"]["evaluated"])
            chat = [r for r in seen["network"] if r["url"].endswith("/api/v1/chat/completions")]
            self.assertEqual(len(chat), 2)
            for r in chat:
                self.assertTrue(r["url"].startswith("https://"))
                self.assertEqual(r["status"], 200)
                self.assertTrue(r["responseHeaders"]["content-type"].startswith("text/event-stream"))
            # check_chat saw the page read each answer as several deltas
            # over this TLS connection (that the proxy relays a stream as it
            # comes is test_browser_leaving_cancels_the_generation's).
        finally:
            web.kill(signal.SIGTERM)

    def test_browser_with_the_daemon_down(self):
        dead = f"http://127.0.0.1:{th.free_port()}"
        web = Web(dead)
        try:
            seen = browse({"scenario": "down", "url": web.url,
                           "prompts": [["cached", "Is anyone there?"]], "turnTimeoutMs": 60000,
                           "screenshot": os.path.join(self.tmp, "down.png")})
            self.assertIn("not reachable", seen["banner"])
            self.assertIn(dead, seen["banner"])
            self.assertIn("down", seen["dot"])
            self.assertEqual(seen["turns"][0]["state"], "error")
            self.assertIn("not reachable", seen["turns"][0]["error"])
        finally:
            web.kill(signal.SIGTERM)


if __name__ == "__main__":
    th.run_tests()
