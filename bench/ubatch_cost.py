#!/usr/bin/env python3
"""What a micro-batch costs llama-server, by its size and where it starts: the
measurement behind exact mode's SCHED_MIN_BATCH (src/router/sched.h).

For each position P and size n: the slot holds P tokens, and a request
evaluates n more (one micro-batch when n <= -ub), on llama-server alone; its
own prompt_ms, median of --reps. Then, at the last position, the same n
tokens evaluated as one request and as --split requests of n/split tokens
each: with -ub n/split both make the same micro-batches (what a request
costs); with -ub n the split makes more (what a micro-batch costs).

  python3 bench/ubatch_cost.py [--positions 2048,6144] [--sizes 1,16,32,56,64,128,256,257,320,321,512]
                               [--reps 3] [--split 4]

24M random-weight model, 1 slot, -c 10240. Standard library only; uses
tests/integration/toki_harness.py (and build/toki, or $TOKI_BIN)."""
import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
os.environ.setdefault("TOKI_BIN", os.path.join(HERE, "..", "build", "toki"))
import toki_harness as th  # noqa: E402
from bench_agent import agent_prompt, exact_steps  # noqa: E402


def tokens(model, n):
    """n real prompt tokens (an agent-like chat's), so that none is invalid."""
    t = exact_steps(model, agent_prompt(31, 40, n + 1000, nonce="ubatch cost. "))[0]
    if len(t) < n:
        raise SystemExit(f"only {len(t)} tokens")
    return t[:n]


def evaluate(port, toks, start, ends):
    """The slot holds toks[:start] (recomputed if not); evaluates up to each
    of ends, one request each. Returns the server's prompt_ms summed."""
    # One token that differs after the prefix: the slot then matches
    # exactly start tokens, whatever it held.
    st, r = th.request(port, "POST", "/completion",
                       {"prompt": toks[:start] + [toks[start] ^ 1], "n_predict": 0,
                        "cache_prompt": True}, auth=False)
    assert st == 200, r
    ms, prev = 0.0, start
    for e in ends:
        st, r = th.request(port, "POST", "/completion",
                           {"prompt": toks[:e], "n_predict": 0, "cache_prompt": True},
                           auth=False)
        assert st == 200 and r["timings"]["prompt_n"] == e - prev, r
        ms += r["timings"]["prompt_ms"]
        prev = e
    return ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--positions", default="2048,6144")
    ap.add_argument("--sizes", default="1,16,32,56,64,128,256,257,320,321,512")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--split", type=int, default=4)
    a = ap.parse_args()
    positions = [int(x) for x in a.positions.split(",")]
    sizes = [int(x) for x in a.sizes.split(",")]
    model = th.generated_model("bench", "24M", 32768)
    toks = tokens(model, max(positions) + max(sizes) + 1)
    print("| rows in | micro-batch rows | prompt_ms (median) | ms per row |\n|---|---|---|---|")
    llama = th.LlamaServer(model=model, slots=1, ctx=10240, ubatch=max(sizes), name="ubatch-cost")
    try:
        for p in positions:
            for n in sizes:
                ms = statistics.median(evaluate(llama.port, toks, p, [p + n])
                                       for _ in range(a.reps))
                print(f"| {p} | {n} | {ms:.1f} | {ms / n:.2f} |", flush=True)
    finally:
        llama.kill()
    n, k, p = max(sizes), a.split, max(positions)
    ends = [p + n * (i + 1) // k for i in range(k)]
    print(f"\n{n} rows after {p}: one request, or {k} of {n // k}\n")
    print("| -ub | micro-batches | requests | prompt_ms (median) |\n|---|---|---|---|")
    for ub in (n, n // k):
        llama = th.LlamaServer(model=model, slots=1, ctx=10240, ubatch=ub, name="ubatch-cost")
        try:
            for reqs in (1, k):
                e = [p + n] if reqs == 1 else ends
                ms = statistics.median(evaluate(llama.port, toks, p, e) for _ in range(a.reps))
                mbs = 1 if ub == n and reqs == 1 else k
                print(f"| {ub} | {mbs} | {reqs} | {ms:.1f} |", flush=True)
        finally:
            llama.kill()


if __name__ == "__main__":
    main()
