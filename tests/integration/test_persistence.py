"""KV that survives restarts: slot states saved to disk (on idle, eviction and
shutdown) are restored after llama-server restarts, and after both toki and
llama-server restart; the first request afterwards evaluates only what
follows the saved prefix's grid point, and in exact mode its text is
byte-identical to an uncached run. States made under another model or
context are refused; damaged files are discarded and the answer is still
right."""
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from test_exact_identity import conversations

UB = 64


class Persistence(unittest.TestCase):
    CTX = 2048
    EXTRA = []    # more toki serve options
    EXT = ".bin"  # how saved states are stored

    @classmethod
    def setUpClass(cls):
        # The reference, one for the class's tests: the same request
        # uncached through a toki of its own, on exact mode's schedule from
        # an empty slot (docs/exact.md), whatever it answered before.
        # llama-server's own uncached answer is another schedule, which a
        # random model's near-tied logits tell apart.
        cls.baseline = th.LlamaServer(model=cls.model(), slots=1, ctx=cls.CTX, ubatch=UB,
                                      name="baseline")
        try:
            cls.ref = th.Toki([cls.baseline], mode="exact", ubatch=UB, name="toki-ref")
        except BaseException:
            cls.baseline.kill()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ref.kill()
        cls.baseline.kill()

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="toki-persist-")
        self.llama = None
        self.toki = None

    def tearDown(self):
        for p in (self.toki, self.llama):
            if p:
                p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    @classmethod
    def model(cls):
        return th.test_model()

    def start_llama(self, ctx=None, model=None):
        self.llama = th.LlamaServer(model=model or self.model(), slots=2, ctx=ctx or self.CTX,
                                    ubatch=UB, extra=["--slot-save-path", self.dir])

    def start_toki(self, mode="exact", idle_ms=200):
        self.toki = th.Toki([self.llama], mode=mode, ubatch=UB,
                            extra=["--slot-dir", self.dir, "--slot-save-idle-ms", str(idle_ms)]
                            + self.EXTRA)

    def uncached(self, msgs, max_tokens):
        st, r = self.ref.chat(msgs, max_tokens=max_tokens, cache_prompt=False)
        self.assertEqual(st, 200, r)
        return r["choices"][0]["message"]["content"]

    def turn(self, hist, user, max_tokens=12):
        msgs = hist + [{"role": "user", "content": user}]
        st, got = self.toki.chat(msgs, max_tokens=max_tokens)
        self.assertEqual(st, 200, got)
        want = self.uncached(msgs, max_tokens)
        self.assertEqual(got["choices"][0]["message"]["content"], want, got["cache"])
        return msgs + [{"role": "assistant", "content": want}], got

    def wait_saved(self, count):
        deadline = time.time() + 30
        while time.time() < deadline:
            st = self.toki.stats()
            if st["saves"] >= count and not any(s["busy"] for b in st["backends"]
                                                for s in b["slots"]):
                return st
            time.sleep(0.1)
        self.fail(f"no idle save happened: {self.toki.stats()}")

    def wait_saved_after(self, earlier):
        """Waits for a save of more tokens than the slot of the `earlier` turn
        could hold (its prompt and its answer): a save of a later turn. A
        count of saves cannot tell: the idle save after the earlier turn
        already moved it."""
        most = earlier["usage"]["prompt_tokens"] + earlier["usage"]["completion_tokens"]
        deadline = time.time() + 30
        saved = re.compile(r"saved slot \d+ as \S+ \((\d+) tokens")
        while time.time() < deadline:
            if any(int(n) > most for n in saved.findall(self.toki.log_text())):
                return
            time.sleep(0.05)
        self.fail(f"no save of more than {most} tokens: {self.toki.log_text()}")

    def files(self):
        return sorted(f for f in os.listdir(self.dir) if f.endswith(self.EXT))

    def conversation(self):
        system, users = conversations(21, count=1, turns=4)[0]
        if self.CTX <= 2048:
            system, users = system[:700], [u[:200] for u in users]
        return [{"role": "system", "content": system}], users

    def check_restored(self, got, prev_prompt):
        c = got["cache"]
        self.assertEqual(c["route"], "disk", c)
        self.assertIn("restored", c)
        new_suffix = c["prompt_tokens"] - prev_prompt
        # Exact mode recomputes from the micro-batch grid point below the saved
        # prefix: at most the new suffix plus one micro-batch.
        self.assertLessEqual(c["evaluated"], new_suffix + UB, c)

    def test_llama_server_restart(self):
        self.start_llama()
        self.start_toki()
        hist, users = self.conversation()
        hist, r1 = self.turn(hist, users[0])
        hist, r2 = self.turn(hist, users[1])
        # The restart must come after turn 2 is on disk, not just turn 1.
        self.wait_saved_after(r1)
        seen = self.toki.stats()["backends"][0]["discoveries"]
        self.llama.kill()
        self.llama.restart()
        # Toki notices the restart (its slots are empty) within a health check.
        deadline = time.time() + 30
        while self.toki.stats()["backends"][0]["discoveries"] == seen:
            self.assertLess(time.time(), deadline, "the restart went unnoticed")
            time.sleep(0.1)
        hist, r3 = self.turn(hist, users[2])
        self.check_restored(r3, r2["cache"]["prompt_tokens"])

    def test_toki_and_llama_server_restart(self):
        self.start_llama()
        self.start_toki(idle_ms=0)  # only the shutdown saves
        hist, users = self.conversation()
        hist, r1 = self.turn(hist, users[0])
        hist, r2 = self.turn(hist, users[1])
        # SIGTERM: the daemon saves what its slots hold before it exits.
        self.toki.kill(signal.SIGTERM)
        self.assertIn("shutdown: saving", self.toki.log_text())
        self.assertTrue(self.files())
        self.llama.kill()
        self.llama.restart()
        self.start_toki(idle_ms=0)
        hist, r3 = self.turn(hist, users[2])
        self.check_restored(r3, r2["cache"]["prompt_tokens"])
        hist, r4 = self.turn(hist, users[3])
        self.assertIn(r4["cache"]["route"], ("hit", "partial"))

    def test_fingerprint_mismatch_is_refused(self):
        self.start_llama()
        self.start_toki()
        hist, users = self.conversation()
        hist, r1 = self.turn(hist, users[0])
        hist, r2 = self.turn(hist, users[1])
        self.wait_saved(1)
        saved = self.files()
        self.assertTrue(saved)
        self.toki.kill(signal.SIGTERM)
        self.llama.kill()
        # Another context size: another KV layout. The files must not load.
        self.start_llama(ctx=self.CTX // 2 if self.CTX > 2048 else 1024)
        self.start_toki()
        hist2, r3 = self.turn(hist, users[2])
        self.assertNotEqual(r3["cache"]["route"], "disk")
        self.assertNotIn("restored", r3["cache"])
        for f in saved:
            self.assertNotIn(f, self.files(), "a mismatched state was kept")
        self.assertIn("does not match this backend", self.toki.log_text())
        self.toki.kill(signal.SIGTERM)
        self.llama.kill()
        # Another model.
        self.start_llama(model=th.generated_model("other", params="1M", ctx=self.CTX))
        self.start_toki()
        self.assertEqual(self.toki.stats()["saved_files"], 0)

    def test_damaged_file_is_discarded_and_answer_still_right(self):
        self.start_llama()
        self.start_toki()
        hist, users = self.conversation()
        hist, r1 = self.turn(hist, users[0])
        hist, r2 = self.turn(hist, users[1])
        self.toki.kill(signal.SIGTERM)
        self.llama.kill()
        files = self.files()
        self.assertTrue(files)
        for f in files:  # same size, other bytes
            path = os.path.join(self.dir, f)
            with open(path, "r+b") as fh:
                fh.seek(os.path.getsize(path) // 2)
                fh.write(b"\xde\xad\xbe\xef" * 16)
        self.start_llama()
        self.start_toki()
        hist, r3 = self.turn(hist, users[2])  # asserts identity with uncached
        self.assertNotEqual(r3["cache"]["route"], "disk")
        self.assertIn("corrupted (checksum differs)", self.toki.log_text())
        self.assertGreaterEqual(self.toki.stats()["discarded_files"], 1)


    def test_index_that_does_not_describe_its_file_is_discarded(self):
        """A sidecar whose "bytes" is not the data file's size (or whose data
        file is gone) is never indexed: it used to be, skewing the learned KV
        size and the disk budget."""
        self.start_llama()
        self.start_toki()
        hist, users = self.conversation()
        hist, r1 = self.turn(hist, users[0])
        hist, r2 = self.turn(hist, users[1])
        self.toki.kill(signal.SIGTERM)
        self.llama.kill()
        sidecars = sorted(f for f in os.listdir(self.dir) if f.endswith(".json"))
        self.assertTrue(sidecars)
        for f in sidecars:
            path = os.path.join(self.dir, f)
            with open(path) as fh:
                o = json.load(fh)
            o["bytes"] = -1
            with open(path, "w") as fh:
                json.dump(o, fh)
        self.start_llama()
        self.start_toki()
        st = self.toki.stats()
        self.assertEqual(st["saved_files"], 0, st)
        self.assertGreaterEqual(st["discarded_files"], len(sidecars), st)
        self.assertIn("its index does not describe the file", self.toki.log_text())
        hist, r3 = self.turn(hist, users[2])  # still right, from scratch
        self.assertNotEqual(r3["cache"]["route"], "disk")

class PersistenceStories(Persistence):
    """On the real tiny model (stories260K)."""


class PersistenceLongContext(Persistence):
    """On a generated model with a 32k context."""
    CTX = 32768

    @classmethod
    def model(cls):
        return th.generated_model("persist", params="4M", ctx=32768)


class PersistenceCompressed(Persistence):
    """Slot files stored zstd-compressed (--slot-compress): no expanded copy
    stays behind, and a damaged compressed file is caught too."""
    EXTRA = ["--slot-compress", "1"]
    EXT = ".zst"

    def tearDown(self):
        leftovers = [f for f in os.listdir(self.dir) if f.endswith((".bin", ".tmp", ".part"))]
        super().tearDown()
        self.assertEqual(leftovers, [])


del Persistence

if __name__ == "__main__":
    th.run_tests()
