"""scripts/demo.sh as a newcomer runs it, on the toki under test (TOKI_BIN:
no install, no build) and the provisioned llama-server, through the endpoint
(`toki model use demo`): exact mode, the default, cold (the whole prompt
evaluated), hot (only the few tokens after the cached part), uncached
(cache_prompt: false), the hot answer equal to the uncached one in text and
every logprob, the self-test's verdict; the second registry model started by
its first request; then fast mode, labelled as promising no identity."""
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toki_harness as th  # noqa: E402


def rows(text):
    """The table rows: label -> (prompt, evaluated, cached), per mode."""
    out, mode = {}, None
    for line in text.splitlines():
        if line.startswith("exact mode"):
            mode = "exact"
        elif line.startswith("fast mode"):
            mode = "fast"
        m = re.match(r"(cold|hot|uncached|first)\s+(\d+)\s+(\d+)\s+(\d+)\s+\d+ms\s+\d+ms$", line)
        if m and mode:
            out[(mode, m.group(1))] = tuple(int(m.group(i)) for i in (2, 3, 4))
    return out


class Demo(unittest.TestCase):
    def test_demo(self):
        cache = os.path.join(th.WORK_DIR, "demo-cache")  # the demo model stays between runs
        # The demo keeps its state under the cache (whatever TOKI_STATE_DIR
        # says), so that it never meets a toki the user runs.
        env = dict(os.environ, TOKI_BIN=th.TOKI_BIN, TOKI_LLAMA_SERVER=th.llama_server_path(),
                   XDG_CACHE_HOME=cache, TOKI_STATE_DIR="/nonexistent/not-the-demo's",
                   TOKI_DEMO_PORT=str(th.free_port()))
        r = subprocess.run(["bash", os.path.join(th.SOURCE_DIR, "scripts", "demo.sh")], env=env,
                           capture_output=True, text=True, timeout=600)
        out = r.stdout
        print(out, flush=True)
        self.assertEqual(r.returncode, 0, out + r.stderr)
        t = rows(out)
        n, ev, ca = t[("exact", "cold")]
        self.assertGreater(n, 1000)
        self.assertEqual((ev, ca), (n, 0))
        n_hot, ev, ca = t[("exact", "hot")]
        self.assertEqual(n_hot, n)
        # The prompt's last token, as llama-server alone: the built-in
        # ChatML template writes an answer right after its generation
        # prompt, so the schedule evaluates that prompt's last token alone
        # (the joined header) and the resend needs no cut.
        self.assertEqual((ev, ca), (1, n - 1))
        self.assertEqual(t[("exact", "uncached")][1], n)
        self.assertIn("hot answer identical to the uncached one (text and every logprob): True",
                      out)
        self.assertIn("exact: verified on this backend", out)
        self.assertIn("fast mode (--reuse fast): every matching token reused, no identity "
                      "promised", out)
        # One endpoint for both models: the second was not running, and its
        # first request started it beside the first.
        self.assertRegex(out, r"/v1/models before asking for demo-small:\n"
                              r"  demo +loaded +context 16384\n"
                              r"  demo-small +unloaded")
        self.assertRegex(out, r"/v1/models after:\n  demo +loaded .*\n  demo-small +loaded")
        n_fast, ev, ca = t[("fast", "hot")]
        self.assertEqual(n_fast, n)
        self.assertLessEqual(ev, 1 + 32)
        # Nothing left running: the demo stops both servers without --keep.
        ps = subprocess.run(["pgrep", "-f", "--", f"--port {env['TOKI_DEMO_PORT']}"],
                            capture_output=True, text=True)
        self.assertEqual(ps.stdout.strip(), "", "the demo left toki running")
        ps = subprocess.run(["pgrep", "-f", "--", os.path.join(cache, "tokirecur", "demo")],
                            capture_output=True, text=True)
        self.assertEqual(ps.stdout.strip(), "", "the demo left a llama-server running")


if __name__ == "__main__":
    th.run_tests()
