"""toki service: the systemd user unit passes `systemd-analyze verify`, the
launchd plist parses as Apple's plist format, and the command either runs is
the real thing: toki in the foreground in front of a real llama-server, seen
by toki status, stopped by toki down with a clean exit (which
Restart=on-failure and KeepAlive/SuccessfulExit=false do not restart).

The manager itself (systemctl --user, launchctl) cannot run in this
container, which has no user session: a fake systemctl on PATH records what
toki asks of it; without one, install keeps the file and says how to start
it."""
import json
import os
import plistlib
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th

FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "%s"
case "$*" in
  *is-active*) echo active ;;
esac
exit 0
"""


def read(path):
    with open(path) as f:
        return f.read()


class Service(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="toki-service-")
        self.home = os.path.join(self.tmp, "home")
        os.makedirs(self.home)
        self.env = dict(os.environ, HOME=self.home,
                        XDG_CONFIG_HOME=os.path.join(self.home, ".config"),
                        TOKI_STATE_DIR=os.path.join(self.tmp, "state"),
                        TOKI_MODEL_REGISTRY=os.path.join(self.tmp, "models.yaml"),
                        TOKI_LLAMA_SERVER=th.llama_server_path())
        self.model = os.path.join(self.tmp, "tiny.gguf")
        shutil.copy(th.test_model(), self.model)
        with open(self.env["TOKI_MODEL_REGISTRY"], "w") as f:
            f.write("active: tiny\nmodels:\n  tiny:\n    path: %s\n    ctx: 512\n" % self.model)

    def tearDown(self):
        self.toki("down")
        shutil.rmtree(self.tmp, ignore_errors=True)

    def toki(self, *args, env=None):
        return subprocess.run([th.TOKI_BIN, *args], capture_output=True, text=True,
                              env=env or self.env, timeout=300)

    def unit(self, *args):
        r = self.toki("service", "install", "--print", *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def exec_start(self, unit):
        line = [l for l in unit.splitlines() if l.startswith("ExecStart=")][0]
        return shlex.split(line[len("ExecStart="):])

    def test_unit_verifies(self):
        port = th.free_port()
        unit = self.unit("--model", self.model, "--port", str(port), "--ctx", "512")
        path = os.path.join(self.tmp, "tokirecur.service")
        with open(path, "w") as f:
            f.write(unit)
        r = subprocess.run(["systemd-analyze", "verify", path], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(self.exec_start(unit),
                         [os.path.realpath(th.TOKI_BIN), "up", "--model", self.model,
                          "--foreground", "--ctx", "512", "--port", str(port)])
        self.assertIn("Restart=on-failure", unit)
        self.assertIn("WantedBy=default.target", unit)
        log = os.path.join(self.env["TOKI_STATE_DIR"], "service.log")
        self.assertIn("StandardOutput=append:" + log, unit)
        # The environment toki needs comes along, quoted as systemd reads it.
        self.assertIn('Environment="TOKI_STATE_DIR=%s"' % self.env["TOKI_STATE_DIR"], unit)
        self.assertIn('Environment="PATH=', unit)
        # A value with what systemd would expand is escaped, and still verifies.
        env = dict(self.env, TOKI_TEST_ODD='50% "q" $HOME')
        r = self.toki("service", "install", "--print", "--model", self.model, env=env)
        self.assertIn(r'Environment="TOKI_TEST_ODD=50%% \"q\" $$HOME"', r.stdout)
        with open(path, "w") as f:
            f.write(r.stdout)
        r = subprocess.run(["systemd-analyze", "verify", path], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # A broken unit is caught by the same check (so the check can fail).
        with open(path, "w") as f:
            f.write(unit.replace('ExecStart="', 'ExecStart="relative/'))
        r = subprocess.run(["systemd-analyze", "verify", path], capture_output=True,
                           text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)

    def test_plist_parses(self):
        r = self.toki("service", "install", "--print", "--manager", "launchd", "--model",
                      self.model, "--slots", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        plist = plistlib.loads(r.stdout.encode())
        self.assertEqual(plist["Label"], "com.tokirecur.toki")
        self.assertEqual(plist["ProgramArguments"],
                         [os.path.realpath(th.TOKI_BIN), "up", "--model", self.model,
                          "--foreground", "--slots", "1"])
        self.assertTrue(plist["RunAtLoad"])
        self.assertEqual(plist["KeepAlive"], {"SuccessfulExit": False})
        log = os.path.join(self.env["TOKI_STATE_DIR"], "service.log")
        self.assertEqual(plist["StandardOutPath"], log)
        self.assertEqual(plist["StandardErrorPath"], log)
        self.assertEqual(plist["EnvironmentVariables"]["TOKI_STATE_DIR"],
                         self.env["TOKI_STATE_DIR"])
        # XML's special characters are escaped.
        env = dict(self.env, TOKI_TEST_ODD="a<b>&\"c\"")
        r = self.toki("service", "install", "--print", "--manager", "launchd", env=env)
        self.assertEqual(plistlib.loads(r.stdout.encode())["EnvironmentVariables"]
                         ["TOKI_TEST_ODD"], "a<b>&\"c\"")

    def test_what_it_runs(self):
        # Without --model: the endpoint for the registry (toki up).
        self.assertEqual(self.exec_start(self.unit())[1:], ["up", "--foreground"])
        self.assertEqual(self.exec_start(self.unit("--port", "9", "--reuse", "fast"))[1:],
                         ["up", "--foreground", "--port", "9", "--reuse", "fast"])
        # A registered model's name: that model in its own run, through toki up.
        self.assertEqual(self.exec_start(self.unit("--model", "tiny", "--port", "9"))[1:],
                         ["up", "--model", "tiny", "--foreground", "--port", "9"])
        r = self.toki("service", "install", "--print", "--model", "nosuch")
        self.assertEqual(r.returncode, 1)
        self.assertIn("neither a file nor a registered model", r.stderr)
        # One model's settings without a model: refused, not dropped.
        r = self.toki("service", "install", "--print", "--ctx", "512")
        self.assertEqual(r.returncode, 2)
        self.assertIn("one model's", r.stderr)
        r = self.toki("service", "install", "--print", "--manager", "upstart")
        self.assertEqual(r.returncode, 2)
        # An empty registry has nothing for the endpoint to serve.
        with open(self.env["TOKI_MODEL_REGISTRY"], "w") as f:
            f.write("models: {}\n")
        r = self.toki("service", "install", "--print")
        self.assertEqual(r.returncode, 1)
        self.assertIn("no models", r.stderr)

    def llama_servers(self):
        """The live llama-servers serving this test's model (a zombie is
        not live; a process may end while it is read)."""
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read().decode(errors="replace")
                with open("/proc/%s/stat" % pid) as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if "llama-server" in cmd and self.tmp in cmd and state != "Z":
                found.append(pid)
        return found

    def run_service_command(self, argv, run_name, request_model):
        """The service's command, run as systemd runs it: it stays in the
        foreground as the run's daemon, toki status sees it with its own
        pid, a request through it is answered, and toki down ends it with
        exit 0 (which Restart=on-failure does not restart) and every
        llama-server with it."""
        port = int(argv[argv.index("--port") + 1])
        proc = subprocess.Popen(argv, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            th.wait_http(port, timeout=120)
            runs = json.loads(self.toki("status", "--json").stdout)
            runs = runs if isinstance(runs, list) else runs.get("runs", [])
            run = [r for r in runs if r["name"] == run_name][0]
            self.assertEqual(run["pid"], proc.pid)  # the process the manager watches
            code, body = th.request(port, "POST", "/v1/chat/completions",
                                    {"model": request_model, "max_tokens": 4,
                                     "messages": [{"role": "user", "content": "Once"}]})
            self.assertEqual(code, 200, body)
            servers = self.llama_servers()
            self.assertTrue(servers)  # the model's llama-server runs
            r = self.toki("down")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(proc.wait(timeout=90), 0)  # clean: not restarted
            left = set(servers) & set(self.llama_servers())
            self.assertFalse(left, "llama-servers outlived toki down")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assertIn("runs in the foreground as toki serve", proc.stdout.read())

    def test_runs_in_foreground_and_stops_cleanly(self):
        # The default service: the endpoint, which starts the model on the
        # request and stops it with itself. (One model's service, toki model
        # use --foreground, takes the same --foreground path of run_start;
        # test_what_it_runs checks its command.)
        argv = self.exec_start(self.unit("--port", str(th.free_port())))
        self.run_service_command(argv, "endpoint", "tiny")

    def test_install_status_remove(self):
        bindir = os.path.join(self.tmp, "bin")
        os.makedirs(bindir)
        calls = os.path.join(self.tmp, "systemctl.calls")
        with open(os.path.join(bindir, "systemctl"), "w") as f:
            f.write(FAKE_SYSTEMCTL % calls)
        os.chmod(os.path.join(bindir, "systemctl"), 0o755)
        env = dict(self.env, PATH=bindir + ":" + self.env["PATH"])
        unit_path = os.path.join(self.home, ".config", "systemd", "user", "tokirecur.service")

        r = self.toki("service", "install", "--model", self.model, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("wrote " + unit_path, r.stdout)
        self.assertEqual(read(calls).splitlines(),
                         ["--user daemon-reload", "--user enable --now tokirecur.service"])
        self.assertEqual(self.exec_start(read(unit_path))[1:4],
                         ["up", "--model", self.model])
        r = self.toki("service", "status", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("installed: " + unit_path + " (systemd)", r.stdout)
        self.assertIn("state:     active", r.stdout)  # what is-active said
        r = self.toki("service", "remove", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(unit_path))
        self.assertEqual(read(calls).splitlines()[3:],
                         ["--user disable --now tokirecur.service", "--user daemon-reload"])
        r = self.toki("service", "status", env=env)
        self.assertEqual(r.returncode, 1)
        self.assertIn("not installed", r.stdout)
        r = self.toki("service", "remove", env=env)
        self.assertEqual(r.returncode, 1)

        # No systemctl at all: the file is written and stays, and the
        # message says how to start it.
        env = dict(self.env, PATH=os.path.join(self.tmp, "empty"))
        r = self.toki("service", "install", "--model", self.model, env=env)
        self.assertEqual(r.returncode, 1)
        self.assertIn("systemctl --user enable --now tokirecur", r.stderr)
        self.assertTrue(os.path.exists(unit_path))
        r = self.toki("service", "remove", env=env)
        self.assertEqual(r.returncode, 1)  # the manager could not be asked...
        self.assertFalse(os.path.exists(unit_path))  # ...but the file is gone


if __name__ == "__main__":
    th.run_tests()
