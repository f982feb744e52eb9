"""Exact mode is lossless on a GPU backend: llama.cpp's Vulkan backend
(ggml-vulkan) on Mesa's software Vulkan driver, lavapipe, started with
GGML_VK_DISABLE_COOPMAT=1 (without it lavapipe's answers depend on what the
server computed before: test_vulkan.py, docs/exact.md "GPU backends").
There, at the default -ub 512, on a random-weight model and stories260K,
every answer is toki's uncached answer, text and every logprob: a multi-turn
conversation, two interleaved ones, each turn resent, a cancelled turn, and
a restart from slot files. The self-test verifies the backend first.

TOKI_GPU_CHECK=1 runs the same workloads on the llama-server named by
TOKI_GPU_LLAMA_SERVER, as it is, with -ngl 99 (scripts/gpu-check.sh)."""
import os
import shutil
import signal
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from test_exact_identity import answer, conversations

GPU_CHECK = os.environ.get("TOKI_GPU_CHECK") == "1"
BACKEND = "gpu" if GPU_CHECK else "vulkan"
REMEDY = None if GPU_CHECK else {"GGML_VK_DISABLE_COOPMAT": "1"}
GPU_ARGS = ["-ngl", "99"] if GPU_CHECK else []
# The models: random weights (near-tied logits, the strictest identity
# test) and a real tiny one.
MODELS = (("random 4M", lambda: th.generated_model("identity", params="4M", ctx=8192)),
          ("stories260K", th.test_model))


def body(msgs, max_tokens=16, **kw):
    b = {"messages": msgs, "temperature": 0, "max_tokens": max_tokens, "logprobs": True,
         "top_logprobs": 1}
    b.update(kw)
    return b


def ask(test, toki, msgs, **kw):
    st, r = th.request(toki.port, "POST", "/v1/chat/completions", body(msgs, **kw))
    test.assertEqual(st, 200, r)
    return r


class VulkanIdentity(unittest.TestCase):
    """Exact mode on ggml-vulkan with the remedy (or the GPU check's
    server): every answer is toki's uncached answer, text and logprobs, at
    the default -ub 512."""

    def servers(self, model, slot_dir=None):
        extra = GPU_ARGS + (["--slot-save-path", slot_dir] if slot_dir else [])
        llama = th.LlamaServer(model=model, slots=2, ctx=4096, backend=BACKEND, env=REMEDY,
                               extra=extra)
        self.addCleanup(llama.kill)
        return llama

    def start_toki(self, llama, name="toki", extra=()):
        toki = th.Toki([llama], mode="exact", name=name, extra=list(extra))
        self.addCleanup(toki.kill, signal.SIGTERM)
        ex = toki.stats()["backends"][0]["exact"]
        self.assertEqual(ex["selftest"], "verified", ex)
        return toki

    def check(self, toki, ref, msgs, what, sent=True):
        """The request through toki (and sent again), against the reference
        toki's uncached answer."""
        got = ask(self, toki, msgs)
        self.assertEqual(got["cache"]["exact"], "verified on this backend", got["cache"])
        want = ask(self, ref, msgs, cache_prompt=False)
        self.assertTrue(answer(got)[1], "no logprobs")
        self.assertEqual(answer(got), answer(want), f"{what}: cache={got['cache']}")
        if sent:
            again = ask(self, toki, msgs)
            self.assertEqual(answer(again), answer(want), f"{what}, resent: {again['cache']}")
            # Only the generation prompt (3 tokens on the built-in vocabulary,
            # 17 on stories260K's, whose role markers are text), in one step,
            # after a one-token cut where the slot kept the answer's rows.
            trimmed = again["cache"]["trimmed"]
            self.assertEqual(again["cache"]["steps"], 1 + trimmed, again["cache"])
            self.assertLessEqual(again["cache"]["evaluated"], 24 + trimmed, again["cache"])
        return got, want

    def test_conversations_resends_cancel_and_restart(self):
        for name, model_fn in MODELS:
            with self.subTest(model=name):
                self.run_model(model_fn())

    def run_model(self, model):
        slot_dir = tempfile.mkdtemp(prefix="toki-vk-slots-")
        self.addCleanup(shutil.rmtree, slot_dir, True)
        llama = self.servers(model, slot_dir)
        base = self.servers(model)
        ref = self.start_toki(base, name="reference")
        toki = self.start_toki(llama, extra=["--slot-dir", slot_dir,
                                             "--slot-save-idle-ms", "0"])
        # A long system prompt in paragraphs: several chunks, micro-batches
        # of every size.
        convs = conversations(5, count=3, turns=3)
        hist = [[{"role": "system", "content": "\n\n".join([s[:500], s[500:1000], s[1000:]])}]
                for s, _ in convs]
        evaluated = 0
        # One conversation, three turns; then two more interleaved.
        order = [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (1, 1), (2, 1)]
        for i, t in order:
            msgs = hist[i] + [{"role": "user", "content": convs[i][1][t]}]
            got, want = self.check(toki, ref, msgs, f"conversation {i} turn {t}")
            evaluated += got["cache"]["evaluated"]
            hist[i] = msgs + [{"role": "assistant", "content": want["choices"][0]["message"]
                               ["content"]}]
        # The next turns reused the conversations: far fewer evaluated than sent.
        self.assertGreater(toki.stats()["cached_tokens"], evaluated)

        # A cancelled turn: the client leaves mid-answer; the same turn sent
        # again is still the uncached answer.
        msgs = hist[1] + [{"role": "user", "content": convs[1][1][2]}]
        th.stream_then_leave(toki.port, "/v1/chat/completions",
                             body(msgs, max_tokens=400, stream=True))
        self.check(toki, ref, msgs, "after a cancel")

        # A restart from slot files: toki saves its slots as it stops, the
        # server restarts empty, and the next turn restores the state.
        msgs = hist[2] + [{"role": "user", "content": convs[2][1][2]}]
        toki.kill(signal.SIGTERM)
        self.assertIn("shutdown: saving", toki.log_text())
        llama.restart()
        toki = self.start_toki(llama, name="toki-again", extra=["--slot-dir", slot_dir])
        got, _ = self.check(toki, ref, msgs, "after a restart", sent=False)
        self.assertEqual(got["cache"]["route"], "disk", got["cache"])


if __name__ == "__main__":
    th.run_tests()
