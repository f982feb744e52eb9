"""Slot files: with one slot and no RAM cache, two conversations take turns;
toki saves each before evicting it and restores it on its next turn, so
only the new suffix is evaluated, and exact mode's text still equals an
uncached run.

AcrossBackends: two one-slot servers, fast mode; a conversation saved by the
first, whose slot is busy with a long answer, continues on the second from
the file when both write --slot-dir; when the second's --slot-save-path is
another folder, the restore fails there, the turn is evaluated instead, and
the file stays for its own backend. In exact mode the same holds where the
two servers' self-tests gave the same bits (both on this machine, one
build), and the restored turn's answer, text and logprobs, is toki's
uncached one."""
import http.client
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from test_exact_identity import answer, conversations


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


class AcrossBackends(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="toki-slots-")
        self.other = tempfile.mkdtemp(prefix="toki-slots-other-")
        # 24M: a long answer keeps its slot busy for seconds.
        self.model = th.generated_model("identity", params="24M", ctx=8192)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.other, ignore_errors=True)

    def run_case(self, shared, mode="fast"):
        # One thread each: one answers at length while the other serves.
        a = th.LlamaServer(model=self.model, slots=1, ctx=8192, ubatch=512,
                           extra=["--slot-save-path", self.dir], name="across-a", threads=1)
        b = th.LlamaServer(model=self.model, slots=1, ctx=8192, ubatch=512,
                           extra=["--slot-save-path", self.dir if shared else self.other],
                           name="across-b", threads=1)
        toki = th.Toki([a, b], mode=mode, ubatch=512,
                       extra=["--slot-dir", self.dir, "--slot-save-idle-ms", "100"])
        try:
            return self._run(a, b, toki, mode)
        finally:
            toki.kill(signal.SIGTERM)
            a.kill()
            b.kill()

    def _run(self, a, b, toki, mode):
        system = " ".join(f"rule {i}: keep the answer short and exact." for i in range(60))
        x1 = [{"role": "system", "content": system},
              {"role": "user", "content": "What is the first rule?"}]
        st, r1 = toki.chat(x1, max_tokens=8)
        self.assertEqual(st, 200, r1)
        home = r1["cache"]["backend"]
        away = b.url if home == a.url else a.url
        # The idle save: X's first turn is a file now.
        toki.wait_log("saved slot 0 as")
        saved = [f for f in os.listdir(self.dir) if f.endswith(".json")]
        self.assertEqual(len(saved), 1, saved)

        # Y continues X on its backend (a hit) and answers at length there;
        # X's other continuation then finds X's slot busy.
        x1_answer = {"role": "assistant", "content": r1["choices"][0]["message"]["content"]}
        y = x1 + [x1_answer, {"role": "user", "content": "Recite every rule."}]
        home_port = int(home.rsplit(":", 1)[1])
        done = {}

        def long_answer():
            c = http.client.HTTPConnection("127.0.0.1", toki.port, timeout=120)
            c.request("POST", "/v1/chat/completions",
                      body=json.dumps({"messages": y, "temperature": 0, "max_tokens": 6000,
                                       "ignore_eos": True, "stream": True}),
                      headers={"Content-Type": "application/json",
                               "Authorization": "Bearer " + th.TEST_TOKEN})
            r = c.getresponse()
            done["status"] = r.status
            done["conn"] = c
            while not done.get("stop") and r.readline():
                pass
            c.close()
        t = threading.Thread(target=long_answer, daemon=True)
        t.start()
        deadline = time.time() + 60
        while True:  # Y is generating on X's backend
            _, slots = th.request(home_port, "GET", "/slots")
            s0 = slots[0]
            nt = s0.get("next_token")
            nt = nt[0] if isinstance(nt, list) and nt else (nt or {})
            if s0.get("is_processing") and (nt.get("n_decoded") or 0) > 0:
                break
            self.assertLess(time.time(), deadline, "the long answer never started")
            time.sleep(0.02)

        x2 = x1 + [x1_answer, {"role": "user", "content": "And the second?"}]
        st, r2 = toki.chat(x2, max_tokens=8, logprobs=True, top_logprobs=2)
        _, slots = th.request(home_port, "GET", "/slots")
        still_busy = slots[0].get("is_processing")
        done["stop"] = True
        self.assertEqual(st, 200, r2)
        self.assertTrue(still_busy, "the long answer ended before the second turn ran")
        self.assertEqual(r2["cache"]["backend"], away, r2["cache"])
        t.join(timeout=60)
        self.ref = None
        if mode == "exact":
            st, self.ref = toki.chat(x2, max_tokens=8, logprobs=True, top_logprobs=2,
                                     cache_prompt=False)
            self.assertEqual(st, 200, self.ref)
            self.bits = [be["exact"]["bits"] for be in toki.stats()["backends"]]
        return r1, r2, toki.log_text(), saved[0][:-5]

    def test_restored_on_the_idle_backend(self):
        r1, r2, log, name = self.run_case(shared=True)
        c = r2["cache"]
        self.assertEqual(c["route"], "disk", c)
        self.assertEqual(c["restored"], name, c)
        # Only what follows the first turn's prompt was evaluated.
        self.assertLess(r2["timings"]["prompt_n"],
                        c["prompt_tokens"] - r1["cache"]["prompt_tokens"] + 32, c)
        self.assertIn(f"restored {name} ", log)
        self.assertIn(f"of {c['backend']}", log)

    def test_exact_restored_on_the_idle_backend_with_the_same_bits(self):
        r1, r2, log, name = self.run_case(shared=True, mode="exact")
        self.assertEqual(len(self.bits), 2)
        self.assertEqual(len(self.bits[0]), 64, self.bits)
        self.assertEqual(self.bits[0], self.bits[1])
        c = r2["cache"]
        self.assertEqual(c["route"], "disk", c)
        self.assertEqual(c["restored"], name, c)
        self.assertIn(f"of {c['backend']}", log)
        self.assertLess(r2["timings"]["prompt_n"],
                        c["prompt_tokens"] - r1["cache"]["prompt_tokens"] + 32, c)
        self.assertEqual(answer(r2), answer(self.ref))
        self.assertTrue(answer(r2)[1], "no logprobs in the answer")

    def test_restore_refused_where_the_folder_differs(self):
        r1, r2, log, name = self.run_case(shared=False)
        c = r2["cache"]
        # Tried, failed, evaluated instead: the whole prompt, a right answer.
        self.assertIn(f"restore of {name} (saved by ", log)
        self.assertIn("is --slot-dir this backend's --slot-save-path?", log)
        self.assertNotIn("restored", c)
        self.assertEqual(r2["timings"]["prompt_n"], c["prompt_tokens"], c)
        self.assertEqual(r2["choices"][0]["finish_reason"], "length")
        # The file is sound and stays for the backend that wrote it.
        self.assertTrue(os.path.exists(os.path.join(self.dir, name + ".json")))
        self.assertNotIn(f"{name} is ", log)  # not discarded as missing or damaged


if __name__ == "__main__":
    th.run_tests()
