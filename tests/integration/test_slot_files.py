"""Slot files: with one slot and no RAM cache, two conversations take turns;
toki saves each before evicting it and restores it on its next turn, so
only the new suffix is evaluated, and exact mode's text still equals an
uncached run."""
import os
import shutil
import signal
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from test_exact_identity import conversations


class SlotFiles(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="toki-slots-")
        self.model = th.generated_model("identity", params="4M", ctx=8192)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_alternating(self, mode, disk_mb=None):
        llama = th.LlamaServer(model=self.model, slots=1, ctx=8192, ubatch=64,
                               extra=["--slot-save-path", self.dir])
        extra = ["--slot-dir", self.dir]
        if disk_mb:
            extra += ["--slot-disk-mb", str(disk_mb)]
        toki = th.Toki([llama], mode=mode, ubatch=64, extra=extra)
        baseline = th.LlamaServer(model=self.model, slots=1, ctx=8192, ubatch=64,
                                  name="baseline")
        try:
            convs = conversations(11, count=2, turns=3)
            hist = [[{"role": "system", "content": s}] for s, _ in convs]
            results = []
            for t in range(3):
                for i, (_, users) in enumerate(convs):
                    msgs = hist[i] + [{"role": "user", "content": users[t]}]
                    st, got = toki.chat(msgs, max_tokens=16)
                    self.assertEqual(st, 200, got)
                    st, want = th.request(baseline.port, "POST", "/v1/chat/completions",
                                          {"messages": msgs, "temperature": 0,
                                           "max_tokens": 16, "cache_prompt": False})
                    results.append((t, i, got, want))
                    hist[i] = msgs + [{"role": "assistant",
                                       "content": want["choices"][0]["message"]["content"]}]
            return results, toki.stats(), toki
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()
            baseline.kill()

    def test_conversations_survive_eviction(self):
        results, stats, _ = self.run_alternating("exact")
        for t, i, got, want in results:
            self.assertEqual(got["choices"][0]["message"]["content"],
                             want["choices"][0]["message"]["content"], (t, i, got["cache"]))
            if t > 0:
                c = got["cache"]
                # The conversation was evicted by the other one, then restored.
                self.assertEqual(c["route"], "disk", c)
                self.assertIn("restored", c)
                # Only what follows the grid point below the previous prompt
                # was evaluated: less than the new suffix plus one micro-batch.
                prev = [g for (tt, ii, g, _) in results if ii == i and tt == t - 1][0]
                new_suffix = c["prompt_tokens"] - prev["cache"]["prompt_tokens"]
                self.assertLessEqual(c["evaluated"], new_suffix + 64, c)
        self.assertGreaterEqual(stats["saves"], 4)
        self.assertGreaterEqual(stats["restores"], 4)
        files = [f for f in os.listdir(self.dir) if f.startswith("toki-")]
        self.assertTrue(files)

    def test_disk_cap_evicts_files(self):
        results, stats, _ = self.run_alternating("fast", disk_mb=1)
        # Each state is about 0.9-1.1 MB: at most one fits under the 1 MiB cap,
        # so every save but the last evicts a file, and what is left on disk
        # stays under the cap and matches the index.
        self.assertGreaterEqual(stats["saves"], 4)
        self.assertGreaterEqual(stats["saved_evictions"], stats["saves"] - 1)
        self.assertLessEqual(stats["saved_bytes"], 1 << 20)
        files = [f for f in os.listdir(self.dir) if f.startswith("toki-")]
        self.assertEqual(len(files), stats["saved_files"])
        self.assertLessEqual(sum(os.path.getsize(os.path.join(self.dir, f)) for f in files),
                             1 << 20)
        for t, i, got, want in results:
            self.assertEqual(got["choices"][0]["finish_reason"], "length")


if __name__ == "__main__":
    th.run_tests()
