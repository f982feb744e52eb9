"""Security: the local token on every route (and each route's own 401
shape), no bind beyond loopback without --allow-remote, names and paths from
requests, registries and hubs that never leave their directories (`../`,
absolute paths, symbolic links; the file system is checked afterwards), and
the files holding secrets written owner-only."""
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th  # noqa: E402
from fake_hosts import FakeHosts  # noqa: E402

# Every route toki serves (method, path, body). /health is the only open one.
ROUTES = [
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ("POST", "/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ("POST", "/v1/completions", {"prompt": "x"}),
    ("POST", "/completions", {"prompt": "x"}),
    ("POST", "/completion", {"prompt": "x"}),
    ("POST", "/v1/responses", {"input": "x"}),
    ("POST", "/responses", {"input": "x"}),
    ("POST", "/anthropic/v1/messages", {"model": "m", "max_tokens": 2,
                                        "messages": [{"role": "user", "content": "x"}]}),
    ("POST", "/anthropic/v1/messages/count_tokens",
     {"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    ("GET", "/anthropic/v1/models", None),
    ("POST", "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "x"}]}),
    ("GET", "/v1/models", None), ("GET", "/models", None), ("GET", "/toki/stats", None),
    ("POST", "/tokenize", {"content": "x"}), ("POST", "/detokenize", {"tokens": [1]}),
    ("GET", "/props", None), ("GET", "/slots", None), ("GET", "/metrics", None),
    ("POST", "/apply-template", {"messages": [{"role": "user", "content": "x"}]}),
    ("POST", "/embedding", {"content": "x"}), ("POST", "/embeddings", {"content": "x"}),
    ("POST", "/v1/embeddings", {"input": "x"}), ("POST", "/infill", {"input_prefix": "x"}),
    ("POST", "/rerank", {"query": "x", "documents": ["y"]}),
    ("POST", "/reranking", {"query": "x", "documents": ["y"]}),
    ("POST", "/v1/rerank", {"query": "x", "documents": ["y"]}),
    ("GET", "/lora-adapters", None),
    ("POST", "/slots/0?action=save", {"filename": "x.bin"}),
    ("POST", "/slots/0?action=restore", {"filename": "x.bin"}),
    ("POST", "/slots/0?action=erase", None),
    ("GET", "/nowhere", None), ("GET", "/anthropic/nowhere", None),
    # Near misses of /health.
    ("GET", "/health/", None), ("GET", "/HEALTH", None), ("GET", "//health", None),
    ("GET", "/health/../v1/models", None), ("GET", "/v1/models?x=/health", None),
    ("PUT", "/v1/chat/completions", None), ("DELETE", "/slots", None),
]


def sha_tree(root):
    """Every file under root (not following links) -> its sha256 or link target."""
    out = {}
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                out[os.path.relpath(p, root)] = "-> " + os.readlink(p)
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    out[os.path.relpath(p, root)] = hashlib.sha256(f.read()).hexdigest()
            else:
                out[os.path.relpath(p, root) + "/"] = "dir"
    return out


class Auth(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.llama = th.LlamaServer(slots=1, ctx=1024)
        cls.toki = th.Toki([cls.llama])

    @classmethod
    def tearDownClass(cls):
        cls.toki.kill(signal.SIGTERM)
        cls.llama.kill()

    def bad_headers(self):
        t = th.TEST_TOKEN
        wrong = "x" * len(t)  # the right length, the wrong bytes
        return [
            {},
            {"Authorization": "Bearer " + wrong},
            {"x-api-key": wrong},
            {"Authorization": "Bearer " + t[:-1]},           # one byte short
            {"Authorization": "Bearer " + t + "x"},          # one byte long
            {"Authorization": "Bearer " + t[:-1] + chr(ord(t[-1]) ^ 1)},  # last byte off
            {"Authorization": t},                            # no scheme
            {"Authorization": "Basic " + t},
            {"Authorization": "Bearer"},
            {"Authorization": "Bearer "},
            {"x-api-key": ""},
            {"Authorization": "Bearer " + wrong, "x-api-key": ""},
            {"Authorization": "Bearer " + t.upper()},
            {"X-Api-Key": t[:16]},
        ]

    def test_every_route_needs_the_token(self):
        p = self.toki.port
        for method, path, body in ROUTES:
            for headers in self.bad_headers():
                st, err = th.request(p, method, path, body, headers=headers, auth=False,
                                     timeout=30)
                self.assertEqual(st, 401, (method, path, headers, err))
                if path.startswith(("/anthropic/", "/v1/messages")):
                    # Anthropic's own shape (also at the root, as llama-server serves it).
                    self.assertEqual(err["type"], "error", err)
                    self.assertEqual(err["error"]["type"], "authentication_error", err)
                else:
                    self.assertEqual(err["error"]["type"], "authentication_error", err)
                    self.assertEqual(err["error"]["code"], 401, err)
                # The message never echoes what was sent.
                self.assertNotIn("x" * 16, json.dumps(err))
        # The token in the query string is not a credential.
        st, _ = th.request(p, "GET", "/v1/models?token=" + th.TEST_TOKEN, auth=False)
        self.assertEqual(st, 401)
        st, _ = th.request(p, "GET", "/v1/models?api_key=" + th.TEST_TOKEN, auth=False)
        self.assertEqual(st, 401)

    def test_right_token_both_ways_and_health_open(self):
        p = self.toki.port
        st, _ = th.request(p, "GET", "/health", auth=False)
        self.assertEqual(st, 200)
        for h in ({"Authorization": "Bearer " + th.TEST_TOKEN}, {"x-api-key": th.TEST_TOKEN}):
            st, body = th.request(p, "GET", "/v1/models", headers=h, auth=False)
            self.assertEqual(st, 200, body)
            st, body = th.request(p, "POST", "/anthropic/v1/messages/count_tokens",
                                  {"model": "m", "messages": [{"role": "user",
                                                               "content": "hi"}]},
                                  headers=h, auth=False)
            self.assertEqual(st, 200, body)

    def test_public_routes_beside_llama_server(self):
        """The same routes are open as on llama-server 11669 with --api-key:
        /health and /v1/health; the model list wants the key on both (it
        names the model's file, and any web page could read it from a
        loopback server without: every answer to an Origin carries
        Access-Control-Allow-Origin). docs/compatibility.md, "Public
        routes"."""
        key = "llama-key-0123456789"
        llama = th.LlamaServer(slots=1, ctx=1024, extra=["--api-key", key])
        origin = {"Origin": "https://example.com"}
        paths = ("/health", "/v1/health", "/models", "/v1/models", "/props", "/slots")
        try:
            alone = {p: th.request(llama.port, "GET", p, headers=origin, auth=False)[0]
                     for p in paths}
        finally:
            llama.kill()
        through = {p: th.request(self.toki.port, "GET", p, headers=origin, auth=False)[0]
                   for p in paths}
        self.assertEqual(through, alone)
        self.assertEqual([p for p in paths if alone[p] == 200], ["/health", "/v1/health"])
        st, body = th.request(self.toki.port, "GET", "/v1/models", headers=origin, auth=False)
        self.assertNotIn(os.path.basename(self.llama.model), json.dumps(body))

    def test_no_token_in_logs(self):
        th.request(self.toki.port, "GET", "/v1/models")
        th.request(self.toki.port, "GET", "/v1/models",
                   headers={"Authorization": "Bearer wrong-token-guess-1234"}, auth=False)
        log = self.toki.log_text()
        self.assertNotIn(th.TEST_TOKEN, log)
        self.assertNotIn("wrong-token-guess-1234", log)


def machine_addresses():
    """This machine's non-loopback IPv4 addresses."""
    out = set()
    try:
        r = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10)
        for a in r.stdout.split():
            if "." in a and not a.startswith("127."):
                out.add(a)
    except OSError:
        pass
    return sorted(out)


def listening_on(addr, port):
    try:
        with socket.create_connection((addr, port), timeout=2):
            return True
    except OSError:
        return False


class Bind(unittest.TestCase):
    def serve(self, host, extra=(), env=None, timeout=15):
        port = th.free_port()
        args = [th.TOKI_BIN, "serve", "--host", host, "--port", str(port), "--backend",
                "http://127.0.0.1:9"] + list(extra)
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
        try:
            out, err = p.communicate(timeout=timeout)
            return p.returncode, out, err, port
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=30)
            return None, out, err, port

    def test_non_loopback_refused_without_flag(self):
        hosts = ["0.0.0.0", "::", "0", "*"] + machine_addresses()
        for h in hosts:
            with self.subTest(host=h):
                rc, out, err, port = self.serve(h)
                self.assertEqual(rc, 2, (h, out, err))
                self.assertIn("--allow-remote", err)

    def test_loopback_allowed(self):
        for h in ("127.0.0.1", "localhost"):
            with self.subTest(host=h):
                rc, out, err, port = self.serve(h, timeout=3)
                self.assertIsNone(rc, (h, out, err))  # it ran until stopped
                self.assertIn("listening on", out + err)

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("unshare"),
                         "needs root and unshare (a private /etc/hosts)")
    def test_loopback_looking_name_for_a_public_address_refused(self):
        """A host name that starts with "127." is not loopback: what it
        resolves to decides. Here one resolves (in a private /etc/hosts) to
        this machine's public address."""
        addrs = machine_addresses()
        if not addrs:
            self.skipTest("no non-loopback address on this machine")
        tmp = tempfile.mkdtemp(prefix="toki-hosts-")
        try:
            hosts = os.path.join(tmp, "hosts")
            with open(hosts, "w") as f:
                f.write(f"127.0.0.1 localhost\n{addrs[0]} 127.example.test\n")
            port = th.free_port()
            script = (f"mount --bind {hosts} /etc/hosts && exec {th.TOKI_BIN} serve --host "
                      f"127.example.test --port {port} --backend http://127.0.0.1:9")
            p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                  script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
            # Until it exits (refusing, as it should) or is seen listening.
            deadline = time.time() + 30
            exposed = False
            while p.poll() is None and not exposed and time.time() < deadline:
                exposed = listening_on(addrs[0], port)
                time.sleep(0.05)
            exposed = exposed or listening_on(addrs[0], port)
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=30)
            self.assertFalse(exposed, f"toki listened on {addrs[0]}:{port} without "
                                      f"--allow-remote (--host 127.example.test)")
            self.assertNotEqual(p.returncode, 0, out + err)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_allow_remote_binds(self):
        addrs = machine_addresses()
        if not addrs:
            self.skipTest("no non-loopback address")
        rc, out, err, port = self.serve(addrs[0], extra=["--allow-remote"], timeout=3)
        self.assertIsNone(rc, (out, err))


class Paths(unittest.TestCase):
    """Names and paths from the command line, the registry, a hub and slot
    requests stay inside their directories."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="toki-sec-")
        self.state = os.path.join(self.tmp, "state")
        self.reg = os.path.join(self.tmp, "config", "models.yaml")
        self.outside = os.path.join(self.tmp, "outside")   # what must never be touched
        os.makedirs(os.path.join(self.outside, "etc"))
        os.makedirs(os.path.join(self.state, "models"))
        os.makedirs(os.path.dirname(self.reg))
        for rel in ("etc/passwd", "precious.gguf", "x/file"):
            p = os.path.join(self.outside, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write("user data " + rel)
        self.env = dict(os.environ, TOKI_STATE_DIR=self.state, TOKI_MODEL_REGISTRY=self.reg)
        self.before = sha_tree(self.outside)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def toki(self, *args, env=None, timeout=120):
        return subprocess.run([th.TOKI_BIN, *args], capture_output=True, text=True,
                              env=env or self.env, timeout=timeout)

    def assertOutsideIntact(self):
        self.assertEqual(sha_tree(self.outside), self.before, "files outside were touched")

    def write_registry(self, text):
        with open(self.reg, "w") as f:
            f.write(text)

    def test_model_remove_purge_never_escapes(self):
        # A real model dir, to see that purge still works where it should.
        mdir = os.path.join(self.state, "models", "good")
        os.makedirs(mdir)
        with open(os.path.join(mdir, "m.gguf"), "w") as f:
            f.write("weights")
        # A model dir that is a link to the user's files, one with a link
        # inside, and an entry whose path is the user's own file.
        os.symlink(self.outside, os.path.join(self.state, "models", "linked"))
        inner = os.path.join(self.state, "models", "inner")
        os.makedirs(inner)
        os.symlink(os.path.join(self.outside, "x"), os.path.join(inner, "link-to-dir"))
        os.symlink(os.path.join(self.outside, "precious.gguf"), os.path.join(inner, "m.gguf"))
        self.write_registry(
            "models:\n"
            f"  good:\n    path: {mdir}/m.gguf\n"
            f"  linked:\n    path: {self.outside}/precious.gguf\n"
            f"  inner:\n    path: {inner}/m.gguf\n"
            f"  mine:\n    path: {self.outside}/precious.gguf\n")
        for name in ("../../etc", "..", ".", "/etc", f"{self.outside}", "a/../../b",
                     "models/../..", "../outside", "good/..", "", "x" * 200):
            with self.subTest(name=name):
                r = self.toki("model", "remove", name, "--purge", "--force")
                self.assertNotEqual(r.returncode, 0, (name, r.stdout, r.stderr))
                self.assertOutsideIntact()
        for name in ("linked", "inner", "mine"):
            r = self.toki("model", "remove", name, "--purge", "--force")
            self.assertEqual(r.returncode, 0, (name, r.stderr))
            self.assertOutsideIntact()
        r = self.toki("model", "remove", "good", "--purge")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(mdir))
        self.assertOutsideIntact()

    def test_registry_names_that_escape_are_refused(self):
        for bad in ("../x", "..", "/abs", "a/b", ".", "x/../../y", "\"../x\"", "'..'",
                    "\"a\\u002f..\""):
            with self.subTest(name=bad):
                self.write_registry(f"models:\n  {bad}:\n    path: /m.gguf\n")
                r = self.toki("model", "list")
                self.assertNotEqual(r.returncode, 0, (bad, r.stdout))
                self.assertIn("models.yaml:2", r.stderr)  # names the line
                with open(self.reg) as f:
                    before = f.read()
                # No writer replaces the broken file, and none acts on the name.
                r = self.toki("model", "remove", "x", "--purge")
                self.assertNotEqual(r.returncode, 0)
                with open(self.reg) as f:
                    self.assertEqual(f.read(), before)
                r = self.toki("model", "use", "../x", "--wait", "1")
                self.assertNotEqual(r.returncode, 0)
        self.write_registry("models:\n  ok:\n    path: /m.gguf\nactive: ../x\n")
        r = self.toki("model", "list")
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertOutsideIntact()
        self.assertEqual(os.listdir(os.path.join(self.state, "models")), [])

    def test_pull_names_and_hub_paths_stay_inside(self):
        hosts = FakeHosts()
        try:
            with open(th.test_model(), "rb") as f:
                model = f.read()
            repo = "evil-org/evil-GGUF"
            # A hub listing paths that climb out or are absolute.
            for p in ("ok.gguf", "../../../escape.gguf", "sub/../../escape2.gguf",
                      "/tmp/abs-escape.gguf", "..%2f..%2fescape3.gguf"):
                hosts.add_file(repo, p, model)
            env = dict(self.env, HF_ENDPOINT=hosts.url)
            for name in ("../x", "..", "/tmp/x", "a/b", "x/../..", ".", ""):
                with self.subTest(name=name):
                    r = self.toki("model", "pull", repo, "--file", "ok.gguf", "--name", name,
                                  env=env)
                    self.assertNotEqual(r.returncode, 0, (name, r.stdout, r.stderr))
            for path in ("../../../escape.gguf", "sub/../../escape2.gguf",
                         "/tmp/abs-escape.gguf", "..%2f..%2fescape3.gguf"):
                with self.subTest(file=path):
                    r = self.toki("model", "pull", repo, "--file", path, "--name", "evil",
                                  env=env)
                    # Refused, or kept inside models/evil/: never written outside.
                    for dirpath, _, files in os.walk(self.tmp):
                        for fn in files:
                            if "escape" in fn:
                                full = os.path.join(dirpath, fn)
                                self.assertTrue(
                                    full.startswith(os.path.join(self.state, "models", "evil")
                                                    + os.sep), full)
            self.assertFalse(os.path.exists("/tmp/abs-escape.gguf"))
            self.assertFalse(os.path.exists(os.path.join(os.path.dirname(self.tmp),
                                                         "escape.gguf")))
            # --quant picks among the listed files; a climbing one is not written outside.
            r = self.toki("model", "pull", repo, "--name", "q", env=env)
            self.assertOutsideIntact()
            for fn in os.listdir(self.tmp):
                self.assertNotIn("escape", fn)
            # The registry never got an unsafe name.
            if os.path.exists(self.reg):
                r = self.toki("model", "list", "--json")
                self.assertEqual(r.returncode, 0, r.stderr)
                for m in json.loads(r.stdout)["models"]:
                    self.assertNotIn("/", m["name"])
                    self.assertNotIn("..", m["name"])
        finally:
            hosts.close()

    def test_slot_file_names_from_requests_stay_in_the_slot_dir(self):
        slots = os.path.join(self.tmp, "slots")
        os.makedirs(slots)
        llama = th.LlamaServer(slots=1, ctx=1024, extra=["--slot-save-path", slots])
        toki = th.Toki([llama], extra=["--slot-dir", slots])
        try:
            st, _ = toki.chat([{"role": "user", "content": "hello"}], max_tokens=2)
            self.assertEqual(st, 200)
            target = os.path.join(self.outside, "etc", "passwd")
            for fn in ("../outside/etc/passwd", "../../x.bin", "/tmp/abs-slot.bin", target,
                       "..", ".", "", "a/b.bin"):
                for action in ("save", "restore"):
                    with self.subTest(fn=fn, action=action):
                        st, body = th.request(toki.port, "POST", f"/slots/0?action={action}",
                                              {"filename": fn})
                        self.assertNotEqual(st, 200, (fn, action, body))
                        self.assertLess(st, 500, (fn, action, body))
            self.assertFalse(os.path.exists("/tmp/abs-slot.bin"))
            self.assertFalse(os.path.exists(os.path.join(self.tmp, "x.bin")))
            self.assertOutsideIntact()
            # toki's own index never follows a link planted in the slot dir.
            os.symlink(target, os.path.join(slots, "toki-planted-1.json"))
            os.symlink(target, os.path.join(slots, "toki-planted-1.bin"))
            toki.kill(signal.SIGTERM)
            toki = th.Toki([llama], extra=["--slot-dir", slots])
            st, _ = toki.chat([{"role": "user", "content": "again"}], max_tokens=2)
            self.assertEqual(st, 200)
            self.assertOutsideIntact()
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()


class SecretFiles(unittest.TestCase):
    """Files that hold the token: owner-only, in owner-only directories."""

    def test_token_and_agent_configs_are_private(self):
        tmp = tempfile.mkdtemp(prefix="toki-secret-")
        state = os.path.join(tmp, "state")
        home = os.path.join(tmp, "home")
        os.makedirs(home)
        env = dict(os.environ, TOKI_STATE_DIR=state, HOME=home,
                   XDG_CONFIG_HOME=os.path.join(home, ".config"),
                   TOKI_MODEL_REGISTRY=os.path.join(tmp, "models.yaml"),
                   TOKI_LLAMA_SERVER=th.llama_server_path())
        env.pop("TOKI_TOKEN", None)
        port = th.free_port()
        old = os.umask(0o022)  # a usual umask: what toki writes must not depend on it
        try:
            up = subprocess.run([th.TOKI_BIN, "up", "--model", th.test_model(), "--name", "sec",
                                 "--ctx", "1024", "--slots", "1", "--port", str(port),
                                 "--wait", "120"], env=env, capture_output=True, text=True,
                                timeout=200)
            self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
            token_path = os.path.join(state, "token")
            self.assertEqual(stat.S_IMODE(os.stat(token_path).st_mode), 0o600)
            with open(token_path) as f:
                token = f.read().strip()
            self.assertGreaterEqual(len(token), 32)
            r = subprocess.run([th.TOKI_BIN, "launch"], env=env, capture_output=True,
                               text=True, timeout=60)
            agents = [ln.split()[0] for ln in r.stdout.splitlines()[1:]
                      if ln.strip() and not ln.startswith("toki launch")]
            written = 0
            for a in agents:
                if a == "toki":
                    continue
                r = subprocess.run([th.TOKI_BIN, "launch", a, "--config"], env=env,
                                   capture_output=True, text=True, timeout=60)
                if r.returncode == 0:
                    written += 1
                self.assertNotIn(token, r.stdout + r.stderr, a)  # never printed
            # Every file anywhere under the state dir or HOME that holds the
            # token is 0600, in directories no one else can enter.
            holders = []
            for root in (state, home, tmp):
                for dirpath, dirs, files in os.walk(root):
                    for fn in files:
                        p = os.path.join(dirpath, fn)
                        if os.path.islink(p) or not os.path.isfile(p):
                            continue
                        try:
                            with open(p, "rb") as f:
                                data = f.read(1 << 22)
                        except OSError:
                            continue
                        if token.encode() in data:
                            holders.append(p)
            holders = sorted(set(holders))
            self.assertIn(token_path, holders)
            for p in holders:
                mode = stat.S_IMODE(os.stat(p).st_mode)
                self.assertEqual(mode & 0o077, 0, f"{p} holds the token and is {oct(mode)}")
            agents_dir = os.path.join(state, "agents")
            if os.path.isdir(agents_dir):
                for dirpath, dirs, files in os.walk(agents_dir):
                    m = stat.S_IMODE(os.stat(dirpath).st_mode)
                    self.assertEqual(m & 0o077, 0, f"{dirpath} is {oct(m)}")
                    for fn in files:
                        p = os.path.join(dirpath, fn)
                        if os.path.islink(p):
                            continue
                        m = stat.S_IMODE(os.stat(p).st_mode)
                        self.assertEqual(m & 0o077, 0, f"{p} is {oct(m)}")
            print(f"\n{written} agent configurations written; token found in "
                  f"{len(holders)} file(s): " + ", ".join(os.path.relpath(h, tmp)
                                                         for h in holders))
            # The run's logs never carry it.
            for dirpath, _, files in os.walk(os.path.join(state, "run")):
                for fn in files:
                    if fn.endswith(".log"):
                        with open(os.path.join(dirpath, fn), "rb") as f:
                            self.assertNotIn(token.encode(), f.read(), fn)
        finally:
            os.umask(old)
            subprocess.run([th.TOKI_BIN, "down", "sec"], env=env, capture_output=True,
                           timeout=60)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    th.run_tests()
