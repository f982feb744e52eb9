#!/usr/bin/env python3
"""What a chunk of its own for the first message's role header would cost.

llama-server alone reuses any common prefix: a new conversation on a slot
that held another one reuses the few tokens of the system message's header
(`<|im_start|>system\\n`). Exact mode reuses whole chunks of its schedule, and
the first message is one chunk, so it evaluates them (bench_turns: +4 per
such conversation). A schedule with a chunk start after that header would
reuse them too, at the price of a request of its own for the header in every
cold evaluation. This measures both sides on llama-server itself, cold each
time (`cache_prompt: false` for the first request of each case):

  one:    the first chunk, c tokens, one request (exact mode's schedule)
  split:  its first 4 tokens, then the whole (the 4 reused): a header chunk
  rest:   the c - 4 after those 4 reused: what the split saves where a slot
          held another conversation's header

  python3 bench/header_chunk_cost.py [--tokens 750] [--reps 10] [--params 4M,24M]

Medians of --reps (after two warm-ups), wall time per case and the server's
own prompt_ms. Standard library only; uses tests/integration/toki_harness.py
(and build/toki, or $TOKI_BIN, to write the models)."""
import argparse
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
os.environ.setdefault("TOKI_BIN", os.path.join(HERE, "..", "build", "toki"))
import toki_harness as th  # noqa: E402


def completion(srv, prompt, cache):
    t0 = time.perf_counter()
    st, r = th.request(srv.port, "POST", "/completion",
                       {"prompt": prompt, "n_predict": 0, "cache_prompt": cache})
    if st != 200:
        raise SystemExit(f"llama-server answered {st}: {r}")
    return (time.perf_counter() - t0) * 1000, r["timings"]["prompt_ms"], r["timings"]["prompt_n"]


def measure(params, c, reps):
    model = th.generated_model("bench", params=params, ctx=32768)
    srv = th.LlamaServer(model=model, slots=1, ctx=4096, name=f"header-cost-{params}")
    try:
        rng = random.Random(1)
        toks = [rng.randrange(300, 400) for _ in range(c)]
        one, split, rest = [], [], []
        for i in range(reps + 2):
            w1, p1, n1 = completion(srv, toks, False)
            w4, p4, n4 = completion(srv, toks[:4], False)
            wr, pr, nr = completion(srv, toks, True)
            if (n1, n4, nr) != (c, 4, c - 4):
                raise SystemExit(f"evaluated {n1}, {n4}, {nr}: not {c}, 4, {c - 4}")
            if i >= 2:
                one.append((w1, p1))
                split.append((w4 + wr, p4 + pr))
                rest.append((wr, pr))
        return one, split, rest
    finally:
        srv.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=750)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--params", default="4M,24M")
    args = ap.parse_args()
    c = args.tokens
    print(f"first chunk {c} tokens, cold; median of {args.reps}, ms (wall / server's prompt_ms)")
    print("| model | one request | header chunk, then the rest | the rest, 4 reused |"
          " header chunk - one | the rest - one |")
    print("|---|---|---|---|---|---|")
    for params in args.params.split(","):
        one, split, rest = measure(params, c, args.reps)
        md = [[statistics.median(x[k] for x in xs) for k in (0, 1)] for xs in (one, split, rest)]
        print(f"| {params} | {md[0][0]:.2f} / {md[0][1]:.2f} | {md[1][0]:.2f} / {md[1][1]:.2f} | "
              f"{md[2][0]:.2f} / {md[2][1]:.2f} | {md[1][0] - md[0][0]:+.2f} | "
              f"{md[2][0] - md[0][0]:+.2f} |", flush=True)


if __name__ == "__main__":
    main()
