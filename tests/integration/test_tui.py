"""`toki tui`, driven as a user drives it: in tmux (send-keys, capture-pane),
against a real toki serve in front of a real llama-server. A prompt streams an
answer and the status line gets the turn's numbers; F1/F2/F3 and Alt+1/2/3
switch modes; compare mode shows raw and cached side by side with the
speed-up; Alt+Enter and Ctrl+J make multi-line prompts; Up recalls earlier
prompts; a resized window is redrawn to its new size; a daemon that is not
running gets a message, and Enter retries; Esc stops an answer; F10, Ctrl+C
and Ctrl+D quit.

Screens are saved under the test work directory (tui-screens/) for
docs/tui.md."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th

UBATCH = 64
SYSTEM = " ".join(["You are a careful assistant. Answer briefly, cite the facts you use, and say "
                   "so when you do not know."] * 60)
SCREENS = os.path.join(th.WORK_DIR, "tui-screens")


class Tmux:
    """A tmux server of its own (-L), one session running one command."""

    def __init__(self, command, width=120, height=40):
        self.sock = f"toki-test-{os.getpid()}-{int(time.time() * 1000) % 100000000}"
        # The pane stays after the command so that its exit can be seen.
        wrapped = f"{command}; echo \"EXITED rc=$?\"; sleep 600"
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", str(width), "-y",
                  str(height), "env", "LANG=C.UTF-8", "LC_ALL=C.UTF-8",
                  f"TOKI_TOKEN={th.TEST_TOKEN}", "sh", "-c", wrapped)
        self.socket_path = self.tmux("display-message", "-p", "#{socket_path}").strip()

    def tmux(self, *args):
        return subprocess.run(["tmux", "-L", self.sock, *args], check=True, capture_output=True,
                              text=True, timeout=30).stdout

    def keys(self, *keys):
        self.tmux("send-keys", "-t", "t", *keys)

    def type(self, text):
        self.tmux("send-keys", "-t", "t", "-l", text)

    def screen(self):
        return self.tmux("capture-pane", "-p", "-t", "t")

    def lines(self):
        return self.screen().split("\n")

    def wait(self, what, timeout=300):
        """Waits until the screen matches (a regex, or a predicate); returns it."""
        deadline = time.time() + timeout
        s = ""
        while time.time() < deadline:
            s = self.screen()
            if (what(s) if callable(what) else re.search(what, s)):
                return s
            time.sleep(0.1)
        raise AssertionError(f"screen never showed {what!r}:\n{s}")

    def cursor(self):
        y, x = self.tmux("display-message", "-p", "-t", "t", "#{cursor_y} #{cursor_x}").split()
        return int(y), int(x)

    def resize(self, width, height):
        self.tmux("resize-window", "-t", "t", "-x", str(width), "-y", str(height))

    def save(self, name):
        os.makedirs(SCREENS, exist_ok=True)
        with open(os.path.join(SCREENS, name + ".txt"), "w") as f:
            f.write(self.screen().rstrip("\n") + "\n")

    def close(self):
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True, timeout=30)
        if self.socket_path and os.path.exists(self.socket_path):
            os.unlink(self.socket_path)


def status(screen):
    return screen.split("\n")[0]


def input_lines(screen):
    """The lines of the input box: from the separator to the help line."""
    ls = screen.rstrip("\n").split("\n")
    sep = max(i for i, l in enumerate(ls) if l.startswith("──"))
    return [l for l in ls[sep + 1:-1]]


@unittest.skipUnless(shutil.which("tmux"), "needs tmux")
class Tui(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = th.generated_model("ui", params="4M", ctx=8192)
        cls.llama = th.LlamaServer(model=cls.model, slots=2, ctx=8192, ubatch=UBATCH)
        cls.toki = th.Toki([cls.llama], ubatch=UBATCH)
        cls.url = f"http://127.0.0.1:{cls.toki.port}"
        cls.tmp = tempfile.mkdtemp(prefix="toki-tui-")
        cls.system_file = os.path.join(cls.tmp, "system.txt")
        with open(cls.system_file, "w") as f:
            f.write(SYSTEM)

    @classmethod
    def tearDownClass(cls):
        cls.toki.kill()
        cls.llama.kill()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def start(self, *args, url=None, width=120, height=40, max_tokens=24):
        cmd = (f"{th.TOKI_BIN} tui --url {url or self.url} --system-file {self.system_file} "
               f"--max-tokens {max_tokens} " + " ".join(args))
        t = Tmux(cmd, width, height)
        self.addCleanup(t.close)
        return t

    def send(self, t, text):
        t.type(text)
        t.keys("Enter")

    def test_chat_status_line_and_unicode(self):
        t = self.start()
        s = t.wait(r"connected to http://127\.0\.0\.1")
        st = status(s)
        self.assertIn("cached", st)
        self.assertIn("[F2 cached]", st)
        self.assertIn("F1 raw", st)
        self.assertIn("F3 compare", st)
        self.assertIn(f"127.0.0.1:{self.toki.port}", st)
        self.assertIn("ui-4M", st)
        self.assertIn("Enter send", s.rstrip("\n").split("\n")[-1])
        self.send(t, "Grüße aus Köln, 日本語 und emoji ✓")
        s = t.wait(lambda s: "TTFT" in status(s))
        self.assertRegex(status(s), r"cached TTFT [\d.]+m?s · eval \d+/\d+")
        self.assertIn("Grüße aus Köln, 日本語 und emoji ✓", s)
        s = t.wait(r"evaluated \d+ of \d+ prompt tokens \(\d+ reused")
        m = re.search(r"eval (\d+)/(\d+)", status(s))
        self.assertGreater(int(m.group(2)), 1000)
        # A second turn resends the conversation: most of it comes from the cache.
        self.send(t, "And then?")
        s = t.wait(lambda s: len(re.findall(r"evaluated \d+ of \d+ prompt tokens", s)) == 2)
        turns = re.findall(r"evaluated (\d+) of (\d+) prompt tokens \((\d+) reused", s)
        ev, total, reused = (int(x) for x in turns[-1])
        self.assertGreater(total, int(turns[0][1]))
        self.assertLess(ev, total // 2)
        # Evaluated counts a cut's one throw-away token too, when there was one.
        self.assertIn(ev + reused, (total, total + 1))
        t.save("cached")

    def test_modes_and_compare(self):
        t = self.start()
        t.wait(r"connected to")
        t.keys("F1")
        t.wait(lambda s: "[F1 raw]" in status(s) and status(s).startswith(" raw "))
        t.keys("F2")
        t.wait(lambda s: "[F2 cached]" in status(s))
        t.keys("M-1")
        t.wait(lambda s: "[F1 raw]" in status(s))
        t.keys("M-3")
        t.wait(lambda s: "[F3 compare]" in status(s))
        t.keys("M-2")
        t.wait(lambda s: "[F2 cached]" in status(s))
        # A raw turn: the whole prompt evaluated, cache off.
        t.keys("F1")
        t.wait(lambda s: "[F1 raw]" in status(s))
        self.send(t, "Where does the river go?")
        s = t.wait(r"\(cache off\)")
        m = re.search(r"evaluated (\d+) of (\d+) prompt tokens \(cache off\)", s)
        self.assertEqual(m.group(1), m.group(2))
        self.assertIn("toki · raw (no cache)", s)
        # Compare: raw then cached, side by side, with the speed-up.
        t.keys("F3")
        t.wait(lambda s: "[F3 compare]" in status(s))
        self.send(t, "Tell me about herons.")
        # The comparison's line and the status line are drawn apart: wait
        # for both (the status line once still showed only the raw turn).
        compared = r"TTFT [\d.]+m?s→[\d.]+m?s [\d.]+x · eval \d+→\d+/\d+"
        s = t.wait(lambda s: re.search(r"speed-up: TTFT [\d.]+x", s) and
                   re.search(compared, status(s)))
        header = [l for l in s.split("\n") if "raw (no cache)" in l and "cached (toki router)" in l]
        self.assertEqual(len(header), 1, s)
        self.assertLess(header[0].index("raw (no cache)"), header[0].index("cached (toki router)"))
        stats = [l for l in s.split("\n") if l.count("TTFT") == 2 and "│" in l]
        self.assertEqual(len(stats), 1, s)
        m = re.search(r"evaluated (\d+) → (\d+) of (\d+) prompt tokens · outputs (\w+)", s)
        self.assertIsNotNone(m, s)
        raw_ev, cached_ev, total = int(m.group(1)), int(m.group(2)), int(m.group(3))
        self.assertEqual(raw_ev, total)
        self.assertLess(cached_ev, raw_ev)
        self.assertEqual(m.group(4), "identical")
        self.assertRegex(status(s), compared)
        t.save("compare")

    def test_multiline_input_and_history(self):
        t = self.start(max_tokens=8)
        t.wait(r"connected to")
        t.type("first line")
        t.keys("M-Enter")
        t.type("second line")
        t.keys("C-j")
        t.type("third line")
        s = t.wait(lambda s: input_lines(s)[:3] == ["› first line", "  second line",
                                                    "  third line"])
        t.save("multiline")
        t.keys("Enter")
        t.wait(r"you\n  first line\n  second line\n  third line\n")
        t.wait(lambda s: "TTFT" in status(s))
        # Sent: the input box is empty again (waited for, not read off a
        # screen captured while the TUI was still drawing it).
        t.wait(lambda s: input_lines(s)[0].strip() == "›", timeout=30)
        self.send(t, "a short one")
        t.wait(lambda s: s.count("evaluated") == 2)
        # Up on an empty input: the last prompt; Up on its first line: the one before.
        t.keys("Up")
        t.wait(lambda s: input_lines(s)[0] == "› a short one")
        t.keys("Up")
        s = t.wait(lambda s: input_lines(s)[:3] == ["› first line", "  second line",
                                                    "  third line"])
        # Up and Down inside a multi-line prompt move the cursor, not the
        # history. The recalled prompt leaves the cursor at its end: curses
        # places it after drawing the text, so that is waited for too.
        ls = s.rstrip("\n").split("\n")
        y, x = max(i for i, l in enumerate(ls) if l == "  third line"), len("› third line")
        t.wait(lambda s: t.cursor() == (y, x), timeout=30)
        t.keys("Up")
        t.wait(lambda s: t.cursor() == (y - 1, x))
        t.keys("Up")
        t.wait(lambda s: t.cursor() == (y - 2, len("› first line")))
        t.keys("Up")  # nothing older: it stays
        # Keys are handled in order: once a character typed after it shows,
        # the Up has been handled, and it changed nothing.
        t.type("x")
        t.wait(lambda s: input_lines(s)[:3] == ["› first linex", "  second line",
                                                "  third line"], timeout=30)
        t.keys("BSpace")
        t.wait(lambda s: input_lines(s)[:3] == ["› first line", "  second line",
                                                "  third line"], timeout=30)
        t.keys("Down", "Down")
        t.wait(lambda s: t.cursor()[0] == y)
        t.keys("Down")
        t.wait(lambda s: input_lines(s)[0] == "› a short one")
        t.keys("Down")  # past the newest: the (empty) draft
        t.wait(lambda s: input_lines(s)[0].strip() == "›")

    def test_resize(self):
        t = self.start()
        t.wait(r"connected to")
        self.send(t, "A long enough question to wrap when the window is narrow, surely.")
        t.wait(lambda s: "TTFT" in status(s))
        t.resize(70, 20)
        s = t.wait(lambda s: len(s.rstrip("\n").split("\n")) == 20 and
                   s.rstrip("\n").split("\n")[-1].startswith("Enter send"))
        ls = s.rstrip("\n").split("\n")
        self.assertTrue(all(len(l) <= 70 for l in ls), s)
        self.assertTrue(status(s).startswith(" cached "), s)
        sep = [l for l in ls if l.startswith("── prompt")]
        self.assertEqual(len(sep), 1, s)
        self.assertEqual(len(sep[0]), 70, s)
        t.resize(120, 40)
        s = t.wait(lambda s: len(s.rstrip("\n").split("\n")) == 40 and
                   any(l.startswith("── prompt") and len(l) == 120 for l in s.split("\n")))
        self.assertIn("A long enough question to wrap when the window is narrow, surely.", s)
        t.resize(20, 5)
        t.wait(r"terminal too small")
        t.resize(120, 40)
        t.wait(lambda s: "TTFT" in status(s))

    def test_daemon_not_running_then_retry(self):
        port = th.free_port()
        t = self.start(url=f"http://127.0.0.1:{port}")
        s = t.wait(r"not running at")
        self.assertIn(f"The toki daemon is not running at http://127.0.0.1:{port}", s.replace(
            "\n", " "))
        self.assertIn("press Enter to retry", s.replace("\n", " ").replace("  ", " "))
        self.assertIn("not connected", status(s))
        t.save("not-running")
        # Enter while it is still down: the same message again, counted.
        t.keys("Enter")
        t.wait(r"\(2 times\)")
        # Start the daemon there; Enter with a prompt connects and sends it.
        toki = th.Toki([self.llama], ubatch=UBATCH, extra=["--port", str(port)])
        try:
            self.assertEqual(toki.port, port)
            self.send(t, "Are you there now?")
            s = t.wait(lambda s: "TTFT" in status(s))
            self.assertIn(f"connected to http://127.0.0.1:{port}", s)
            self.assertIn("Are you there now?", s)
            # The daemon goes away mid-session: the turn fails with the message,
            # and the prompt comes back for Enter to retry.
            toki.kill()
            self.send(t, "Still there?")
            s = t.wait(lambda s: input_lines(s)[0] == "› Still there?" and "not connected" in
                       status(s))
        finally:
            toki.kill()

    def test_escape_stops_an_answer(self):
        t = self.start("--mode", "raw", max_tokens=4000)
        t.wait(r"connected to")
        self.send(t, "Go on for a long time.")
        t.wait(r"prefilling…|streaming…")
        t.keys("Escape")
        s = t.wait(r"\n  stopped\n")
        self.assertIn("prompt · Enter sends (raw)", s)

    def test_quit_keys(self):
        for key in ("F10", "C-c", "C-d"):
            t = self.start()
            t.wait(r"connected to")
            t.type("some text")
            t.keys(key)
            t.wait(r"EXITED rc=0")
            t.close()


if __name__ == "__main__":
    th.run_tests()
