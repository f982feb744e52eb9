"""Exact mode is lossless: at temperature 0 its answer (text and logprobs) is
identical to an uncached run of the same request, over many interleaved
multi-turn conversations that evict each other's slots. The uncached run is
`cache_prompt: false` through a separate toki in exact mode (the prompt on
its message schedule, from an empty slot); in grid mode it is llama-server's
own uncached run on a separate server.

On a random-weight model logits nearly tie, so any numeric difference shows
in the text. Fast mode's identity rate, a property of llama.cpp rather than
of toki, is bench/run.py's to measure (docs/benchmarks.md)."""
import json
import os
import random
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th

WORDS = ("the cat dog sun moon tree bird river house small big red blue green old new happy "
         "sad runs jumps sings walks looks finds makes takes gives tells asks likes "
         "and but then so because when where why how what who").split()


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def conversations(seed, count, turns):
    rng = random.Random(seed)
    convs = []
    for c in range(count):
        system = " ".join(sentence(rng, rng.randint(8, 20)) for _ in range(rng.randint(6, 40)))
        users = [" ".join(sentence(rng, rng.randint(5, 15)) for _ in range(rng.randint(1, 6)))
                 for _ in range(turns)]
        convs.append((system, users))
    return convs


def answer(resp):
    """An answer's text and every token's logprobs (with the top 2)."""
    c = resp["choices"][0]
    probs = [(p["token"], p["logprob"], [(q["token"], q["logprob"]) for q in p["top_logprobs"]])
             for p in (c.get("logprobs") or {}).get("content") or []]
    return c["message"]["content"], probs


def schedule(model, msgs, ub=512):
    """`toki tokenize --chat --schedule` of a chat: its prompt, tokens, chunk
    starts and the ends of a cold evaluation's requests at -ub ub."""
    out = subprocess.run([th.TOKI_BIN, "tokenize", "--model", model, "--chat", "--schedule",
                          "--ubatch", str(ub)], input=json.dumps({"messages": msgs}),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def ask_both(test, toki, baseline, body):
    """The chat request through toki, and uncached through baseline."""
    st, got = th.request(toki.port, "POST", "/v1/chat/completions", body)
    test.assertEqual(st, 200, got)
    st, want = th.request(baseline.port, "POST", "/v1/chat/completions",
                          dict(body, cache_prompt=False))
    test.assertEqual(st, 200, want)
    return got, want


def run_conversations(test, toki, baseline, convs, turns, max_tokens, check, logprobs=True,
                      sent=None):
    """Interleaves the conversations turn by turn; baseline answers each request
    uncached (a Toki: through it, else the server directly). Each request's
    messages go into the list sent, when given. Returns (identical, total,
    evaluated)."""
    histories = [[{"role": "system", "content": s}] for s, _ in convs]
    identical = total = evaluated = 0
    for t in range(turns):
        for i, (system, users) in enumerate(convs):
            msgs = histories[i] + [{"role": "user", "content": users[t]}]
            body = {"messages": msgs, "temperature": 0, "max_tokens": max_tokens,
                    "logprobs": True, "top_logprobs": 2}
            if sent is not None:
                sent.append(msgs)
            got, want = ask_both(test, toki, baseline, body)
            g, w = answer(got), answer(want)
            test.assertTrue(g[1], "no logprobs in the answer")
            if not logprobs:
                g, w = g[0], w[0]
            total += 1
            evaluated += got["cache"]["evaluated"]
            if g == w:
                identical += 1
            elif check:
                test.fail(f"conversation {i} turn {t}: exact mode differs from uncached\n"
                          f"cache={got['cache']}\n toki: {g[0]!r}\n want: {w[0]!r}")
            # Continue with the uncached answer so both modes see the same history.
            histories[i] = msgs + [{"role": "assistant", "content": w[0]}]
    return identical, total, evaluated


class ExactIdentity(unittest.TestCase):
    UBATCH = 64

    @classmethod
    def setUpClass(cls):
        cls.model = th.generated_model("identity", params="4M", ctx=8192)
        cls.baseline = th.LlamaServer(model=cls.model, slots=1, ctx=8192, ubatch=cls.UBATCH,
                                      name="baseline")

    @classmethod
    def tearDownClass(cls):
        cls.baseline.kill()

    def run_mode(self, mode, seed, check, logprobs=True):
        llama = th.LlamaServer(model=self.model, slots=2, ctx=8192, ubatch=self.UBATCH)
        toki = th.Toki([llama], mode=mode, ubatch=self.UBATCH)
        # The uncached reference: exact mode's own schedule through a toki of
        # its own (grid mode's is llama-server's, so the server itself).
        ref = (th.Toki([self.baseline], mode="exact", ubatch=self.UBATCH, name="reference")
               if mode != "grid" else self.baseline)
        try:
            convs = conversations(seed, count=3, turns=4)
            return run_conversations(self, toki, ref, convs, 4, 24, check, logprobs)
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()
            if ref is not self.baseline:
                ref.kill(signal.SIGTERM)

    def test_exact_mode_is_byte_identical(self):
        for seed in (1, 2):
            ident, total, evald = self.run_mode("exact", seed, check=True)
            self.assertEqual(ident, total)
            print(f"seed {seed}: exact identical {ident}/{total} (evaluated {evald})")

    def test_steps_inside_a_chunk_keep_its_micro_batches(self):
        """Exact mode evaluates a long chunk in steps of whole micro-batches
        from the chunk's start (sched_max_step), so that a client that goes
        away waits for one step at most. The premise, on the real server: a
        prompt evaluated in steps that end on micro-batch boundaries gives
        the same answer, every logprob, as the prompt evaluated in one
        request."""
        port = self.baseline.port
        rng = random.Random(7)
        words = " ".join(sentence(rng, 15) for _ in range(300))
        st, tok = th.request(port, "POST", "/tokenize", {"content": words}, auth=False)
        self.assertEqual(st, 200, tok)
        toks = tok["tokens"][:2600]
        self.assertEqual(len(toks), 2600)

        def generate(prompt, cache):
            st, r = th.request(port, "POST", "/completion",
                               {"prompt": prompt, "n_predict": 8, "temperature": 0,
                                "n_probs": 1, "cache_prompt": cache}, auth=False)
            self.assertEqual(st, 200, r)
            return r["content"], [(p["id"], p["logprob"]) for p in r["completion_probabilities"]]

        def prefill(n, cache):
            st, r = th.request(port, "POST", "/completion",
                               {"prompt": toks[:n], "n_predict": 0, "cache_prompt": cache},
                               auth=False)
            self.assertEqual(st, 200, r)
            self.assertEqual(r["timings"]["prompt_n"] + r["timings"]["cache_n"], n, r)

        whole = generate(toks, False)
        step = 16 * self.UBATCH
        prefill(step, False)
        prefill(2 * step, True)
        self.assertEqual(generate(toks, True), whole)

    def test_sessions_share_the_system_prompt_up_to_the_section_they_differ_in(self):
        """Sessions of one agent share a system prompt up to a section (a
        paragraph) where they differ, as "Session context:" here. The section
        start is a chunk start in both prompts, so the second session reuses
        all that it shares with the first (with a start every 128 tokens it
        reused up to the last multiple of 128), and its answer is still its
        uncached answer."""
        llama = th.LlamaServer(model=self.model, slots=1, ctx=8192, ubatch=self.UBATCH)
        toki = th.Toki([llama], mode="exact", ubatch=self.UBATCH)
        ref = th.Toki([self.baseline], mode="exact", ubatch=self.UBATCH, name="reference")
        try:
            rng = random.Random(11)
            base = "You are a coding agent. " + " ".join(sentence(rng, 12) for _ in range(45))
            for i, tail in enumerate(("Working in /src/alpha today.", "Working in /src/beta.")):
                msgs = [{"role": "system", "content": base + "\n\nSession context: " + tail},
                        {"role": "user", "content": sentence(rng, 9)}]
                sched = schedule(self.model, msgs)
                # Where the section breaks, in tokens: the tokens of the text
                # before the empty line, and of the text before the section
                # (exact mode starts a chunk at the one that maps).
                at = sched["prompt"].index("\n\nSession context:")
                ends = []
                for head in (sched["prompt"][:at], sched["prompt"][:at + 2]):
                    out = subprocess.run([th.TOKI_BIN, "tokenize", "--model", self.model],
                                         input=head, capture_output=True, text=True, check=True)
                    ends.append(len(json.loads(out.stdout)))
                chunks = sched["chunks"]
                self.assertTrue(set(ends) & set(chunks), (ends, chunks))
                section = min(set(ends) & set(chunks))
                self.assertNotEqual(section % 128, 0)
                body = {"messages": msgs, "temperature": 0, "max_tokens": 12,
                        "logprobs": True, "top_logprobs": 2}
                got, want = ask_both(self, toki, ref, body)
                self.assertEqual(answer(got), answer(want))
                if i:
                    self.assertEqual(got["cache"]["cached"], section, (chunks, got["cache"]))
        finally:
            toki.kill(signal.SIGTERM)
            ref.kill(signal.SIGTERM)
            llama.kill()

    def test_closed_chunks_split_a_short_tail(self):
        """At -ub 128 a chunk of 128k + r rows, r under 64, ends in
        micro-batches of 64 and 64 + r rows, each its own request, not in
        one of 128 and one of r. Conversations whose chunks do that, turn after
        turn: every answer is its uncached answer, text and logprobs, which
        it is only when the requests toki sends make the micro-batches its
        schedule says the cached rows were computed in. Then a session whose
        system prompt extends a cached one past such a split: it reuses up
        to where the split micro-batches begin, not a grid micro-batch that
        was never computed (and still answers as uncached)."""
        ub = 128
        llama = th.LlamaServer(model=self.model, slots=1, ctx=8192, ubatch=ub)
        base = th.LlamaServer(model=self.model, slots=1, ctx=8192, ubatch=ub, name="baseline")
        toki = th.Toki([llama], mode="exact", ubatch=ub)
        ref = th.Toki([base], mode="exact", ubatch=ub, name="reference")
        try:
            convs = conversations(21, count=2, turns=3)
            sent = []
            ident, total, _ = run_conversations(self, toki, ref, convs, 3, 16, check=True,
                                                sent=sent)
            self.assertEqual(ident, total)
            # This model's answers here hold bytes that are not UTF-8 (the
            # byte tokens 0xF1 0xC1 0xBF), which the server's grammar
            # cannot force: the uncached replay of that answer failed on
            # the server and went one request per token, and was still
            # the same answer (and the backend keeps forced runs).
            for t in (toki, ref):
                log = t.log_text()
                self.assertIn("failed on the server", log)
                self.assertNotIn("one request per token on this backend", log)
            # The schedules of those requests had tails to split: a step
            # that ends neither a chunk nor the prompt.
            splits = 0
            for msgs in sent:
                j = schedule(self.model, msgs, ub)
                ends = set(j["chunks"]) | {len(j["tokens"])}
                splits += sum(1 for e in j["steps"] if e not in ends)
            self.assertGreater(splits, 0)
            self.assertGreater(toki.stats()["prefill_steps"], 0)

            def first_chunk(system, user):
                return schedule(self.model, [{"role": "system", "content": system},
                                             {"role": "user", "content": user}], ub)["chunks"][0]

            rng = random.Random(5)
            user = sentence(rng, 8)
            system = "You are a helpful agent. " + " ".join(sentence(rng, 10) for _ in range(20))
            end = first_chunk(system, user)
            while not (end > 2 * ub and 8 <= end % ub < 60):
                system += " " + rng.choice(WORDS)
                end = first_chunk(system, user)
            split_from = end - ub - end % ub  # where the last two micro-batches begin
            longer = system + " " + " ".join(sentence(rng, 15) for _ in range(12))
            self.assertGreater(first_chunk(longer, user), end + 2 * ub)
            for i, sys_text in enumerate((system, longer)):
                body = {"messages": [{"role": "system", "content": sys_text},
                                     {"role": "user", "content": user}],
                        "temperature": 0, "max_tokens": 12, "logprobs": True, "top_logprobs": 2}
                got, want = ask_both(self, toki, ref, body)
                self.assertEqual(answer(got), answer(want))
                if i:
                    self.assertEqual(got["cache"]["cached"], split_from, got["cache"])
        finally:
            toki.kill(signal.SIGTERM)
            ref.kill(signal.SIGTERM)
            llama.kill()
            base.kill()

    def test_grid_mode_is_llama_servers_own_answer(self):
        ident, total, evald = self.run_mode("grid", 3, check=True)
        self.assertEqual(ident, total)
        print(f"grid: identical {ident}/{total} (evaluated {evald})")


def prompt_tokens_total(llama):
    st, text = th.request(llama.port, "GET", "/metrics", raw=True, auth=False)
    for line in text.splitlines():
        if line.startswith("llamacpp:prompt_tokens_total "):
            return int(float(line.split()[1]))
    raise AssertionError("no llamacpp:prompt_tokens_total in /metrics")


class Accounting(unittest.TestCase):
    """One request may be several backend steps (chunks, cuts): its cache
    block counts every token the server evaluated for it, and their sum is
    exactly what llama-server's own counter says it evaluated."""

    def test_evaluated_tokens_are_the_servers(self):
        model = th.generated_model("identity", params="4M", ctx=8192)
        llama = th.LlamaServer(model=model, slots=2, ctx=8192, ubatch=64, extra=["--metrics"])
        toki = th.Toki([llama], mode="exact", ubatch=64)
        try:
            before = prompt_tokens_total(llama)
            evaluated = 0
            convs = conversations(11, count=2, turns=3)
            histories = [[{"role": "system", "content": sys_}] for sys_, _ in convs]
            for t in range(3):
                for i, (_, users) in enumerate(convs):
                    msgs = histories[i] + [{"role": "user", "content": users[t]}]
                    st, r = toki.chat(msgs, max_tokens=8)
                    self.assertEqual(st, 200, r)
                    c = r["cache"]
                    evaluated += c["evaluated"]
                    # The answer's own numbers are the whole request's too.
                    self.assertEqual(r["timings"]["prompt_n"], c["evaluated"], c)
                    self.assertEqual(r["timings"]["cache_n"], c["cached"], c)
                    self.assertEqual(c["schedule"], "messages", c)
                    # Sent again: only the generation prompt is evaluated, in
                    # one step, after a one-token cut where the slot kept the
                    # answer's rows past it (the keep after an answer), and
                    # the answer is the uncached one.
                    st, again = toki.chat(msgs, max_tokens=8, logprobs=True, top_logprobs=1)
                    self.assertEqual(st, 200, again)
                    evaluated += again["cache"]["evaluated"]
                    trimmed = again["cache"]["trimmed"]
                    self.assertLessEqual(again["cache"]["evaluated"], 8 + trimmed, again["cache"])
                    self.assertEqual(again["cache"]["steps"], 1 + trimmed, again["cache"])
                    st, raw = toki.chat(msgs, max_tokens=8, logprobs=True, top_logprobs=1,
                                        cache_prompt=False)
                    self.assertEqual(st, 200, raw)
                    evaluated += raw["cache"]["evaluated"]
                    self.assertEqual(answer(again), answer(raw), again["cache"])
                    histories[i] = msgs + [{"role": "assistant",
                                            "content": r["choices"][0]["message"]["content"]}]
            # A client that asks for progress sees one coherent stream for
            # the whole request, whatever steps it took.
            st, events = th.stream(toki.port, "/v1/chat/completions",
                                   {"messages": histories[1] + [{"role": "user",
                                                                 "content": "And then?"}],
                                    "max_tokens": 4, "stream": True, "return_progress": True,
                                    "temperature": 0, "cache_prompt": False})
            self.assertEqual(st, 200)
            js = [th.event_json(e) for e in events]
            progress = [j["prompt_progress"] for j in js if j and "prompt_progress" in j]
            cache = [j["cache"] for j in js if j and "cache" in j][0]
            evaluated += cache["evaluated"]
            self.assertGreater(cache["steps"], 1, cache)  # chunks before the last
            self.assertEqual(cache["cached"], 0, cache)
            self.assertTrue(progress)
            for p in progress:
                self.assertEqual((p["total"], p["cache"]), (cache["prompt_tokens"], cache["cached"]))
            self.assertEqual(progress[-1]["processed"], cache["prompt_tokens"])
            # It starts as llama-server's does, with nothing evaluated yet
            # (cache == processed, no time), and only goes forward.
            self.assertEqual(progress[0]["processed"], progress[0]["cache"], progress)
            self.assertEqual(progress[0]["time_ms"], 0, progress)
            seen = [p["processed"] for p in progress]
            self.assertEqual(seen, sorted(set(seen)), progress)
            times = [p["time_ms"] for p in progress]
            self.assertEqual(times, sorted(times), progress)
            # The same from a reuse: a new turn of two messages after the
            # conversation so far starts at what it reuses.
            more = histories[1] + [{"role": "user", "content": "And then?"},
                                   {"role": "assistant", "content": "Then they met."},
                                   {"role": "user", "content": "Tell me more. " * 40}]
            st, events = th.stream(toki.port, "/v1/chat/completions",
                                   {"messages": more, "max_tokens": 4, "stream": True,
                                    "return_progress": True, "temperature": 0})
            self.assertEqual(st, 200)
            js = [th.event_json(e) for e in events]
            progress = [j["prompt_progress"] for j in js if j and "prompt_progress" in j]
            cache = [j["cache"] for j in js if j and "cache" in j][0]
            evaluated += cache["evaluated"]
            self.assertGreater(cache["steps"], 1, cache)
            self.assertGreater(cache["cached"], 0, cache)
            self.assertEqual((progress[0]["cache"], progress[0]["processed"]),
                             (cache["cached"], cache["cached"]), progress)
            seen = [p["processed"] for p in progress]
            self.assertEqual(seen, sorted(set(seen)), progress)
            self.assertEqual(seen[-1], cache["prompt_tokens"], progress)
            # An uncached run is evaluated whole, in its chunks.
            st, raw = toki.chat(histories[0], max_tokens=8, cache_prompt=False)
            self.assertEqual(st, 200, raw)
            self.assertEqual(raw["cache"]["evaluated"], raw["cache"]["prompt_tokens"])
            evaluated += raw["cache"]["evaluated"]
            # The slots' tails are cut after the answers, and a slot stays
            # busy until its cut is done: wait for that, not for a time.
            deadline = time.time() + 60
            while any(s["busy"] for b in toki.stats()["backends"] for s in b["slots"]):
                self.assertLess(time.time(), deadline, "a tail cut never finished")
                time.sleep(0.02)
            st = toki.stats()
            grown = prompt_tokens_total(llama) - before
            self.assertGreater(st["prefill_steps"], 0)
            # Answers that listed all their ids (toki asked for them) were
            # kept as the slot held them, with no call after them.
            self.assertGreater(st["answers_kept_by_ids"], 0)
            # The uncached runs replayed the earlier answers one token at a
            # time, each answer as one forced generation: the rows it
            # decoded (all but its first) are evaluated tokens, which the
            # server counts as predicted ones.
            forced = st["replay_forced_tokens"]
            self.assertGreater(forced, 0)
            self.assertGreater(st["replayed_tokens"], forced)
            self.assertEqual(grown + forced, evaluated + st["tail_cut_tokens"],
                             f"server {grown}, forced {forced}, cache blocks {evaluated}, "
                             f"tail cuts {st['tail_cut_tokens']}")
            self.assertEqual(st["evaluated_tokens"], grown + forced)
        finally:
            toki.kill(signal.SIGTERM)
            llama.kill()


class ForcedRuns(unittest.TestCase):
    """Cold, an earlier answer's tokens are one generation forced to them by
    a grammar of token ids. A server that refuses such a grammar (older
    than token-id grammars), or one that ignores it and generates what it
    likes, costs one request per token from then on, with a warning, never
    an answer: slow_backend.py in front of a real llama-server plays each,
    since the real one cannot be made to on demand."""

    def run_conversation(self, toki, turns=3, model=None):
        """Each turn: its answer, then the same request cold, compared with
        the hot resend (text and logprobs). Returns the cold cache blocks.
        With model: the cold requests are those `toki tokenize --schedule`
        says."""
        sys_, users = conversations(5, count=1, turns=turns)[0]
        history, colds = [{"role": "system", "content": sys_}], []
        for t in range(turns):
            msgs = history + [{"role": "user", "content": users[t]}]
            st, r = toki.chat(msgs, max_tokens=8)
            self.assertEqual(st, 200, r)
            st, again = toki.chat(msgs, max_tokens=8, logprobs=True, top_logprobs=1)
            self.assertEqual(st, 200, again)
            st, raw = toki.chat(msgs, max_tokens=8, logprobs=True, top_logprobs=1,
                                cache_prompt=False)
            self.assertEqual(st, 200, raw)
            self.assertEqual(raw["cache"]["evaluated"], raw["cache"]["prompt_tokens"])
            self.assertEqual(answer(again), answer(raw), raw["cache"])
            if model:
                self.assertEqual(len(schedule(model, msgs, 64)["steps"]), raw["cache"]["steps"])
            colds.append(raw["cache"])
            history = msgs + [{"role": "assistant",
                               "content": r["choices"][0]["message"]["content"]}]
        return colds

    def test_forced_refused_or_ignored_falls_back_to_one_request_a_token(self):
        from slow_backend import SlowBackend
        model = th.generated_model("identity", params="4M", ctx=8192)
        llama = th.LlamaServer(model=model, slots=1, ctx=8192, ubatch=64)
        try:
            # The real server: each answer's replay is one forced request.
            toki = th.Toki([llama], mode="exact", ubatch=64)
            try:
                colds = self.run_conversation(toki, model=model)
                st = toki.stats()
                self.assertGreater(st["replay_forced_tokens"], 0, st)
                last = colds[-1]
                # Two earlier answers of up to 8 tokens: far fewer requests
                # than one a token.
                self.assertGreater(last["replayed"], 4, last)
                self.assertLess(last["steps"], last["chunks"] - last["replayed"] + 4, last)
                self.assertNotIn("forced generation", toki.log_text())
            finally:
                toki.kill(signal.SIGTERM)
            for mode in ("no_token_grammar", "grammar_ignored"):
                with self.subTest(mode=mode):
                    fake = SlowBackend(llama.url, mode=mode)
                    toki = th.Toki([fake], mode="exact", ubatch=64)
                    try:
                        colds = self.run_conversation(toki)
                        # Told once, then never asked again.
                        self.assertEqual(fake.grammar_runs, 1)
                        toki.wait_log("one request per token on this backend")
                        last = colds[-1]
                        self.assertGreater(last["replayed"], 4, last)
                        self.assertEqual(last["steps"], last["chunks"], last)
                        if mode == "no_token_grammar":
                            self.assertEqual(toki.stats()["replay_forced_tokens"], 0)
                    finally:
                        toki.kill(signal.SIGTERM)
                        fake.close()
        finally:
            llama.kill()


def wait_stat(toki, key, value, timeout=30):
    """toki's stats once key has reached value (the event a step waits for)."""
    deadline = time.time() + timeout
    while True:
        st = toki.stats()
        if st.get(key, 0) >= value or time.time() > deadline:
            return st
        time.sleep(0.05)


class StructuredAnswers(unittest.TestCase):
    """An answer with reasoning or tool calls comes back in the next
    request as the template writes it, which is how a model of the family
    generated it (bench/bench_families.py). toki keeps its rows as
    generation made them (the keep renders the answer through the
    template), and the schedule takes an answer's tokens one at a time up
    to its end of turn, through the <think> and <tool_call> words: the next
    turn evaluates what llama-server alone does, with the uncached answer."""

    SYSTEM = "You are a coding agent. Keep changes small."
    BASE = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Run the tests."},
            {"role": "assistant", "content": "All 41 tests pass."},
            {"role": "user", "content": "The server ignores --port. Find where it is parsed."}]
    ANSWER = ("<think>\nThe user says --port is ignored. Look at main.c.\n</think>\n\n"
              "The options are parsed in src/main.c by parse_args().")
    KW = {"chat_template_kwargs": {"enable_thinking": True}}

    def forced(self, server, body, text):
        """The tokens G that text gets after body's prompt, and body as a
        generation forced to them (a grammar of token ids)."""
        st, pr = th.request(server.port, "POST", "/apply-template", body)
        self.assertEqual(st, 200, pr)
        P = self.tokens(server, pr["prompt"])
        PG = self.tokens(server, pr["prompt"] + text)
        self.assertEqual(PG[:len(P)], P)
        G = PG[len(P):]
        return G, dict(body, max_tokens=len(G) + 1, top_k=1, samplers=["top_k"],
                       grammar="root ::= " + " ".join(f"<[{t}]>" for t in G))

    def next_turn(self, port, body, toki, replayed=0, uncached=False):
        """The next turn's answer; through toki, its cache block counts
        what the server did and replayed earlier answers' tokens one at a
        time (replayed: how many; None: any), and with uncached the answer
        is the uncached one's (text and logprobs)."""
        st, r = th.request(port, "POST", "/v1/chat/completions", body)
        self.assertEqual(st, 200, r)
        if toki:
            self.assertEqual(r["cache"]["evaluated"], r["timings"]["prompt_n"], r["cache"])
            if replayed is not None:
                self.assertEqual(r["cache"]["replayed"], replayed, r["cache"])
        if toki and uncached:
            st, raw = th.request(port, "POST", "/v1/chat/completions",
                                 dict(body, cache_prompt=False))
            self.assertEqual(st, 200, raw)
            self.assertEqual(answer(r), answer(raw))
        return r

    def tokens(self, server, text):
        st, r = th.request(server.port, "POST", "/tokenize",
                           {"content": text, "add_special": True, "parse_special": True})
        self.assertEqual(st, 200, r)
        return r["tokens"]

    def test_reasoning_answer_then_a_tool_then_a_user(self):
        """An agent's turns on Qwen 3: an answer with reasoning, the tool's
        result (its reasoning stays: the next turn reuses the answer's rows
        as generation made them), then a user's message, once the template
        drops the reasoning of the answers before it: the first answer's
        text follows its header where generation wrote <think>, so no cache
        holds its rows, and the schedule evaluates them as a batch, as
        llama-server alone does, not one at a time (decode speed for
        nothing). Each turn evaluates no more than alone."""
        model = th.tokenizer_model("qwen3", "qwen2")
        alone = th.LlamaServer(model=model, slots=1, ctx=4096, name="structured-alone")
        back = th.LlamaServer(model=model, slots=1, ctx=4096, name="structured")
        toki = th.Toki([back], mode="exact")
        try:
            # The random model writes what a Qwen3 writes.
            G, forced = self.forced(alone, dict(self.KW, messages=self.BASE), self.ANSWER)
            evaluated, sent = {}, []
            for name, port in (("alone", alone.port), ("toki", toki.port)):
                st, r = th.request(port, "POST", "/v1/chat/completions", forced)
                self.assertEqual(st, 200, r)
                m = r["choices"][0]["message"]
                self.assertTrue(m.get("reasoning_content"), m)
                if name == "toki":
                    # The keep: every generated row but the last's evaluation.
                    stats = wait_stat(toki, "answers_kept", 1)
                    self.assertEqual(stats["answers_kept"], 1, stats)
                    self.assertEqual(stats["answer_rows_kept"], len(G), stats)
                msgs = self.BASE + [{"role": "assistant", "content": m["content"],
                                     "reasoning_content": m["reasoning_content"]}]
                for turn, nxt in (("tool", {"role": "tool", "tool_call_id": "c1",
                                            "content": "12: int port = 8080;"}),
                                  ("user", {"role": "user", "content": "Good. Now add it."})):
                    msgs = msgs + [nxt]
                    body = dict(self.KW, messages=msgs, max_tokens=8, temperature=0,
                                logprobs=True, top_logprobs=2)
                    r = self.next_turn(port, body, name == "toki")
                    evaluated[name, turn] = r["timings"]["prompt_n"]
                    if name == "toki":
                        sent.append((body, r))
                    a = r["choices"][0]["message"]
                    msgs = msgs + [{k: a[k] for k in ("role", "content", "reasoning_content")
                                    if a.get(k) is not None}]
            for turn in ("tool", "user"):
                self.assertLessEqual(evaluated["toki", turn], evaluated["alone", turn], evaluated)
            # Each of toki's answers is its uncached one (asked last: an
            # uncached request leaves the slot empty).
            for body, r in sent:
                st, raw = th.request(toki.port, "POST", "/v1/chat/completions",
                                     dict(body, cache_prompt=False))
                self.assertEqual(st, 200, raw)
                self.assertEqual(answer(r), answer(raw))
            print(f"reasoning, a tool, a user: next turns evaluated: {evaluated}")
        finally:
            toki.kill()
            alone.kill()
            back.kill()

    def test_generated_tool_call_streamed_then_its_result(self):
        """An agent's loop on a real generation: a tool call the server's
        grammar shapes, streamed, its message put together from the deltas
        as a client does, then the tool's result. The random model writes
        the call's JSON with spaces Llama 3.2's template does not, so the
        answer does not come back as generated: the keep's rows past that
        point are a batch's and are not taken as steps. The next turn
        still evaluates no more than llama-server alone, with the uncached
        answer."""
        model = th.tokenizer_model("llama3_2", "llama-bpe")
        alone = th.LlamaServer(model=model, slots=1, ctx=4096, name="toolcall-alone")
        back = th.LlamaServer(model=model, slots=1, ctx=4096, name="toolcall")
        toki = th.Toki([back], mode="exact")
        tools = [{"type": "function", "function": {
            "name": "run_shell", "description": "Run a command",
            "parameters": {"type": "object",
                           "properties": {"cmd": {"type": "string", "enum": ["ls", "make test"]}},
                           "required": ["cmd"], "additionalProperties": False}}}]
        # The server's grammar is lazy: the random model writes text until it
        # happens on the call's opening; on this conversation it does, after
        # about 100 tokens (greedy, so every run). Llama 3.2's template
        # writes today's date into the system header: the date is pinned
        # (on the prompt of 7 December the model wrote 200 tokens of text).
        kw = {"chat_template_kwargs": {"date_string": "06 Dec 2026"}}
        msgs = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Run the tests."}]
        first = dict(kw, messages=msgs, tools=tools, tool_choice="required", max_tokens=200,
                     temperature=0)
        try:
            evaluated = {}
            for name, port in (("alone", alone.port), ("toki", toki.port)):
                st, events = th.stream(port, "/v1/chat/completions", dict(first, stream=True))
                self.assertEqual(st, 200, events[-3:])
                content, calls = "", []
                for j in (th.event_json(e) for e in events):
                    for ch in (j or {}).get("choices") or []:
                        d = ch.get("delta") or {}
                        content += d.get("content") or ""
                        for c in d.get("tool_calls") or []:
                            if c["index"] == len(calls):
                                calls.append({"id": c.get("id"), "type": "function",
                                              "function": {"name": "", "arguments": ""}})
                            f = calls[c["index"]]["function"]
                            f["name"] += (c.get("function") or {}).get("name") or ""
                            f["arguments"] += (c.get("function") or {}).get("arguments") or ""
                self.assertEqual(len(calls), 1, events[-3:])
                self.assertEqual(calls[0]["function"]["name"], "run_shell")
                nxt = msgs + [
                    {"role": "assistant", "content": content, "tool_calls": calls},
                    {"role": "tool", "tool_call_id": calls[0]["id"], "content": "41 passed"}]
                body = dict(kw, messages=nxt, tools=tools, max_tokens=8, temperature=0,
                            logprobs=True, top_logprobs=2)
                if name == "toki":
                    # After the streamed call: the keep, whose tokens part
                    # from generation's at the call's JSON, then the cut of
                    # the rows past that point (two steps after the answer).
                    stats = wait_stat(toki, "tail_cuts", 2)
                    self.assertEqual(stats["tail_cuts"], 2, stats)
                # The call's JSON as the template writes it is not what the
                # model wrote: its tokens after the difference go one at a
                # time, as any answer's could.
                evaluated[name] = self.next_turn(port, body, name == "toki", replayed=None,
                                                 uncached=True)["timings"]["prompt_n"]
            self.assertLessEqual(evaluated["toki"], evaluated["alone"], evaluated)
            print(f"generated tool call, next turn evaluated: {evaluated}")
        finally:
            toki.kill()
            alone.kill()
            back.kill()

    def test_text_answer_where_the_generation_prompt_is_empty(self):
        """Devstral's template writes no generation prompt: the messages
        before an answer render to the whole prompt, and generation begins
        at its end. The answer's tokens are still steps, from the prompt's
        end to its end of turn: the next turn evaluates what llama-server
        alone does (the last answer token, the new message), with the
        uncached answer."""
        model = th.tokenizer_model("mistral_nemo", "tekken",
                                   template=th.gguf_template("library/devstral:latest"))
        alone = th.LlamaServer(model=model, slots=1, ctx=4096, name="empty-gen-alone")
        back = th.LlamaServer(model=model, slots=1, ctx=4096, name="empty-gen")
        toki = th.Toki([back], mode="exact")
        try:
            G, forced = self.forced(alone, dict(messages=self.BASE),
                                    "The options are parsed in src/main.c.")
            evaluated = {}
            for name, port in (("alone", alone.port), ("toki", toki.port)):
                st, r = th.request(port, "POST", "/v1/chat/completions", forced)
                self.assertEqual(st, 200, r)
                text = r["choices"][0]["message"]["content"]
                if name == "toki":
                    stats = wait_stat(toki, "answers_kept", 1)
                    self.assertEqual(stats["answer_rows_kept"], len(G), stats)
                nxt = self.BASE + [{"role": "assistant", "content": text},
                                   {"role": "user", "content": "Good. Now add the flag."}]
                body = dict(messages=nxt, max_tokens=8, temperature=0, logprobs=True,
                            top_logprobs=2)
                evaluated[name] = self.next_turn(port, body, name == "toki",
                                                 uncached=True)["timings"]["prompt_n"]
            self.assertLessEqual(evaluated["toki"], evaluated["alone"], evaluated)
            print(f"empty generation prompt, next turn evaluated: {evaluated}")
        finally:
            toki.kill()
            alone.kill()
            back.kill()

    def split_token(self, server, G):
        """G with one of its tokens (not the first) written as two tokens
        of its text: what generation may write, which the text does not
        re-tokenize to; and where."""
        def one(text):
            st, r = th.request(server.port, "POST", "/tokenize",
                               {"content": text, "add_special": False})
            return r["tokens"] if len(r["tokens"]) == 1 else None
        for j in range(1, len(G)):
            st, d = th.request(server.port, "POST", "/detokenize", {"tokens": [G[j]]})
            piece = d["content"]
            for k in range(1, len(piece)):
                a, b = one(piece[:k]), one(piece[k:])
                if a and b:
                    return G[:j] + a + b + G[j + 1:], j
        self.fail(f"no token of {G} splits in two")

    def test_answer_kept_by_the_ids_generation_made(self):
        """The keep after an answer knows the generated tokens by their
        ids: toki asks llama-server for them (one probability after
        sampling, free where the sampler keeps top_k candidates) and takes
        them out of the answer, which the client gets as without them.
        An answer written in tokens its text does not re-tokenize to is
        kept whole, with nothing sent after it (the ids are the tokens the
        slot holds: every one listed, or in a stream all but its end of
        turn); the next
        turn evaluates what llama-server alone does, its answer the
        uncached one. Where the ids would cost (top_k 0), the keep goes by
        the text, and cuts off the rows past where it parts. (Llama 3.2:
        Qwen 3's template writes a plain answer after a think block the
        answer then goes without.)"""
        model = th.tokenizer_model("llama3_2", "llama-bpe")
        alone = th.LlamaServer(model=model, slots=1, ctx=4096, name="ids-alone")
        back = th.LlamaServer(model=model, slots=1, ctx=4096, name="ids")
        toki = th.Toki([back], mode="exact")
        msgs = self.BASE
        try:
            G, _ = self.forced(alone, dict(messages=msgs), "The options are parsed in src/main.c.")
            G, j = self.split_token(alone, G)
            forced = dict(messages=msgs, max_tokens=len(G) + 1, top_k=1, samplers=["top_k"],
                          grammar="root ::= " + " ".join(f"<[{t}]>" for t in G))
            evaluated, keys = {}, {}
            for name, port in (("alone", alone.port), ("toki", toki.port)):
                st, events = th.stream(port, "/v1/chat/completions", dict(forced, stream=True))
                self.assertEqual(st, 200, events[-3:])
                js = [j_ for j_ in (th.event_json(e) for e in events) if j_]
                keys[name] = sorted({k for j_ in js for c in j_.get("choices") or []
                                     for k in c})
                text = "".join((c.get("delta") or {}).get("content") or ""
                               for j_ in js for c in j_.get("choices") or [])
                if name == "toki":
                    # Every generated row kept as it is. The stream listed
                    # every id but its end of turn's (which has no text):
                    # the slot holds those rows, and nothing is sent after
                    # the answer, nothing evaluated.
                    stats = wait_stat(toki, "answers_kept_by_ids", 1)
                    self.assertEqual(stats["answers_kept_by_ids"], 1, stats)
                    self.assertEqual(stats["answer_rows_kept"], len(G), stats)
                    self.assertEqual((stats["tail_cuts"], stats["tail_cut_tokens"]), (0, 0),
                                     stats)
                nxt = msgs + [{"role": "assistant", "content": text},
                              {"role": "user", "content": "Good. Now add the flag."}]
                body = dict(messages=nxt, max_tokens=8, temperature=0, logprobs=True,
                            top_logprobs=2)
                r = self.next_turn(port, body, name == "toki", replayed=None, uncached=True)
                evaluated[name] = r["timings"]["prompt_n"]
                if name == "toki":
                    # The text's tokens part from the answer's at the split
                    # token: from there, one at a time.
                    self.assertEqual(r["cache"]["replayed"], len(G) - j - 1, r["cache"])
            self.assertEqual(keys["toki"], keys["alone"])
            self.assertNotIn("logprobs", keys["toki"])
            self.assertEqual(evaluated["toki"], evaluated["alone"], evaluated)
            # A whole answer: none of the probabilities toki asked for.
            st, r = th.request(toki.port, "POST", "/v1/chat/completions",
                               dict(messages=nxt, max_tokens=4, temperature=0))
            self.assertEqual(st, 200, r)
            self.assertNotIn("logprobs", r["choices"][0])
            # The next turn's answer, its uncached one's and this one's
            # listed every id (whole answers, cut at their length): the
            # slot held them, and nothing was sent after them.
            stats = wait_stat(toki, "answers_kept_by_ids", 4)
            self.assertEqual(stats["answers_kept_by_ids"], 4, stats)
            self.assertEqual((stats["tail_cuts"], stats["tail_cut_tokens"]), (0, 0), stats)
            # Where the sampler keeps the whole vocabulary, toki asks for no
            # ids: the keep goes by the text, which parts from the answer at
            # the split token, and cuts the rows past it off.
            cuts = stats["tail_cuts"]
            st, r = th.request(toki.port, "POST", "/v1/chat/completions", dict(forced, top_k=0))
            self.assertEqual(st, 200, r)
            self.assertNotIn("logprobs", r["choices"][0])
            stats = wait_stat(toki, "tail_cuts", cuts + 2)
            self.assertEqual((stats["answers_kept"], stats["answers_kept_by_ids"]), (5, 4), stats)
            self.assertEqual(stats["tail_cuts"], cuts + 2, stats)
            print(f"an answer kept by its ids, next turn evaluated: {evaluated}")
        finally:
            toki.kill()
            alone.kill()
            back.kill()

    def test_tool_call_is_in_the_answers_steps(self):
        """The schedule of a next request after a tool call: every token
        of the call one at a time, up to the end of the turn."""
        model = th.tokenizer_model("qwen3", "qwen2")
        call = {"id": "c1", "type": "function",
                "function": {"name": "run_shell", "arguments": json.dumps({"cmd": "make test"})}}
        tools = [{"type": "function", "function": {
            "name": "run_shell", "description": "Run a command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]
        msgs = self.BASE + [
            {"role": "assistant", "content": "", "reasoning_content": "Run them.",
             "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "41 passed"}]
        out = subprocess.run([th.TOKI_BIN, "tokenize", "--model", model, "--chat",
                              "--schedule"],
                             input=json.dumps(dict(self.KW, messages=msgs, tools=tools)),
                             capture_output=True, text=True, check=True)
        s = json.loads(out.stdout)
        text, toks, chunks = s["prompt"], s["tokens"], set(s["chunks"])
        self.assertIn("<tool_call>", text)
        # The answer's tokens: from its generation prompt to its end of turn.
        out = subprocess.run([th.TOKI_BIN, "tokenize", "--model", model, "--no-add-special",
                              "<|im_start|>assistant\n<think><tool_call><|im_end|>"],
                             capture_output=True, text=True, check=True)
        start, _, nl, think, tool_call, end = json.loads(out.stdout)
        at = [i for i in range(len(toks) - 3)
              if toks[i] == start and toks[i + 2] == nl and toks[i + 3] == think]
        self.assertTrue(at, text)
        first = at[-1] + 3
        e = toks.index(end, first)
        self.assertIn(tool_call, toks[first:e])
        for p in range(first, e + 1):
            self.assertIn(p, chunks, f"position {p} of {first}..{e} is no step")


class ConcurrentExact(unittest.TestCase):
    """Conversations running at once stay exact: llama-server batches the
    tokens of concurrent slots together, which would move micro-batch
    boundaries, so exact mode runs one request (all its steps) at a time per
    backend. 3 unrelated conversations x 3 turns, at once, through a managed
    toki with 2 slots: every answer equals the same request replayed alone,
    uncached, text and logprobs."""

    def test_concurrent_conversations_equal_their_uncached_replays(self):
        import tempfile
        import threading
        model = th.generated_model("identity", params="4M", ctx=8192)
        state = tempfile.mkdtemp(prefix="toki-state-")
        toki = th.Toki([], mode="exact", name="toki-managed",
                       extra=["--model", model, "--name", "conc", "--ctx", "4096",
                              "--slots", "2"],
                       env={"TOKI_STATE_DIR": state,
                            "TOKI_LLAMA_SERVER": th.llama_server_path()})
        try:
            convs = conversations(21, count=3, turns=3)
            sent = {}  # (conversation, turn) -> (body, answer)
            errors = []

            def run(i):
                system, users = convs[i]
                msgs = [{"role": "system", "content": system}]
                try:
                    for t in range(3):
                        msgs = msgs + [{"role": "user", "content": users[t]}]
                        body = {"messages": msgs, "temperature": 0, "max_tokens": 12,
                                "logprobs": True, "top_logprobs": 2}
                        st, r = th.request(toki.port, "POST", "/v1/chat/completions", body,
                                           timeout=600)
                        if st != 200:
                            errors.append((i, t, r))
                            return
                        sent[(i, t)] = (body, answer(r))
                        msgs = msgs + [{"role": "assistant",
                                        "content": r["choices"][0]["message"]["content"]}]
                except Exception as e:  # reported below, with the others
                    errors.append((i, e))
            threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
            for th_ in threads:
                th_.start()
            for th_ in threads:
                th_.join(900)
            self.assertEqual(errors, [])
            self.assertEqual(len(sent), 9)
            for key, (body, got) in sorted(sent.items()):
                st, want = th.request(toki.port, "POST", "/v1/chat/completions",
                                      dict(body, cache_prompt=False), timeout=600)
                self.assertEqual(st, 200, want)
                self.assertEqual(got, answer(want), f"conversation {key[0]} turn {key[1]}")
        finally:
            toki.kill(signal.SIGTERM)


class ExactIdentityStories(unittest.TestCase):
    def test_exact_mode_on_stories260k(self):
        model = th.test_model()
        baseline = th.LlamaServer(model=model, slots=1, ubatch=32, name="baseline")
        llama = th.LlamaServer(model=model, slots=2, ubatch=32)
        toki = th.Toki([llama], mode="exact", ubatch=32)
        ref = th.Toki([baseline], mode="exact", ubatch=32, name="reference")
        try:
            convs = conversations(7, count=3, turns=3)
            for c in range(len(convs)):
                # stories260K's context is 2048: keep prompts short.
                convs[c] = (convs[c][0][:600], [u[:200] for u in convs[c][1]])
            ident, total, _ = run_conversations(self, toki, ref, convs, 3, 16, check=True)
            self.assertEqual(ident, total)
            st = toki.stats()
            self.assertGreater(st["cached_tokens"], 0, "exact mode reused nothing at all")
        finally:
            toki.kill(signal.SIGTERM)
            ref.kill(signal.SIGTERM)
            llama.kill()
            baseline.kill()


if __name__ == "__main__":
    th.run_tests()
