"""A stand-in for a toki run, for checking what agents do with the
configuration `toki launch` writes without loading a model: a small HTTP
server that answers /v1/models like toki does (with context_length and
max_output) and records every other request, answering chat completions with
a one-word reply (streamed or not). Its serve.json under
$TOKI_STATE_DIR/run/<name>/ names this process, so `toki launch` and
`toki status` take it for a live run. Standard library only."""
import http.server
import json
import os
import threading
import time


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self, body):
        run = self.server.fake_run
        with run.lock:
            run.requests.append({"method": self.command, "path": self.path,
                                 "headers": {k.lower(): v for k, v in self.headers.items()},
                                 "body": body})
            run.cond.notify_all()

    def do_GET(self):
        run = self.server.fake_run
        self._record(None)
        path = self.path.split("?", 1)[0]
        if path in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [
                {"id": run.name, "object": "model", "owned_by": "toki",
                 "context_length": run.ctx, "max_output": run.max_output}]})
        elif path == "/health":
            self._send(200, {"status": "ok"})
        else:
            self._send(404, {"error": {"message": "no route", "type": "not_found"}})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_raw": raw.decode(errors="replace")}
        self._record(body)
        path = self.path.split("?", 1)[0]
        if not path.endswith("/chat/completions"):
            self._send(404, {"error": {"message": "no route", "type": "not_found"}})
            return
        created = int(time.time())
        model = body.get("model") or self.server.fake_run.name
        usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
        if body.get("stream"):
            chunks = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"},
                              "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                 "usage": usage},
            ]
            out = b""
            for c in chunks:
                c.update({"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                          "created": created, "model": model})
                out += b"data: " + json.dumps(c).encode() + b"\n\n"
            out += b"data: [DONE]\n\n"
            self._send(200, out, "text/event-stream")
        else:
            self._send(200, {"id": "chatcmpl-fake", "object": "chat.completion",
                             "created": created, "model": model,
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": "ok"}}],
                             "usage": usage})


class FakeRun:
    def __init__(self, state_dir, name="tiny", ctx=8192, max_output=512):
        self.name, self.ctx, self.max_output = name, ctx, max_output
        self.requests = []
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.fake_run = self
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        run_dir = os.path.join(state_dir, "run", name)
        os.makedirs(run_dir, exist_ok=True)
        self.info = os.path.join(run_dir, "serve.json")
        with open(self.info, "w") as f:
            json.dump({"pid": os.getpid(), "host": "127.0.0.1", "port": self.port,
                       "llama_port": 0, "llama_pid": 0, "name": name,
                       "model": "/nonexistent/" + name + ".gguf", "ctx": ctx, "slots": 1,
                       "mode": "fast", "max_output": max_output}, f)

    def chat_requests(self):
        with self.lock:
            return [r for r in self.requests
                    if r["method"] == "POST" and r["path"].split("?")[0].endswith(
                        "/chat/completions")]

    def wait_chat(self, timeout):
        """The first chat request, waiting up to timeout seconds; None if none came."""
        deadline = time.time() + timeout
        with self.lock:
            while True:
                for r in self.requests:
                    if r["method"] == "POST" and "/chat/completions" in r["path"]:
                        return r
                left = deadline - time.time()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        try:
            os.unlink(self.info)
        except OSError:
            pass
