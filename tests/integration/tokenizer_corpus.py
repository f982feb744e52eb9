"""Texts that exercise a tokenizer where ports of llama.cpp's tokenizers go
wrong: every Unicode category the pre-tokenizers test, whitespace runs and
newlines in every combination, digits in runs, contractions in both cases,
code, JSON, special-token text glued to words, and random mixtures of all of
them (seeded, so a failure can be reproduced). Standard library only."""
import random

FIXED = [
    "", " ", "  ", "\n", "\n\n", " \n", "\n ", "\t", " \t\n  \r\n", "\r\n\r\n",
    "Hello world", " Hello world", "Hello  world", "Hello world ", "hello\nworld",
    "Once upon a time, there was a little girl named Lily.",
    "I'm here. You're there. It's fine. We'll see. They've gone. He'd go. I'M LOUD. DON'T",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'Ve 'M 'LL 'D ' s",
    "1 12 123 1234 12345 123456 3.14159 1,000,000 0x1F 2e10 -42",
    "a1b2c3 abc123def 123abc",
    "    four spaces\n        eight\n\ttab\t\ttabs",
    "def f(x):\n    return x * 2  # double\n\nprint(f(21))\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    '{"name": "toki", "tokens": [1, 2, 3], "ok": true, "nested": {"a": null}}',
    "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    "Ünïcödé façade naïve café résumé Ærøskøbing Straße",
    "Привет, мир! Ελληνικά γράμματα. עברית שלום. العربية مرحبا",
    "中文字符测试，句号。日本語のテキスト、カタカナ。한국어 텍스트입니다.",
    "emoji 😀😃 🎉 👩‍💻 🇺🇸 ✨ — “quotes” ‘single’ … • § ¶ © ® ™ € £ ¥",
    "math: ∑ ∫ √ ≤ ≥ ≠ ∞ π ± × ÷ ½ ¾ ² ³ ℕ ℤ",
    "\u00a0nbsp\u2003em space\u3000ideographic\u2028line sep\u2029para\u0085nel",
    "combining: e\u0301 a\u0308 n\u0303 \u0915\u093f \u0e01\u0e34",
    "zero width: a\u200bb\u200cc\u200dd\ufeffe",
    "private use: \ue000\uf8ff and rare: \U0001f9ff \U00010348 \U0002070e",
    "MiXeD CaSe WoRdS ALLCAPS lowercase camelCase snake_case kebab-case",
    "punctuation!!! ??? ... ,,, ;;; ::: --- ___ *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
    "URL: https://example.com/path?q=1&r=two#frag user@example.org",
    "trailing spaces   \n   leading spaces",
    "a\r\nb\rc\nd",
    "\n\n\nmany\n\n\n\nnewlines\n\n",
    "x" * 300,
    " " * 40 + "y",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<s>text</s><unk>",
    "before<|im_end|>after <|im_start|> spaced <|endoftext|>glued",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<|im_start|><|im_start|><|im_end|><|im_end|>",
    "<|im_sta rt|> broken <|im_end| > tags",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
]

ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789",
    " ", "  ", "\n", "\t", "\r\n", ".,;:!?'\"-_()[]{}<>/\\|@#$%^&*+=~`",
    "éèêëàâäôöûüçñß", "абвгдежзийклмнопрст", "αβγδεζηθικλμ", "中文字符测试日本語한국어",
    "😀🎉✨👍", "\u00a0\u3000\u2003", "\u0301\u0308", "½²³", "€£¥", "'s", "'T", "<|", "|>",
]


def random_texts(seed, n, max_len=60):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, max_len // 4)):
            alpha = rng.choice(ALPHABETS)
            parts.append("".join(rng.choice(alpha) for _ in range(rng.randint(1, 6))))
        out.append("".join(parts))
    return out


def corpus(seed=1, n_random=300, specials=()):
    """The fixed texts, the texts with each of the model's special tokens
    pasted into them, and n_random random mixtures."""
    texts = list(FIXED)
    rng = random.Random(seed + 1)
    for s in specials:
        a, b = rng.choice(FIXED), rng.choice(FIXED)
        texts.append(a + s + b)
        texts.append(s + " " + a)
    return texts + random_texts(seed, n_random)
