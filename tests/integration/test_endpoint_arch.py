"""The endpoint's swaps on the model kinds besides stories260K: a random-weight
llama (near-tied logits: the strictest identity test) and Qwen 3.5's hybrid
(Gated DeltaNet layers, whose recurrent state llama-server cannot cut back),
each under two names (the same weights: the same answers), with
TOKI_MAX_LOADED=1 so that every change of model is a swap. For each kind a
conversation's second turn, on the copy that was swapped out and back,
comes from its slot files (route "disk") and evaluates no more than the same
turn on the copy that stayed loaded; its answer, text and every logprob, is
the uncached one (cache_prompt: false)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from test_exact_identity import answer, conversations


class EndpointArchitectures(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="toki-endpoint-arch-")
        self.env = dict(os.environ, TOKI_STATE_DIR=os.path.join(self.tmp, "state"),
                        TOKI_MODEL_REGISTRY=os.path.join(self.tmp, "models.yaml"),
                        TOKI_LLAMA_SERVER=th.llama_server_path(), TOKI_MAX_LOADED="1")
        kinds = {"llama": th.generated_model("ep-llama", params="1M", ctx=4096),
                 "hybrid": th.arch_model("qwen35")}
        reg = "models:\n"
        for kind, path in kinds.items():
            for copy in ("1", "2"):
                reg += "  %s%s:\n    path: %s\n    ctx: 2048\n" % (kind, copy, path)
        with open(self.env["TOKI_MODEL_REGISTRY"], "w") as f:
            f.write(reg)
        self.port = th.free_port()

    def tearDown(self):
        subprocess.run([th.TOKI_BIN, "down"], env=self.env, capture_output=True, timeout=120)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def chat(self, model, msgs, **kw):
        body = dict({"model": model, "messages": msgs, "max_tokens": 12, "temperature": 0,
                     "logprobs": True, "top_logprobs": 2}, **kw)
        st, r = th.request(self.port, "POST", "/v1/chat/completions", body)
        self.assertEqual(st, 200, r)
        return r

    def test_swaps_keep_the_cache_on_each_kind(self):
        r = subprocess.run([th.TOKI_BIN, "up", "--port", str(self.port)], env=self.env,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        for seed, kind in enumerate(("llama", "hybrid")):
            one, two = kind + "1", kind + "2"
            system, users = conversations(31 + seed, count=1, turns=2)[0]
            # Past the 256 tokens a slot needs to be saved (router.c, save_min_tokens).
            hist = [{"role": "system", "content": (system + " " + system)[:2500]},
                    {"role": "user", "content": users[0][:300]}]
            t1 = self.chat(one, hist)
            self.assertEqual(answer(self.chat(two, hist)), answer(t1))  # one swapped out
            hist2 = hist + [{"role": "assistant", "content": answer(t1)[0]},
                            {"role": "user", "content": users[1][:300]}]
            stayed = self.chat(two, hist2)  # no swap between its two turns
            back = self.chat(one, hist2)  # swapped out and back
            c = back["cache"]
            self.assertEqual(c["route"], "disk", (kind, c))
            self.assertLessEqual(c["evaluated"], stayed["cache"]["evaluated"],
                                 (kind, c, stayed["cache"]))
            self.assertEqual(back["timings"]["prompt_n"], c["evaluated"])
            raw = self.chat(one, hist2, cache_prompt=False)
            self.assertEqual(raw["cache"]["cached"], 0, raw["cache"])
            self.assertTrue(answer(back)[1], "no logprobs")
            self.assertEqual(answer(back), answer(raw), (kind, c))
            self.assertEqual(answer(stayed), answer(raw), kind)
            print(f"\n{kind}: turn 2 evaluated {c['evaluated']} of {c['prompt_tokens']} after "
                  f"a swap, {stayed['cache']['evaluated']} without", file=sys.stderr)


if __name__ == "__main__":
    th.run_tests()
