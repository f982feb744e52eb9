"""Prompts made in toki (`toki serve --tokenize local`, the default) against
real llama-servers: the probes that decide whether the local tokenizer and
chat template are used, requests answered exactly as when the server makes
every prompt, and what happens when toki's prompt turns out wrong -- a
model file whose vocabulary was changed under the server, so that toki's
copy and the server's differ in one token: the request is planned again
with the server's prompt before the client sees a byte of the wrong plan,
and the backend's local engine is turned off. And exact mode's message
schedule on the real templates and vocabularies of Qwen 3, Llama 3, Gemma 3
and DeepSeek V3 (FamilySchedules)."""
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from test_architectures import UBATCH, ExactAnswers
from test_exact_identity import conversations

SYSTEM = ("You are a storyteller. You tell short stories about Lily and her dog Max, "
          "who live in a small house near the woods. ") * 2


def wait_prompts(toki, timeout=30):
    """The backend's prompts object once its probes have ended."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        b = toki.stats()["backends"][0]
        p = b.get("prompts", {})
        if b.get("up") and "probing" not in p.get("status", "probing"):
            return p
        time.sleep(0.1)
    raise AssertionError(f"probes did not end: {toki.stats()['backends'][0]}")


def edited_copy(src, dst, old, new):
    """A copy of the GGUF src at dst with token text old (as stored, with
    U+2581 for spaces) replaced by new, of the same length."""
    data = bytearray(open(src, "rb").read())
    o, n = old.encode(), new.encode()
    assert len(o) == len(n)
    key = len(o).to_bytes(8, "little") + o
    at = data.find(key)
    assert at >= 0 and data.find(key, at + 1) < 0, f"token {old!r} not found once"
    data[at + 8:at + 8 + len(o)] = n
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, dst)  # the running server keeps the file it opened


def conversation():
    """Requests of every kind the engine handles, and one it leaves to the
    server (a final assistant message: prefill)."""
    return [
        ("/v1/chat/completions", {"messages": [{"role": "system", "content": SYSTEM},
                                               {"role": "user", "content": "Tell me a story."}],
                                  "max_tokens": 12}),
        ("/v1/chat/completions", {"messages": [{"role": "system", "content": SYSTEM},
                                               {"role": "user", "content": "Tell me a story."},
                                               {"role": "assistant", "content": "Once upon a time"},
                                               {"role": "user", "content": "And then?"}],
                                  "max_tokens": 12, "stream": True}),
        ("/v1/completions", {"prompt": "Once upon a time, Lily and Max", "max_tokens": 12}),
        ("/anthropic/v1/messages", {"system": SYSTEM, "max_tokens": 12,
                          "messages": [{"role": "user", "content": "Where is Max?"}]}),
        ("/anthropic/v1/messages/count_tokens", {"system": SYSTEM,
                                       "messages": [{"role": "user", "content": "Where is Max?"}]}),
        # OpenAI's reasoning_effort, as an OpenAI SDK agent sends it and as
        # the Responses API's reasoning.effort becomes it: "none" turns a
        # thinking template's thinking off (Qwen 3's writes an empty think
        # block), which toki's rendering must do too.
        ("/v1/chat/completions", {"messages": [{"role": "system", "content": SYSTEM},
                                               {"role": "user", "content": "Tell me a story."}],
                                  "max_tokens": 12, "reasoning_effort": "none"}),
        ("/v1/responses", {"instructions": SYSTEM, "input": "Where is Max?",
                           "max_output_tokens": 12, "reasoning": {"effort": "none"}}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story."},
                                               {"role": "assistant", "content": "Lily"}],
                                  "max_tokens": 8}),
    ]


def answer_of(path, body, port):
    """(what the client read, the cache block) of one request."""
    body = dict(body, temperature=0)
    if body.get("stream"):
        st, events = th.stream(port, path, body)
        assert st == 200, events
        cache = None
        for ev in events:
            j = th.event_json(ev)
            if j and "cache" in j:
                cache = j["cache"]
        return th.stream_text(events), cache
    if path.endswith("/count_tokens"):
        body.pop("temperature")
    st, r = th.request(port, "POST", path, body)
    assert st == 200, r
    if path.endswith("/count_tokens"):
        return r["input_tokens"], None
    if path.endswith("/v1/messages"):
        # The whole prompt: how much of it was read from the cache depends
        # on the schedule, which is llama-server's own for prompts it made.
        u = r["usage"]
        return ([c.get("text") for c in r["content"]],
                u["input_tokens"] + u.get("cache_read_input_tokens", 0)), r.get("cache")
    if path == "/v1/responses":
        return ([c.get("text") for o in r["output"] if o.get("type") == "message"
                 for c in o["content"]], r["usage"]["input_tokens"]), r["cache"]
    if path == "/v1/completions":
        return (r["choices"][0]["text"], r["usage"]["prompt_tokens"]), r["cache"]
    return (r["choices"][0]["message"]["content"], r["usage"]["prompt_tokens"]), r["cache"]


class LocalPrompts(unittest.TestCase):
    def run_all(self, llama, mode, tokenize):
        toki = th.Toki([llama], mode=mode, extra=["--tokenize", tokenize])
        try:
            prompts = wait_prompts(toki)
            out = [answer_of(p, b, toki.port) for p, b in conversation()]
            return prompts, out, toki.stats()
        finally:
            toki.kill(signal.SIGTERM)

    def check_same_answers(self, model, mode, templated):
        llama = th.LlamaServer(model=model, slots=2, ctx=4096)
        try:
            p_local, local, st_local = self.run_all(llama, mode, "local")
            p_server, server, _ = self.run_all(llama, mode, "server")
        finally:
            llama.kill()
        self.assertTrue(p_local["local_tokenizer"], p_local)
        self.assertEqual(p_local["local_template"], templated, p_local)
        self.assertFalse(p_server["local_tokenizer"])
        self.assertIn("--tokenize server", p_server["status"])
        for (path, _), (a, ca), (b, cb) in zip(conversation(), local, server):
            with self.subTest(path=path):
                self.assertEqual(a, b)
                if cb is not None:
                    self.assertEqual(cb["tokenized"], "server")
                    self.assertEqual(ca["prompt_tokens"], cb["prompt_tokens"])
                if ca is not None:
                    self.assertEqual(ca["tokenized"], "toki")
                    self.assertGreater(ca["tokenize_ms"], 0)
        # The chat requests the engine rendered were templated here; the
        # prefill (last) one by the server, and then tokenized here.
        self.assertEqual(local[0][1]["templated"], "toki" if templated else "server")
        self.assertEqual(local[-1][1]["templated"], "server")
        b = st_local["backends"][0]["prompts"]
        self.assertEqual(b["mismatches"], 0, b)
        self.assertEqual(b["local"], len(conversation()), b)
        self.assertGreater(b["local_ms"], 0)
        self.assertGreaterEqual(b["audits"], 4, b)  # every request at first
        self.assertEqual(st_local["replans"], 0)

    def test_stories_exact(self):
        """stories260K (SentencePiece, llama-server's default ChatML)."""
        self.check_same_answers(th.test_model(), "exact", True)

    def test_qwen3_fast(self):
        """Qwen 3's real vocabulary and template (thinking on by default)."""
        self.check_same_answers(th.tokenizer_model("qwen3", "qwen2"), "fast", True)

    def test_llama3_exact(self):
        self.check_same_answers(th.tokenizer_model("llama3", "llama-bpe"), "exact", True)

    def test_template_llama_server_renders_its_own_way(self):
        """A template llama-server knows for LFM2's (by its tool-list
        markers) goes through the server's own handler, which may change
        the messages: toki only tokenizes what the server templated."""
        tmpl = os.path.join(th.WORK_DIR, "lfm2-like.jinja")
        with open(tmpl, "w") as f:
            f.write("{# <|tool_list_start|><|tool_list_end|> #}{% for m in messages %}"
                    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
        model = os.path.join(th.WORK_DIR, "tmpl-lfm2-like.gguf")
        subprocess.run([th.TOKI_BIN, "gguf", "gen", "-o", model, "--params", "1M", "--ctx",
                           "8192", "--chat-template", tmpl], check=True, capture_output=True)
        llama = th.LlamaServer(model=model, slots=1, ctx=4096)
        toki = th.Toki([llama])
        try:
            p = wait_prompts(toki)
            self.assertTrue(p["local_tokenizer"], p)
            self.assertFalse(p["local_template"], p)
            self.assertIn("its own way", p["status"])
            st, r = toki.chat([{"role": "user", "content": "hi"}])
            self.assertEqual(st, 200, r)
            self.assertEqual(r["cache"]["templated"], "server")
            self.assertEqual(r["cache"]["tokenized"], "toki")
            self.assertEqual(r["cache"]["prompt_tokens"], r["usage"]["prompt_tokens"])
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()


class FamilySchedules(ExactAnswers, unittest.TestCase):
    """Exact mode's message schedule on real templates and vocabularies
    (random weights; the npm tokenizers of tokenizer_model): a conversation
    of three turns through a real `toki serve` in exact mode, each turn sent
    again. Every answer, text and every logprob, is toki's own uncached
    answer (a reference toki in exact mode on its own server,
    cache_prompt:false); the cache block says who tokenized and templated
    and which schedule; a resend reuses everything before its last chunk
    and that chunk's whole micro-batches but the last (a generation prompt
    is shorter than one) and evaluates the rest in one step; the next turn
    reuses as much.

    Where the last chunk starts is said by the server, not by toki: the
    server's prompt without the generation prompt (/apply-template with
    add_generation_prompt false), tokenized by /tokenize. Llama 3's template
    appends the assistant header whatever add_generation_prompt says, so a
    rendering of the messages before an assistant message ends in that
    header: chunks start at each assistant message's text, and a first
    turn, which has no answer yet, has no message start (the grid: one
    chunk from 0). Its generation prompt is then empty (the prompt without
    one is the whole prompt), as Devstral's is: an answer's tokens are one
    step each, up to its end of turn, and the last chunk starts at the last
    answer's end of turn."""

    def joins(self, llama, msgs):
        """Whether the server's template writes an answer right after the
        whole prompt once the conversation goes on (the server's rendering
        of the messages, an answer and a user's turn begins with its
        prompt): exact mode's joined header, docs/exact.md step 7."""
        st, full = th.request(llama.port, "POST", "/apply-template", {"messages": msgs})
        self.assertEqual(st, 200, full)
        more = msgs + [{"role": "assistant", "content": "X"}, {"role": "user", "content": "Y"}]
        st, r = th.request(llama.port, "POST", "/apply-template",
                           {"messages": more, "add_generation_prompt": False})
        self.assertEqual(st, 200, r)
        return len(r["prompt"]) > len(full["prompt"]) and r["prompt"].startswith(full["prompt"])

    def last_start(self, llama, msgs, last):
        """How many tokens of the server's prompt for msgs come before the
        last chunk: those before the generation prompt (last "header") or
        before the last message (last "message": a template with no
        generation prompt, whose last chunk is the user's turn); where the
        generation prompt is empty, those before the last answer's
        end-of-turn token, the last of its steps (last "answer_end"); before
        the last message while there is no answer yet."""
        if last == "answer_end" and not any(m["role"] == "assistant" for m in msgs):
            last = "message"
        if last != "answer_end":
            st, r = th.request(llama.port, "POST", "/apply-template",
                               {"messages": msgs if last == "header" else msgs[:-1],
                                "add_generation_prompt": False})
            self.assertEqual(st, 200, r)
            text = r["prompt"]
        else:
            st, r = th.request(llama.port, "POST", "/apply-template", {"messages": msgs})
            self.assertEqual(st, 200, r)
            answer_text = [m for m in msgs if m["role"] == "assistant"][-1]["content"].strip()
            at = r["prompt"].rfind(answer_text)
            self.assertGreater(at, 0, r["prompt"])
            text = r["prompt"][:at + len(answer_text)]
        st, r = th.request(llama.port, "POST", "/tokenize",
                           {"content": text, "add_special": True, "parse_special": True})
        self.assertEqual(st, 200, r)
        return len(r["tokens"])

    def run_family(self, name, pre, last="header", first_schedule="messages", template=None,
                   label=None):
        t0 = time.time()
        self.identical = self.total = 0
        model = th.tokenizer_model(name, pre, template=template)
        name = label or name
        llama = th.LlamaServer(model=model, slots=1, ctx=4096, ubatch=UBATCH, name=name)
        self.addCleanup(llama.kill)
        base = th.LlamaServer(model=model, slots=1, ctx=4096, ubatch=UBATCH,
                              name=f"{name}-reference")
        self.addCleanup(base.kill)
        ref = th.Toki([base], mode="exact", ubatch=UBATCH, name="reference")
        self.addCleanup(ref.kill, signal.SIGTERM)
        toki = th.Toki([llama], mode="exact", ubatch=UBATCH)
        self.addCleanup(toki.kill, signal.SIGTERM)

        system, users = conversations(31, count=1, turns=3)[0]
        msgs = [{"role": "system", "content": system}]
        log, reused = [], None
        for t, user in enumerate(users):
            msgs = msgs + [{"role": "user", "content": user}]
            schedule = first_schedule if t == 0 else "messages"
            what = f"{name}: turn {t}"
            got, want, again = self.check(toki, ref, msgs, what, schedule=schedule,
                                          resend_limit=None)
            c, a = got["cache"], again["cache"]
            if schedule == "messages":
                self.assertEqual(c["schedule_why"], "messages rendered by toki", c)
                self.assertGreater(c["chunks"], 1, f"{what}: {c}")
                # Where the header joins, the last chunk is the prompt's
                # last token alone.
                start = (c["prompt_tokens"] - 1 if self.joins(llama, msgs)
                         else self.last_start(llama, msgs, last))
            else:
                self.assertEqual(c["schedule_why"], "no message start in the prompt", c)
                start = 0  # the grid: one chunk
            # Resent: the last chunk's whole micro-batches but the last are
            # reused, and at least one token is evaluated.
            n = c["prompt_tokens"]
            self.assertEqual(a["cached"], start + (n - start - 1) // UBATCH * UBATCH,
                             f"{what}, resent (last chunk from {start}): {a}")
            # (After a one-token cut where the slot kept the answer's rows.)
            self.assertEqual(a["cached"] + a["evaluated"], n + a["trimmed"], a)
            if reused is not None:
                # The next turn reuses what the turn before's resend did, and
                # the rows of its answer that the slot kept (their text's
                # tokens as generated, exact mode's steps).
                self.assertGreaterEqual(c["cached"], reused, f"{what}: {c}")
            reused = a["cached"]
            log.append((t, c["schedule"], c["chunks"], c["prompt_tokens"], c["evaluated"],
                        a["evaluated"]))
            # With reasoning, which Qwen 3's template drops from answers
            # before the last user turn (the others ignore it).
            msgs = msgs + [{"role": "assistant",
                            "content": want["choices"][0]["message"]["content"],
                            "reasoning_content": f"Turn {t}: think it over."}]
        print(f"\n{name}: identical {self.identical}/{self.total}, {time.time() - t0:.1f} s; "
              "turn: schedule, chunks, prompt tokens/evaluated/evaluated resent: " +
              ", ".join(f"{t} {s} {k} {p}/{e}/{r}" for t, s, k, p, e, r in log),
              file=sys.stderr)

    def test_qwen3_messages(self):
        self.run_family("qwen3", "qwen2")

    def test_llama3_messages_from_the_second_turn(self):
        self.run_family("llama3", "llama-bpe", last="answer_end", first_schedule="grid")

    def test_llama3_2_messages(self):
        # Llama 3.2's tool-calling template appends its header only for the
        # generation prompt: the message schedule from the first turn.
        self.run_family("llama3_2", "llama-bpe")

    def test_gemma3_messages(self):
        self.run_family("gemma3", None)

    def test_deepseek_v3_messages(self):
        self.run_family("deepseek_v3", "deepseek-v3")

    def test_deepseek_v3_1_messages(self):
        # DeepSeek V3.1's template, as its GGUF carries it (</think> after
        # the assistant marker while `thinking` is off), on DeepSeek V3's
        # vocabulary.
        self.run_family("deepseek_v3", "deepseek-v3",
                        template=th.gguf_template("library/deepseek-v3.1:latest"),
                        label="deepseek-v3.1")

    def test_qwen3_coder_messages(self):
        # Qwen3-Coder's template (the tool format Qwen 3.5/3.6 kept), as its
        # GGUF carries it, on Qwen 3's vocabulary.
        self.run_family("qwen3", "qwen2", template=th.gguf_template("library/qwen3-coder:30b"),
                        label="qwen3-coder")

    def test_devstral_messages(self):
        # Devstral's, as its GGUF carries it, on Mistral's Tekken vocabulary.
        # It has no generation prompt (the answer follows [/INST]) and ends
        # an answer with </s>, which llama-server cuts off the rendering of
        # the messages up to it: chunks start at each answer's text, as on
        # Llama 3, and on the first turn at the user's.
        # Its default system message carries today's date (strftime_now).
        th.on_one_day(lambda: self.run_family(
            "mistral_nemo", "tekken", last="answer_end",
            template=th.gguf_template("library/devstral:latest"), label="devstral"))


class ServerPrompts(unittest.TestCase):
    """Where toki must not make prompts itself."""

    def test_model_file_not_readable(self):
        model = os.path.join(th.WORK_DIR, "vanishing.gguf")
        shutil.copyfile(th.test_model(), model)
        llama = th.LlamaServer(model=model, slots=1, ctx=2048)
        os.unlink(model)  # the server has it open; toki cannot read it
        toki = th.Toki([llama])
        try:
            p = wait_prompts(toki)
            self.assertFalse(p["local_tokenizer"], p)
            self.assertIn("not readable", p["status"])
            st, r = toki.chat([{"role": "user", "content": "hi"}])
            self.assertEqual(st, 200, r)
            self.assertEqual(r["cache"]["tokenized"], "server")
            self.assertEqual(r["cache"]["prompt_tokens"], r["usage"]["prompt_tokens"])
            self.assertEqual(toki.stats()["backends"][0]["prompts"]["server"], 1)
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()

    def test_server_that_tokenizes_otherwise_fails_the_probes(self):
        """The server overrides the file's add_bos_token: its tokens differ
        from what the file says, and the first probe shows it."""
        llama = th.LlamaServer(slots=1, ctx=2048,
                               extra=["--override-kv", "tokenizer.ggml.add_bos_token=bool:false"])
        toki = th.Toki([llama])
        try:
            p = wait_prompts(toki)
            self.assertFalse(p["local_tokenizer"], p)
            self.assertIn("differs from the server's on probe 1", p["status"])
            st, r = toki.chat([{"role": "user", "content": "hi"}])
            self.assertEqual(st, 200, r)
            self.assertEqual(r["cache"]["tokenized"], "server")
            self.assertEqual(r["cache"]["prompt_tokens"], r["usage"]["prompt_tokens"])
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()


class WrongLocalPrompt(unittest.TestCase):
    """toki's copy of the model differs from the server's in one token that
    no probe uses ("\u2581The"). The server runs the original; the file at
    its model path is then replaced with the edited copy, which toki reads."""

    @classmethod
    def setUpClass(cls):
        cls.model = os.path.join(th.WORK_DIR, "edited-under-the-server.gguf")
        shutil.copyfile(th.test_model(), cls.model)
        cls.llama = th.LlamaServer(model=cls.model, slots=2, ctx=2048)
        cls.original = os.path.join(th.WORK_DIR, "edited-original.gguf")
        shutil.copyfile(th.test_model(), cls.original)

    @classmethod
    def tearDownClass(cls):
        cls.llama.kill()

    def setUp(self):
        # A fresh daemon each time: the first difference turns its engine off.
        self.toki = None

    def tearDown(self):
        if self.toki:
            self.toki.kill(signal.SIGTERM)

    def start(self, edit):
        shutil.copyfile(self.original, self.model + ".base")
        edit(self.model + ".base", self.model)
        os.unlink(self.model + ".base")
        self.toki = th.Toki([self.llama], mode="exact")
        p = wait_prompts(self.toki)
        self.assertTrue(p["local_tokenizer"] and p["local_template"], p)

    def reference(self, path, body):
        """The answer with every prompt made by the server."""
        t = th.Toki([self.llama], mode="exact", extra=["--tokenize", "server"])
        try:
            wait_prompts(t)
            return answer_of(path, body, t.port)[0]
        finally:
            t.kill(signal.SIGTERM)

    def one_token_fewer(self, src, dst):
        # "\u2581The" becomes "\u2581Thf": toki spells "The" in more tokens.
        edited_copy(src, dst, "\u2581The", "\u2581Thf")

    def check_replanned(self, path, body):
        want = self.reference(path, body)
        self.start(self.one_token_fewer)
        got, cache = answer_of(path, body, self.toki.port)
        self.assertEqual(got, want)
        self.assertEqual(cache["tokenized"], "server")  # the second plan's prompt
        st = self.toki.stats()
        self.assertEqual(st["replans"], 1)
        p = st["backends"][0]["prompts"]
        self.assertFalse(p["local_tokenizer"], p)
        self.assertFalse(p["local_template"], p)
        self.assertGreaterEqual(p["mismatches"], 1)
        self.assertIn("since a difference", p["status"])
        self.assertIn("planning the request again", self.toki.log_text())
        # From now on the server makes the prompts, and nothing is replanned.
        got2, cache2 = answer_of(path, body, self.toki.port)
        self.assertEqual(got2, want)
        self.assertEqual(cache2["tokenized"], "server")
        self.assertEqual(self.toki.stats()["replans"], 1)

    def test_stream_replanned_before_the_answer(self):
        self.check_replanned("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "The dog ran. The cat sat. The end."}],
            "max_tokens": 10, "stream": True})

    def test_answer_replanned(self):
        self.check_replanned("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "The dog ran. The cat sat. The end."}],
            "max_tokens": 10})

    def test_completion_replanned(self):
        self.check_replanned("/v1/completions", {
            "prompt": "The dog ran. The cat sat. The end.", "max_tokens": 10, "stream": True})

    def test_same_count_other_tokens_caught_by_the_audit(self):
        """Two tokens' texts swapped: as many tokens either way, so only the
        audit (the server tokenizes the same request off its path) sees it."""
        def swap(src, dst):
            edited_copy(src, dst, "\u2581The", "\u2581Tqq")
            edited_copy(dst, dst, "\u2581Tim", "\u2581The")
            edited_copy(dst, dst, "\u2581Tqq", "\u2581Tim")
        self.start(swap)
        body = {"messages": [{"role": "user", "content": "And The end."}], "max_tokens": 4}
        st, r = self.toki.chat(body["messages"], max_tokens=4)
        self.assertEqual(st, 200, r)
        deadline = time.time() + 10
        while time.time() < deadline:
            p = self.toki.stats()["backends"][0]["prompts"]
            if p["mismatches"]:
                break
            time.sleep(0.1)
        self.assertEqual(p["mismatches"], 1, p)
        self.assertFalse(p["local_tokenizer"], p)
        st, r = self.toki.chat(body["messages"], max_tokens=4)
        self.assertEqual(r["cache"]["tokenized"], "server")


if __name__ == "__main__":
    th.run_tests()
