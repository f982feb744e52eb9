"""Exact mode on the architectures people run besides llama's: random-weight
models (`toki gguf gen --arch`, about 1 MB each) of Qwen 3.5's hybrid
(Gated DeltaNet layers, whose recurrent state llama-server cannot cut back,
and gated attention), Gemma 3's sliding window (5 layers of 6) and
gpt-oss's (every other layer, with attention sinks and experts), all with
a 64-token window. On each, against the real llama-server at -ub 64:

  - a multi-turn conversation and two interleaved ones: every answer, text
    and every logprob, is toki's own uncached answer (cache_prompt:false
    through a second toki in exact mode, from an empty slot);
  - each turn sent again evaluates only its generation prompt, in one step;
  - a turn the client cancels mid-answer, then sent again;
  - a restart: toki saves its slots as it stops, llama-server restarts
    empty, and the next turn is restored from the file.

What llama-server keeps of such a model is its context checkpoints (a
recurrent or sliding-window state cannot be cut back to any position), so
exact mode's chunk ends are where it can resume. The evaluated tokens per
step are printed.

On the sliding-window models llama-server's restore of a state does not
continue as the live slot does: a slot restored from a file continues with
logprobs that differ in the fourth or fifth digit (the same text). llama-
server alone shows it: 448 tokens evaluated, saved, the server restarted,
restored, 64 more and 4 generated, against the same without the restart,
on gemma3: the second token's logprob -7.105610 restored, -7.105752 live;
on qwen35 the two are equal. The resend after a cancel differed once the
same way. So on such a model (its GGUF says it has a sliding window) exact
mode restores no file and keeps nothing of a cancelled request: there the
test asks for a recomputed turn (no disk route after the restart, a miss
after the cancel) and, as everywhere, the uncached answer exactly."""
import os
import shutil
import signal
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from test_exact_identity import answer, conversations

UBATCH = 64
# The generation prompt on the built-in vocabulary: <|im_start|> assistant \n.
GEN_PROMPT = 3


def body(msgs, max_tokens=16, **kw):
    b = {"messages": msgs, "temperature": 0, "max_tokens": max_tokens, "logprobs": True,
         "top_logprobs": 2}
    b.update(kw)
    return b


class ExactAnswers:
    """The checks of one request in exact mode, shared with
    test_local_prompts.py (FamilySchedules): a mixin for a TestCase (one
    imported there as a TestCase would have its tests run there too).
    Counts self.identical and self.total."""

    def ask(self, toki, msgs, **kw):
        st, r = th.request(toki.port, "POST", "/v1/chat/completions", body(msgs, **kw))
        self.assertEqual(st, 200, r)
        return r

    def check(self, toki, ref, msgs, what, resend=True, schedule="messages",
              resend_limit=GEN_PROMPT):
        """The request through toki (and sent again), against the reference
        toki's uncached answer, text and logprobs. resend_limit: the most
        tokens a resend may evaluate (None: not checked here). Returns
        (answer, uncached answer, resent)."""
        got = self.ask(toki, msgs)
        want = self.ask(ref, msgs, cache_prompt=False)
        self.assertEqual(want["cache"]["cached"], 0, want["cache"])
        # Tokenized and templated by toki, on the messages' schedule.
        for k, v in (("schedule", schedule), ("tokenized", "toki"), ("templated", "toki")):
            self.assertEqual(got["cache"][k], v, f"{what}: {got['cache']}")
        self.assertTrue(answer(got)[1], "no logprobs")
        self.assertEqual(answer(got), answer(want), f"{what}: cache={got['cache']}")
        self.identical += 1
        self.total += 1
        again = None
        if resend:
            again = self.ask(toki, msgs)
            self.assertEqual(answer(again), answer(want), f"{what}, resent: {again['cache']}")
            self.identical += 1
            self.total += 1
            # The last chunk (the generation prompt), in one step, after a
            # cut where the slot kept the answer's rows past it.
            self.assertEqual(again["cache"]["steps"], 1 + again["cache"]["trimmed"],
                             again["cache"])
            if resend_limit is not None:
                self.assertLessEqual(again["cache"]["evaluated"],
                                     resend_limit + again["cache"]["trimmed"], again["cache"])
        return got, want, again


class Architectures(ExactAnswers, unittest.TestCase):
    def start_toki(self, llama, name="toki", extra=()):
        toki = th.Toki([llama], mode="exact", ubatch=UBATCH, name=name, extra=list(extra))
        self.addCleanup(toki.kill, signal.SIGTERM)
        return toki

    def run_arch(self, arch):
        t0 = time.time()
        self.identical = self.total = 0
        model = th.arch_model(arch)
        slot_dir = tempfile.mkdtemp(prefix=f"toki-arch-{arch}-")
        self.addCleanup(shutil.rmtree, slot_dir, True)
        llama = th.LlamaServer(model=model, slots=2, ctx=4096, ubatch=UBATCH, name=arch,
                               extra=["--slot-save-path", slot_dir])
        self.addCleanup(llama.kill)
        base = th.LlamaServer(model=model, slots=1, ctx=4096, ubatch=UBATCH,
                              name=f"{arch}-baseline")
        self.addCleanup(base.kill)
        ref = self.start_toki(base, name="reference")
        toki = self.start_toki(llama, extra=["--slot-dir", slot_dir, "--slot-save-idle-ms", "0"])

        convs = conversations(21, count=3, turns=3)
        hist = [[{"role": "system", "content": s}] for s, _ in convs]
        log = []  # (what, prompt tokens, evaluated, evaluated when resent)
        # One conversation, three turns; then two more interleaved.
        order = [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (1, 1), (2, 1)]
        for i, t in order:
            msgs = hist[i] + [{"role": "user", "content": convs[i][1][t]}]
            got, want, again = self.check(toki, ref, msgs, f"{arch}: conversation {i} turn {t}")
            c = got["cache"]
            log.append((f"c{i}t{t}", c["prompt_tokens"], c["evaluated"],
                        again["cache"]["evaluated"]))
            if t > 0:
                # A next turn reuses its conversation: it evaluates less than
                # its new messages and the chunk they start in.
                prev = [p for (w, p, _, _) in log if w == f"c{i}t{t - 1}"][0]
                self.assertLess(c["evaluated"], c["prompt_tokens"] - prev + 2 * UBATCH, c)
            hist[i] = msgs + [{"role": "assistant",
                               "content": want["choices"][0]["message"]["content"]}]
        evaluated = sum(e + r for _, _, e, r in log)
        self.assertGreater(toki.stats()["cached_tokens"], evaluated)

        # A cancelled turn: the client leaves mid-answer; the same turn sent
        # again is still the uncached answer and evaluates only its
        # generation prompt.
        msgs = hist[1] + [{"role": "user", "content": convs[1][1][2]}]
        keeps = toki.log_text().count("tokens of the cancelled request")
        th.stream_then_leave(toki.port, "/v1/chat/completions",
                             body(msgs, max_tokens=2000, ignore_eos=True, stream=True))
        # The cancelled task stopped and its slot was cut to what it keeps.
        deadline = time.time() + 60
        while (toki.log_text().count("tokens of the cancelled request") <= keeps or any(
                s["busy"] for b in toki.stats()["backends"] for s in b["slots"])):
            self.assertLess(time.time(), deadline, "the cancelled request never released "
                            "its slot:\n" + toki.log_text())
            time.sleep(0.02)
        swa = arch in ("gemma3", "gpt-oss")
        got, _, again = self.check(toki, ref, msgs, f"{arch}: after a cancel")
        c = got["cache"]
        if swa:  # nothing kept: recomputed
            self.assertEqual(c["route"], "miss", c)
            self.assertIn("keeps 0 tokens of the cancelled request (a sliding-window",
                          toki.log_text())
        else:
            self.assertNotEqual(c["route"], "miss", c)
            self.assertLessEqual(c["evaluated"], GEN_PROMPT, c)
        log.append((f"cancel({c['route']})", c["prompt_tokens"], c["evaluated"],
                    again["cache"]["evaluated"]))

        # A restart from slot files.
        msgs = hist[2] + [{"role": "user", "content": convs[2][1][2]}]
        toki.kill(signal.SIGTERM)
        self.assertIn("shutdown: saving", toki.log_text())
        llama.restart()
        toki = self.start_toki(llama, name="toki-again", extra=["--slot-dir", slot_dir])
        prev = [p for (w, p, _, _) in log if w == "c2t1"][0]
        got, _, again = self.check(toki, ref, msgs, f"{arch}: after a restart")
        c = got["cache"]
        if swa:  # no file restored: recomputed
            self.assertNotEqual(c["route"], "disk", c)
            self.assertIn("has a sliding window", toki.log_text())
        else:
            self.assertEqual(c["route"], "disk", c)
            self.assertLess(c["evaluated"], c["prompt_tokens"] - prev + 2 * UBATCH, c)
        log.append(("restart", c["prompt_tokens"], c["evaluated"], again["cache"]["evaluated"]))
        print(f"\n{arch}: identical {self.identical}/{self.total}, "
              f"{time.time() - t0:.1f} s; step: prompt tokens, evaluated, evaluated resent: " +
              ", ".join(f"{w} {p}/{e}/{r}" for w, p, e, r in log), file=sys.stderr)

    def test_qwen35_hybrid(self):
        self.run_arch("qwen35")

    def test_qwen35moe_hybrid_experts(self):
        # The Qwen 3.5/3.6 MoE models' layers: qwen35's, with routed
        # experts and a gated shared one for the feed-forward.
        self.run_arch("qwen35moe")

    def test_gemma3_sliding_window(self):
        self.run_arch("gemma3")

    def test_gpt_oss_sliding_window_sinks_experts(self):
        self.run_arch("gpt-oss")


if __name__ == "__main__":
    th.run_tests()
