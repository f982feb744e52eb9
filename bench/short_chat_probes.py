#!/usr/bin/env python3
"""Two checks on llama-server alone behind the short cached chat's numbers
(issue 24, item 5; bench_short_chat.py measures the chat itself).

  last-row: can a resend evaluate only the prompt's last token, as
    llama-server alone does, and still answer with the bits of the uncached
    run? The prompt's last chunk is evaluated as one batch (the uncached
    run, and exact mode's answer before its tail cut); the slot is then cut
    back to all but the last token and the last token evaluated alone. Its
    answer (top logprobs of 2 tokens) against the uncached run's, for last
    chunks of several lengths; a control cuts back to the chunk's start and
    evaluates the whole chunk again, as exact mode does.

  pipeline: after an answer, exact mode cuts the slot's tail (a one-token
    /completion) and a request that comes at once waits for the cut's
    answer. Would sending the next request before the cut has answered (the
    server queues it on the busy slot) save time? Both ways, alternating,
    the time from the previous answer's end to the next answer's end, and
    how often the server ran the next request after the cut (its cache_n is
    the cut's kept prefix).

  python3 bench/short_chat_probes.py last-row [--model GGUF] [--lengths 2,17,65]
  python3 bench/short_chat_probes.py pipeline [-n 150]

Standard library only."""
import argparse
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import Client, harness, median  # noqa: E402
import bench_short_chat as short  # noqa: E402


def completion(c, prompt, n_predict, slot, cache):
    st, j = c.json("POST", "/completion", {
        "prompt": prompt, "n_predict": n_predict, "cache_prompt": cache, "id_slot": slot,
        "temperature": 0, "n_probs": 8})
    assert st == 200, j
    return j


def last_row(th, args):
    ls = th.LlamaServer(model=args.model or th.test_model(), slots=2, ctx=4096,
                        name="probe-last-row")
    try:
        c = Client(ls.port)
        text = " ".join(f"word{i} and the cat sat on mat number {i}." for i in range(80))
        st, tk = c.json("POST", "/tokenize", {"content": text, "add_special": True})
        toks = tk["tokens"][:args.tokens]
        n = len(toks)

        def probs(j):
            return json.dumps(j["completion_probabilities"])
        print(f"model {os.path.basename(ls.model)}, prompt {n} tokens")
        for length in (int(x) for x in args.lengths.split(",")):
            s = n - length
            completion(c, toks[:s], 0, 0, False)  # the uncached run: [0, s), then [s, n)
            ref = completion(c, toks, 2, 0, True)
            assert ref["timings"]["cache_n"] == s
            completion(c, toks[:s], 0, 1, False)  # the same chunks on slot 1, no answer
            completion(c, toks, 0, 1, True)
            completion(c, toks[:n - 1] + [toks[n - 1] + 1], 0, 1, True)  # cut to n - 1
            alone = completion(c, toks, 2, 1, True)
            assert alone["timings"]["cache_n"] == n - 1
            completion(c, toks[:s] + [toks[s] + 1], 0, 1, True)  # cut to s: exact mode's way
            again = completion(c, toks, 2, 1, True)
            assert again["timings"]["cache_n"] == s
            print(f"last chunk of {length} rows: the last token alone gives the uncached "
                  f"bits: {probs(alone) == probs(ref)}; the chunk again (control): "
                  f"{probs(again) == probs(ref)}")
    finally:
        ls.kill()


def pipeline(th, args):
    ls = th.LlamaServer(model=args.model or th.test_model(), slots=2, ctx=4096,
                        name="probe-pipeline")
    try:
        c, c2 = Client(ls.port), Client(ls.port)
        msgs = short.make_messages(c)
        toks = short.tokens_of(c, msgs)
        # Where exact mode cuts after an answer: the generation prompt's start.
        st, t = c.json("POST", "/apply-template",
                       {"messages": msgs, "add_generation_prompt": False})
        st, k = c.json("POST", "/tokenize", {"content": t["prompt"], "add_special": True,
                                            "parse_special": True})
        keep = len(k["tokens"])
        assert toks[:keep] == k["tokens"]
        body = {"messages": msgs, "temperature": 0, "max_tokens": 2, "id_slot": 1,
                "cache_prompt": True}
        cut = {"prompt": toks[:keep] + [toks[keep] - 1], "n_predict": 0, "cache_prompt": True,
               "id_slot": 1}
        c.json("POST", "/v1/chat/completions", body)
        c2.json("POST", "/completion", cut)
        res = {"after the cut": [], "pipelined": []}
        in_order = {k: 0 for k in res}
        for i in range(args.n):
            for mode in (tuple(res) if i % 2 else tuple(reversed(res))):
                time.sleep(0.02)
                c.json("POST", "/v1/chat/completions", body)
                t0 = time.perf_counter()
                if mode == "after the cut":
                    c2.json("POST", "/completion", cut)
                    st, j = c.json("POST", "/v1/chat/completions", body)
                else:
                    th_ = threading.Thread(target=lambda: c2.json("POST", "/completion", cut))
                    th_.start()
                    time.sleep(0.0002)  # the cut first on the wire
                    st, j = c.json("POST", "/v1/chat/completions", body)
                    th_.join()
                res[mode].append((time.perf_counter() - t0) * 1000)
                in_order[mode] += j["timings"]["cache_n"] == keep
                c2.json("POST", "/completion", cut)  # the slot as after an answer again
        print(f"prompt {len(toks)} tokens, cut to {keep}")
        for m, v in res.items():
            print(f"next request {m}: p50 {median(v):.2f} ms from the previous answer's end; "
                  f"ran after the cut {in_order[m]}/{len(v)}")
    finally:
        ls.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("probe", choices=("last-row", "pipeline"))
    ap.add_argument("--model", help="default: the tests' model (stories260K)")
    ap.add_argument("--lengths", default="2,17,65", help="last-row: the last chunk's lengths")
    ap.add_argument("--tokens", type=int, default=700, help="last-row: the prompt's length")
    ap.add_argument("-n", type=int, default=150, help="pipeline: rounds")
    args = ap.parse_args()
    th = harness()
    (last_row if args.probe == "last-row" else pipeline)(th, args)


if __name__ == "__main__":
    main()
