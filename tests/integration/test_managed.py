"""`toki serve --model`: toki starts its own llama-server, restarts it when it
dies (reported in the log and /toki/stats), and stops it on exit."""
import json
import os
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


class ManagedBackend(unittest.TestCase):
    def test_restarts_a_dead_llama_server(self):
        state = tempfile.mkdtemp(prefix="toki-state-")
        env = dict(os.environ, TOKI_STATE_DIR=state, TOKI_LLAMA_SERVER=th.llama_server_path())
        args = [th.TOKI_BIN, "serve", "--port", "0", "--model", th.test_model(), "--name", "m",
                "--ctx", "1024", "--max-output", "32"]
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
        try:
            line = p.stdout.readline()
            port = int(line.strip().rsplit(":", 1)[1])
            th.wait_http(port, "/health", timeout=60)
            info = json.load(open(os.path.join(state, "run", "m", "serve.json")))
            self.assertEqual(info["port"], port)
            self.assertEqual(info["ctx"], 1024)
            st, body = th.request(port, "POST", "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 5000})
            self.assertEqual(st, 200, body)
            # The output cap and the context hold.
            self.assertEqual(body["cache"]["max_tokens"], 32)
            self.assertTrue(body["cache"]["max_tokens_clamped"])
            self.assertLessEqual(body["usage"]["completion_tokens"], 32)
            st, models = th.request(port, "GET", "/v1/models")
            self.assertEqual(models["data"][0]["context_length"], 1024)
            self.assertEqual(models["data"][0]["max_output"], 32)

            st, tok = th.request(port, "POST", "/tokenize", {"content": "Once upon a time"})
            self.assertEqual(st, 200, tok)
            self.assertTrue(tok["tokens"])
            st, detok = th.request(port, "POST", "/detokenize", {"tokens": tok["tokens"]})
            self.assertEqual(st, 200, detok)

            os.kill(info["llama_pid"], signal.SIGKILL)
            # Pass-through routes sent while the server is down (toki saw it
            # die; the restart waits >= 1 s) wait for it, as chat routes do,
            # rather than getting a 503.
            deadline = time.time() + 30
            while time.time() < deadline:
                st, stats = th.request(port, "GET", "/toki/stats")
                if stats["llama_restarts"] >= 1 and not stats["backends"][0]["up"]:
                    break
                time.sleep(0.05)
            self.assertFalse(stats["backends"][0]["up"])

            def waiting_reaches(n):
                deadline = time.time() + 5
                while time.time() < deadline:
                    st, stats = th.request(port, "GET", "/toki/stats")
                    if stats["waiting"] == n:
                        return True
                    time.sleep(0.02)
                return False

            # A client that leaves while its pass-through waits is forgotten.
            data = json.dumps({"content": "gone"}).encode()
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                      th.TEST_TOKEN.encode() + b"\r\nContent-Length: " +
                      str(len(data)).encode() + b"\r\n\r\n" + data)
            self.assertTrue(waiting_reaches(1))
            s.close()
            self.assertTrue(waiting_reaches(0))
            answers = {}

            def send(path, body):
                answers[path] = th.request(port, "POST" if body else "GET", path, body,
                                           timeout=60)

            threads = [threading.Thread(target=send, args=a) for a in
                       (("/tokenize", {"content": "Once upon a time"}),
                        ("/detokenize", {"tokens": tok["tokens"]}),
                        ("/v1/models", None))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(70)
            self.assertEqual(answers["/tokenize"], (200, tok))
            self.assertEqual(answers["/detokenize"], (200, detok))
            self.assertEqual(answers["/v1/models"][0], 200, answers["/v1/models"])
            self.assertEqual(answers["/v1/models"][1]["data"][0]["context_length"], 1024)
            # Toki notices, restarts it, and serves again.
            deadline = time.time() + 60
            restarts = 0
            while time.time() < deadline:
                st, stats = th.request(port, "GET", "/toki/stats")
                restarts = stats["llama_restarts"]
                if restarts >= 1 and stats["backends"][0]["up"]:
                    break
                time.sleep(0.2)
            self.assertEqual(restarts, 1)
            st, body = th.request(port, "POST", "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": "back?"}],
                                   "max_tokens": 4})
            self.assertEqual(st, 200, body)
        finally:
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=30)
        self.assertIn("was killed by signal 9; restarting", err)
        self.assertEqual(p.returncode, 0)
        # The llama-server it started is gone too, and so is serve.json.
        self.assertFalse(os.path.exists(os.path.join(state, "run", "m", "serve.json")))
        try:
            os.kill(info["llama_pid"], 0)
            alive = True
        except ProcessLookupError:
            alive = False
        # The restarted server has a new pid; check no llama-server on its port.
        self.assertRaises(OSError, th.request, info["llama_port"], "GET", "/health", None, None, 2)


if __name__ == "__main__":
    th.run_tests()
