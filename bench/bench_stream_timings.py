#!/usr/bin/env python3
"""A streamed answer whose client asks for `timings_per_token` (llama-server's
own web UI does, to show its speed): when does each token reach the client?
llama-server puts `timings` on every token's chunk then. toki holds back the
chunk that may be the answer's last, to put its cache block there; before
ed399c9 it held back every chunk with timings, so each token reached the
client one token late.

Paths, each on its own llama-server (the same binary, model and flags:
-np 2, -t 2, --cache-ram 0), requests alternating between them in an order
that rotates every round: llama-server alone, toki (exact mode, --toki), and
with --against an older toki binary. Each round sends the same cached chat
(a system line and a user line; every request after the first is a cache
hit), streamed, max_tokens --tokens, temperature 0, with timings_per_token
and without. Reported per path: p50 and p90 of the time to the first token
(the first content delta) and of the gap between the client's receipt of
one content delta and the next, and the server's own time per generated
token (timings.predicted_per_token_ms), so that a token held back shows as
one decode step added to the first token's time.

  python3 bench/bench_stream_timings.py [--toki BIN] [--against OLD_BIN] [-n 60]
                                        [--tokens 24] [--model GGUF] [--json OUT]

--model: default the generated 24M model of benchmark a
(toki_harness.generated_model), whose decode step is milliseconds long.

Standard library only."""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

SYSTEM = "You are a storyteller who tells short stories about a girl named Lily."
USER = "Tell me what Lily did in the park today."


def one(client, tpt, tokens):
    body = {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": USER}],
            "max_tokens": tokens, "temperature": 0, "stream": True}
    if tpt:
        body["timings_per_token"] = True
    resp = client._send("POST", "/v1/chat/completions", body)
    t0 = time.perf_counter()
    arrivals, per_token = [], None
    if resp.status != 200:
        raise RuntimeError(f"{resp.status}: {resp.read()[:300]}")
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.decode("utf-8", "replace").strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        j = json.loads(line[5:])
        for ch in j.get("choices", []):
            if (ch.get("delta") or {}).get("content"):
                arrivals.append(time.perf_counter())
        if "timings" in j:
            per_token = j["timings"].get("predicted_per_token_ms")
    ttft = (arrivals[0] - t0) * 1000 if arrivals else float("nan")
    gaps = [(b - a) * 1000 for a, b in zip(arrivals, arrivals[1:])]
    return ttft, gaps, per_token


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toki", default=os.path.join(common.SOURCE_DIR, "build", "toki"))
    ap.add_argument("--against", help="an older toki binary, as a path of its own")
    ap.add_argument("-n", type=int, default=60, help="rounds")
    ap.add_argument("--tokens", type=int, default=24, help="max_tokens of each answer")
    ap.add_argument("--model")
    ap.add_argument("--json")
    a = ap.parse_args()
    th = common.harness()
    against = None
    if a.against:
        # A private copy of the older binary too: a rebuild cannot swap it.
        import shutil
        import tempfile
        against = os.path.join(tempfile.mkdtemp(prefix="toki-bench-old-"), "toki")
        shutil.copy2(a.against, against)
    toki_bin = common.use_toki_binary(a.toki)
    model = a.model or th.generated_model("bench", params="24M", ctx=8192)
    info = common.machine_info(toki_bin)
    procs, paths = [], []
    try:
        alone = th.LlamaServer(model=model, slots=2, ctx=4096, name="alone")
        procs.append(alone)
        paths.append(("llama-server alone", common.Client(alone.port)))
        srv = th.LlamaServer(model=model, slots=2, ctx=4096, name="toki-llama")
        procs.append(srv)
        toki = th.Toki([srv], mode="exact")
        procs.append(toki)
        paths.append(("toki", common.Client(toki.port)))
        if against:
            srv2 = th.LlamaServer(model=model, slots=2, ctx=4096, name="old-llama")
            procs.append(srv2)
            th.TOKI_BIN = against
            old = th.Toki([srv2], mode="exact", name="toki-old")
            th.TOKI_BIN = toki_bin
            procs.append(old)
            paths.append(("toki (--against)", common.Client(old.port)))
        res = {name: {True: ([], [], []), False: ([], [], [])} for name, _ in paths}
        for _, c in paths:  # the first request fills the cache
            one(c, True, a.tokens)
        for r in range(a.n):
            order = paths[r % len(paths):] + paths[:r % len(paths)]
            for tpt in (True, False):
                for name, c in order:
                    ttft, gaps, per_token = one(c, tpt, a.tokens)
                    t, g, p = res[name][tpt]
                    t.append(ttft)
                    g.extend(gaps)
                    if per_token is not None:
                        p.append(per_token)
        rows = []
        for name, _ in paths:
            for tpt in (True, False):
                t, g, p = res[name][tpt]
                rows.append([name, "yes" if tpt else "no", common.pct(t, 50), common.pct(t, 90),
                             common.pct(g, 50), common.pct(g, 90), common.median(p)])
        print(f"machine: {info.get('cpu')}, {info.get('cores')} cores; commit {info['commit']}"
              f"{' (dirty)' if info['dirty'] else ''}; {info['llama_server']}")
        print(f"{a.n} rounds, max_tokens {a.tokens}, model {os.path.basename(model)}\n")
        print(common.table(["path", "timings_per_token", "first token p50 ms",
                            "first token p90 ms", "gap p50 ms", "gap p90 ms",
                            "server ms per token"], rows))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"machine": info, "rows": rows}, f, indent=1)
    finally:
        common.stop(*reversed(procs))


if __name__ == "__main__":
    main()
