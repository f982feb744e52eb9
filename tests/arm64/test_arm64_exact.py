"""Exact mode on Linux aarch64: the arm64 toki (cross-built, run under
qemu-user) in front of Debian sid's arm64 llama-server (also under
qemu-user, ggml's baseline armv8.0_1 CPU variant), on stories260K. Three
turns of one conversation at temperature 0 with logprobs: each answer, text
and every logprob, is the same request's uncached answer (`cache_prompt:
false` through a second toki on a second server), and the second and third
turns reused the turns before them.

Run by scripts/test-arm64.sh, which sets TOKI_ARM64=1, TOKI_BIN (a wrapper
that runs build-arm64/toki under qemu-aarch64 -L SYSROOT) and
TOKI_LLAMA_SERVER (provision-llama-server.sh --arch arm64's wrapper). ctest
does not collect this directory; run alone, it skips."""
import os
import signal
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import toki_harness as th  # noqa: E402
from test_exact_identity import answer, conversations  # noqa: E402

ARM64 = os.environ.get("TOKI_ARM64") == "1"
# Everything runs emulated, two servers and two tokis on what may be two
# cores: deadlines are generous, and nothing sleeps for a fixed time.
START_TIMEOUT = 300


@unittest.skipUnless(ARM64, "run by scripts/test-arm64.sh (TOKI_ARM64=1, TOKI_BIN and "
                     "TOKI_LLAMA_SERVER naming the arm64 toki and llama-server)")
class Arm64Exact(unittest.TestCase):

    def stopped(self, proc, sig=signal.SIGKILL):
        """A cleanup that stops proc and closes its pipe and log."""
        def stop():
            proc.kill(sig)
            proc.proc.stdout.close()
            proc.log.close()
        self.addCleanup(stop)
        return proc

    def start_toki(self, llama, name):
        """toki serve in exact mode, once it listens (its self-test then
        runs: ready() waits for it)."""
        return self.stopped(th.Toki([llama], mode="exact", name=name, wait=False),
                            signal.SIGTERM)

    def ready(self, toki):
        th.wait_http(toki.port, timeout=START_TIMEOUT)
        ex = toki.stats()["backends"][0]["exact"]
        self.assertEqual(ex["selftest"], "verified", ex)

    def ask(self, toki, msgs, **kw):
        body = {"messages": msgs, "temperature": 0, "max_tokens": 16, "logprobs": True,
                "top_logprobs": 2}
        body.update(kw)
        st, r = th.request(toki.port, "POST", "/v1/chat/completions", body, timeout=600)
        self.assertEqual(st, 200, r)
        return r

    def test_three_turns_identical_to_uncached(self):
        model = th.test_model()
        # The server under test and the reference's own (whose slots the
        # uncached requests fill, leaving the tested server's alone).
        llama = self.stopped(th.LlamaServer(model=model, slots=2, ctx=4096, name="arm64-llama"))
        base = self.stopped(th.LlamaServer(model=model, slots=1, ctx=4096,
                                           name="arm64-reference-llama"))
        # Both self-tests at once.
        toki = self.start_toki(llama, "arm64-toki")
        ref = self.start_toki(base, "arm64-reference")
        self.ready(toki)
        self.ready(ref)

        # A system prompt of three paragraphs (three chunks of exact mode's
        # schedule) that with the first user message passes -ub 512 (a
        # prefill of two micro-batches): about 700 tokens of stories260K's
        # vocabulary. The servers' prefill under qemu is the test's cost.
        (system, users), = conversations(34, count=1, turns=3)
        system = "\n\n".join([system[:300], system[300:600], system[600:900]])
        msgs = [{"role": "system", "content": system}]
        prev_prompt = 0
        for turn, user in enumerate(users):
            msgs = msgs + [{"role": "user", "content": user}]
            got = self.ask(toki, msgs)
            want = self.ask(ref, msgs, cache_prompt=False)
            cache = got["cache"]
            self.assertEqual(cache["exact"], "verified on this backend", cache)
            g, w = answer(got), answer(want)
            self.assertTrue(g[1], "no logprobs in the answer")
            self.assertEqual(len(g[1]), len(w[1]), f"turn {turn}: token counts differ")
            self.assertEqual(g, w, f"turn {turn}: exact mode differs from uncached\n"
                                   f"cache={cache}\n toki: {g[0]!r}\n want: {w[0]!r}")
            # The cache did its work: a next turn reuses the whole previous
            # prompt but its generation prompt (17 tokens on stories260K's
            # vocabulary, whose role markers are text).
            if turn > 0:
                self.assertGreaterEqual(cache["cached"], prev_prompt - 24, cache)
                self.assertEqual(cache["evaluated"], cache["prompt_tokens"] - cache["cached"],
                                 cache)
            prev_prompt = cache["prompt_tokens"]
            print(f"turn {turn + 1}: identical ({len(g[1])} tokens, every logprob); "
                  f"prompt {cache['prompt_tokens']}, evaluated {cache['evaluated']}, "
                  f"cached {cache['cached']}", flush=True)
            # The next turn continues from the uncached answer.
            msgs = msgs + [{"role": "assistant", "content": w[0]}]


if __name__ == "__main__":
    th.run_tests()
