"""Exact mode and llama-server's own RAM cache (--cache-ram, on by default),
on a user's server without slot files (issue 24, item 2): more conversations
than slots, so each turn finds its slot taken by another conversation. When
a task takes a slot, llama-server moves the slot's content into its RAM and
loads from there a state that suits the task better; toki applies the same
rule to its own records (router/ram.h), and sends a conversation that comes
back a cut on a slot holding something else, which makes the server load
the conversation's state: a "ram" route, checked by the cut's own count.

Against the real llama-server (stories260K, -np 2, -ub 64), with toki's
uncached answers from a reference server beside it:
  - three conversations interleaved on two slots, three turns each: every
    answer, text and logprobs, is the uncached one; later turns come back
    by "ram" routes, each evaluating less than its new messages and the
    chunk they start in; the loads are counted, no misses;
  - the same on one slot (-np 1): each conversation's second turn comes
    back from RAM into the slot the others used;
  - with --cache-ram 0 the probe finds no RAM cache: no "ram" route;
  - with a RAM cache too small for what toki counts on (--cache-ram 1):
    the cut finds the state gone (a miss), the request is planned again from
    an empty slot and still gets the uncached answer; after three misses
    toki stops counting on that cache."""
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import toki_harness as th
from test_exact_identity import answer, conversations

UBATCH = 64


def body(msgs, **kw):
    b = {"messages": msgs, "temperature": 0, "max_tokens": 8, "logprobs": True,
         "top_logprobs": 2}
    b.update(kw)
    return b


class RamCache(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        base = th.LlamaServer(slots=1, ctx=2048, ubatch=UBATCH, name="ram-reference")
        cls.ref = th.Toki([base], mode="exact", ubatch=UBATCH, name="reference")
        cls.procs = [base, cls.ref]

    @classmethod
    def tearDownClass(cls):
        cls.ref.kill(signal.SIGTERM)
        for p in cls.procs:
            p.kill()

    def start(self, cache_ram, slots=2):
        llama = th.LlamaServer(slots=slots, ctx=2048, ubatch=UBATCH, cache_ram=cache_ram,
                               name=f"ram-{cache_ram}-np{slots}")
        self.addCleanup(llama.kill)
        toki = th.Toki([llama], mode="exact", ubatch=UBATCH)
        self.addCleanup(toki.kill, signal.SIGTERM)
        toki.wait_log(" up: ")
        return toki

    def ram(self, toki):
        return toki.stats()["backends"][0]["ram_states"]

    def interleave(self, toki, seed, turns=3):
        """Three conversations, `turns` turns each, in turn; returns the cache
        blocks, each with the previous turn's prompt length."""
        convs = conversations(seed, count=3, turns=turns)
        hist = [[{"role": "system", "content": s}] for s, _ in convs]
        prev = [0, 0, 0]
        out = []
        for t in range(turns):
            for i in range(3):
                msgs = hist[i] + [{"role": "user", "content": convs[i][1][t]}]
                st, got = th.request(toki.port, "POST", "/v1/chat/completions", body(msgs))
                self.assertEqual(st, 200, got)
                st, want = th.request(self.ref.port, "POST", "/v1/chat/completions",
                                      body(msgs, cache_prompt=False))
                self.assertEqual(st, 200, want)
                c = got["cache"]
                self.assertEqual(answer(got), answer(want), f"conversation {i} turn {t}: {c}")
                out.append((i, t, c, prev[i]))
                prev[i] = c["prompt_tokens"]
                hist[i] = msgs + [{"role": "assistant",
                                   "content": want["choices"][0]["message"]["content"]}]
        return out

    def test_conversations_come_back_from_the_servers_ram(self):
        toki = self.start(8192)
        self.assertTrue(self.ram(toki)["used"], toki.stats()["backends"][0])
        turns = self.interleave(toki, 31)
        ram = [(i, t, c, p) for i, t, c, p in turns if c["route"] == "ram"]
        self.assertGreaterEqual(len(ram), 3, [c for _, _, c, _ in turns])
        for i, t, c, prev in ram:
            # The conversation's earlier turns came back: only its new part
            # (and the chunk it starts in) is evaluated.
            self.assertGreater(c["reuse"], 0, c)
            self.assertLess(c["evaluated"], c["prompt_tokens"] - prev + 2 * UBATCH, c)
        st = self.ram(toki)
        self.assertGreaterEqual(st["loads"], len(ram), st)
        self.assertEqual(st["misses"], 0, st)
        print(f"\nram routes {len(ram)} of {len(turns)}; turn: route prompt/evaluated: " +
              ", ".join(f"c{i}t{t} {c['route']} {c['prompt_tokens']}/{c['evaluated']}"
                        for i, t, c, _ in turns), file=sys.stderr)

    def test_one_slot(self):
        # One slot: the probe is asked in exact mode too, and a cut on the
        # slot swaps the conversation there for the one that comes back
        # (bench n, -np 1 --cache-ram 8192: 1.97x llama-server alone's
        # tokens before, when one slot meant no RAM route).
        toki = self.start(8192, slots=1)
        self.assertTrue(self.ram(toki)["used"], toki.stats()["backends"][0])
        turns = self.interleave(toki, 33, turns=2)
        ram = [c for i, t, c, _ in turns if c["route"] == "ram"]
        self.assertEqual(len(ram), 3, [c for _, _, c, _ in turns])
        for c in ram:
            self.assertEqual(c["slot"], 0, c)
            self.assertGreater(c["reuse"], 0, c)
        st = self.ram(toki)
        self.assertEqual((st["loads"], st["misses"]), (3, 0), st)

    def test_no_ram_cache_no_ram_route(self):
        toki = self.start(0)
        self.assertFalse(self.ram(toki)["used"])
        turns = self.interleave(toki, 32, turns=2)
        self.assertFalse([c for _, _, c, _ in turns if c["route"] == "ram"])

    def test_a_state_the_server_dropped(self):
        # 1 MiB holds one of these states: the server drops the older ones,
        # which toki still counts on.
        toki = self.start(1)
        turns = self.interleave(toki, 33, turns=2)  # every answer the uncached one
        st = self.ram(toki)
        self.assertGreaterEqual(st["misses"], 1, st)
        log = toki.log_text()
        self.assertIn("was no longer in the server's RAM", log)
        if st["misses"] >= 3 and st["misses"] > st["loads"]:
            self.assertFalse(st["used"], st)


if __name__ == "__main__":
    th.run_tests()
