"""Error answers are logged: each 401, 404 and 400 toki writes leaves a line
with the status, the route, who asked (address, user agent) and the reason;
a refused token is described by kind and length, never by value. No model is
needed: the backend is a closed port."""
import os
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th

SECRET = "sk-not-the-local-token-4f9c2e"


class ErrorLog(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        os.makedirs(th.WORK_DIR, exist_ok=True)
        cls.log_path = tempfile.mktemp(prefix="toki-errlog-", suffix=".log", dir=th.WORK_DIR)
        cls.log = open(cls.log_path, "w")
        cls.proc = subprocess.Popen([th.TOKI_BIN, "serve", "--port", "0", "--backend",
                                     "http://127.0.0.1:%d" % th.free_port()],
                                    stdout=subprocess.PIPE, stderr=cls.log, text=True)
        line = cls.proc.stdout.readline()
        cls.port = int(line.strip().rsplit(":", 1)[1])

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(timeout=30)
        cls.log.close()
        os.unlink(cls.log_path)

    def wait_log(self, *parts, timeout=10):
        """The log line holding every part (waits for it to be written)."""
        deadline = time.time() + timeout
        while True:
            with open(self.log_path) as f:
                for line in f:
                    if all(p in line for p in parts):
                        return line
            if time.time() > deadline:
                with open(self.log_path) as f:
                    self.fail("no log line with %r in:\n%s" % (parts, f.read()))
            time.sleep(0.05)

    def test_401_says_what_was_sent_without_the_token(self):
        st, _ = th.request(self.port, "GET", "/v1/models", auth=False,
                           headers={"User-Agent": "agent-under-test/1.0"})
        self.assertEqual(st, 401)
        line = self.wait_log("401 GET /v1/models from 127.0.0.1", "agent-under-test/1.0",
                             "sent no token")
        self.assertIn("missing or wrong token", line)
        st, _ = th.request(self.port, "POST", "/v1/chat/completions", {"messages": []},
                           auth=False, headers={"Authorization": "Bearer " + SECRET})
        self.assertEqual(st, 401)
        self.wait_log("401 POST /v1/chat/completions",
                      "sent a Bearer token of %d characters" % len(SECRET))
        st, _ = th.request(self.port, "GET", "/v1/models?key=" + SECRET, auth=False,
                           headers={"x-api-key": SECRET})
        self.assertEqual(st, 401)
        self.wait_log("sent an x-api-key of %d characters" % len(SECRET))
        with open(self.log_path) as f:
            self.assertNotIn(SECRET, f.read())

    def test_404_and_400_give_the_reason(self):
        st, _ = th.request(self.port, "GET", "/v2/nothing-here")
        self.assertEqual(st, 404)
        self.wait_log("404 GET /v2/nothing-here", "no route for GET /v2/nothing-here")
        st, _ = th.request(self.port, "POST", "/v1/chat/completions",
                           {"messages": "not a list"})
        self.assertEqual(st, 400)
        self.wait_log("400 POST /v1/chat/completions", "messages")


if __name__ == "__main__":
    th.run_tests()
