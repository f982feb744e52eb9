#!/usr/bin/env python3
"""A short cached chat, request by request (issue 24, item 5): the same
~125-token chat (a system line and a user line) sent again and again with
max_tokens 2 at temperature 0, so that every request but the first is a
cache hit. Total request time through llama-server alone, toki fast and toki
exact (and, with --against, an older toki binary in exact mode), requests
alternating between the paths, non-streamed and streamed.

Each path has its own llama-server (the same binary, model and flags: -np 2,
-t 2, --cache-ram 0): a path's slots then hold only what its own requests
left there. On one shared server, llama-server alone would pick toki's slots
for its own requests (it matches the same prompt), toki's record of them
would be wrong and its next request replanned, and exact mode's tail cut
would run beside the other paths' requests: that measures the paths getting
in each other's way, not what each costs. The servers are idle but for the
path being measured; alternating the paths request by request spreads the
machine's noise over all of them alike.

Per round, each path (in an order that rotates every round): a pause of
--gap-ms, one request ("after a pause": the previous request's work, exact
mode's tail cut included, is done), then at once the same request again
("back to back": it waits for whatever the previous one left running). The
same for the streamed request. Reported per path: p50 and p90 of the total
request time (and of TTFT, streamed), and the server's own time for the
request (timings.prompt_ms + predicted_ms), which is compute; the rest is
the round trips, llama-server's own handling (template, tokens, JSON) and
whatever toki adds. Then, paired by round, each request's difference from
fast mode's request of the same round and kind (p50 of the differences),
which the machine's load moves far less than the p50s themselves.

Two more paths replay exact mode's work on llama-server alone, without toki,
to tell the server's compute from toki's overhead:
  alone, exact's steps: a cut (the kept prefix and a throw-away token, as
    toki's tail cut leaves the slot; sent before the pause, not timed), then
    the request, which evaluates the generation prompt's chunk as exact
    mode's resend does;
  alone, header only: the same, the request timed, but sent as /completion
    with the prompt's token ids (no template on the server's side).

Identity: after the timed rounds, exact mode's cached answer (text and
logprobs) against toki's uncached one (cache_prompt false), a few times.

  python3 bench/bench_short_chat.py [--toki BIN] [--against OLD_BIN] [-n 200]
                                    [--gap-ms 30] [--model GGUF] [--json OUT]

--model: default the tests' model (stories260K); with a 3-token header,
e.g. the generated 24M model of benchmark a (toki_harness.generated_model).

Standard library only."""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import Client, harness, loadavg, log, median, pct, stop, table  # noqa: E402

SYSTEM = "You are a helpful assistant who tells short stories about animals."
USER = ("Once upon a time there was a little cat named Tom who lived in a big red house near "
        "the river with his mother and his two small brothers.")
TARGET_TOKENS = 125


def tokens_of(c, msgs):
    st, t = c.json("POST", "/apply-template", {"messages": msgs})
    assert st == 200, t
    st, tok = c.json("POST", "/tokenize", {"content": t["prompt"], "add_special": True,
                                          "parse_special": True})
    assert st == 200, tok
    return tok["tokens"]


def make_messages(c):
    """The user line cut word by word until the prompt is TARGET_TOKENS
    tokens or the nearest below."""
    words = (USER + " ") * 3
    words = words.split()

    def msgs(n):
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": " ".join(words[:n])}]
    n = len(words)
    while n > 1 and len(tokens_of(c, msgs(n))) > TARGET_TOKENS:
        n -= 1
    return msgs(n)


class Path:
    def __init__(self, name, server, toki=None):
        self.name, self.server, self.toki = name, server, toki
        port = toki.port if toki else server.port
        self.client = Client(port)
        self.side = Client(server.port)  # the replays' cuts, and token ids
        self.rec = {k: [] for k in ("gap", "b2b", "gap_stream", "b2b_stream")}


def replay_cut(path, tokens, keep):
    """Exact mode's tail cut, replayed on llama-server alone: the slot keeps
    tokens[0..keep) and a throw-away token, as toki's cut leaves it."""
    junk = tokens[keep] - 1 if tokens[keep] > 0 else tokens[keep] + 1
    st, j = path.side.json("POST", "/completion", {
        "prompt": tokens[:keep] + [junk], "n_predict": 0, "cache_prompt": True, "id_slot": 0})
    assert st == 200, j


def request(path, body, stream, tokens, keep):
    """One request on a path: (total ms, ttft ms or None, server ms, evaluated)."""
    c = path.client
    if path.name == "alone, header only":
        t0 = time.perf_counter()
        st, j = c.json("POST", "/completion", {
            "prompt": tokens, "n_predict": body["max_tokens"], "temperature": 0,
            "cache_prompt": True, "id_slot": 0, "stream": False})
        total = (time.perf_counter() - t0) * 1000
        assert st == 200, j
        t = j["timings"]
        return total, None, t["prompt_ms"] + t["predicted_ms"], t["prompt_n"]
    if path.name.startswith("alone, "):
        body = dict(body, id_slot=0)
    if stream:
        r = c.stream_chat(body)
        assert r["status"] == 200, r
        t = r["timings"] or {}
        return (r["total"] * 1000, r["ttft"] * 1000,
                t.get("prompt_ms", 0) + t.get("predicted_ms", 0), t.get("prompt_n"))
    t0 = time.perf_counter()
    st, j = c.json("POST", "/v1/chat/completions", body)
    total = (time.perf_counter() - t0) * 1000
    assert st == 200, j
    t = j.get("timings") or {}
    return total, None, t.get("prompt_ms", 0) + t.get("predicted_ms", 0), t.get("prompt_n")


def slots_idle(path):
    """Waits until toki says the path's slots are free (exact mode's tail cut
    is done)."""
    if not path.toki:
        return
    deadline = time.time() + 30
    while any(s["busy"] for b in path.toki.stats()["backends"] for s in b["slots"]):
        if time.time() > deadline:
            raise RuntimeError(f"{path.name}: a slot stayed busy")
        time.sleep(0.005)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toki", help="the toki binary (default build/toki or $TOKI_BIN)")
    ap.add_argument("--against", help="an older toki binary, run in exact mode beside")
    ap.add_argument("-n", type=int, default=200, help="rounds (each path: 2 requests a mode)")
    ap.add_argument("--gap-ms", type=float, default=30)
    ap.add_argument("--json", help="write every measurement here (default bench/results/"
                    "bench_short_chat-TIME.json)")
    ap.add_argument("--model", help="default: the harness's test model (stories260K)")
    args = ap.parse_args()
    if args.toki:
        os.environ["TOKI_BIN"] = os.path.abspath(args.toki)
    os.environ.setdefault("TOKI_BIN", os.path.join(HERE, "..", "build", "toki"))
    th = harness()
    toki_bin = th.TOKI_BIN = os.environ["TOKI_BIN"]
    model = args.model or th.test_model()
    specs = [("alone", None, None), ("alone, exact's steps", None, None),
             ("alone, header only", None, None), ("fast", "fast", toki_bin),
             ("exact", "exact", toki_bin)]
    if args.against:
        specs.append(("exact (against)", "exact", os.path.abspath(args.against)))
    procs, paths = [], []
    try:
        for name, mode, binary in specs:
            ls = th.LlamaServer(model=model, slots=2, ctx=4096, cache_ram=0,
                                name="bench-short-" + name.split(",")[0].split()[0])
            procs.append(ls)
            tk = None
            if mode:
                th.TOKI_BIN = binary
                tk = th.Toki([ls], mode=mode, name="toki-bench-short-" + mode)
                procs.append(tk)
            paths.append(Path(name, ls, tk))
        msgs = make_messages(paths[0].side)
        tokens = tokens_of(paths[0].side, msgs)
        body = {"messages": msgs, "temperature": 0, "max_tokens": 2}
        exact_path = next(p for p in paths if p.name == "exact")
        for p in paths:  # warm: the first request fills each cache, and the exact toki's cut
            for _ in range(3):
                if p.name.startswith("alone, "):
                    continue
                request(p, body, False, tokens, 0)
                slots_idle(p)
        # Where exact mode cuts the slot back after an answer (the start of
        # the generation prompt's chunk): what its resend reuses.
        hot = exact_path.client.json("POST", "/v1/chat/completions", body)[1]
        keep = hot["cache"]["cached"]
        log(f"prompt {len(tokens)} tokens; exact's resend reuses {keep} and evaluates "
            f"{hot['cache']['evaluated']}; {args.n} rounds, gap {args.gap_ms} ms")
        slots_idle(exact_path)
        for p in paths:
            if p.name.startswith("alone, "):
                replay_cut(p, tokens, keep)
                request(p, body, False, tokens, keep)
        load0 = loadavg()
        t_start = time.time()
        for i in range(args.n):
            k = i % len(paths)
            order = paths[k:] + paths[:k]
            if i % 2:
                order = order[::-1]
            for p in order:
                for stream in (False, True):
                    if p.name.startswith("alone, "):
                        # the cut before the pause, as toki's runs after the answer
                        replay_cut(p, tokens, keep)
                    time.sleep(args.gap_ms / 1000)
                    slots_idle(p)
                    sfx = "_stream" if stream else ""
                    p.rec["gap" + sfx].append(request(p, body, stream, tokens, keep))
                    if p.name.startswith("alone, "):
                        continue  # its cut is a request of its own: no back-to-back
                    p.rec["b2b" + sfx].append(request(p, body, stream, tokens, keep))
            if (i + 1) % 50 == 0:
                log(f"  round {i + 1}/{args.n}")
        elapsed = time.time() - t_start
        load1 = loadavg()
        # Identity: exact's cached answer, text and logprobs, against toki's
        # uncached answer.
        lp = dict(body, logprobs=True, top_logprobs=3)
        ident = {}
        for p in paths:
            if not p.toki or "exact" not in p.name:
                continue
            _, ref = p.client.json("POST", "/v1/chat/completions", dict(lp, cache_prompt=False))
            same = 0
            for _ in range(5):
                slots_idle(p)
                _, a = p.client.json("POST", "/v1/chat/completions", lp)
                same += (a["choices"][0]["message"]["content"] == ref["choices"][0]["message"]
                         ["content"] and a["choices"][0]["logprobs"] ==
                         ref["choices"][0]["logprobs"])
            ident[p.name] = f"{same}/5"
        stats = {p.name: p.toki.stats() for p in paths if p.toki}
    finally:
        for p in paths:
            p.client.close()
            p.side.close()
        stop(*reversed(procs))

    rows = []
    fast_p50 = median([r[0] for r in next(p for p in paths if p.name == "fast").rec["gap"]])
    for p in paths:
        for kind, label in (("gap", "after a pause"), ("b2b", "back to back"),
                            ("gap_stream", "streamed, after a pause"),
                            ("b2b_stream", "streamed, back to back")):
            rs = p.rec[kind]
            if not rs:
                continue
            tot = [r[0] for r in rs]
            ttft = [r[1] for r in rs if r[1] is not None]
            srv = [r[2] for r in rs]
            ev = sorted(set(r[3] for r in rs))
            rows.append([p.name, label, len(rs), "-".join(str(e) for e in (ev[0], ev[-1]))
                         if len(ev) > 1 else str(ev[0]), median(tot), pct(tot, 90),
                         median(ttft) if ttft else "", median(srv),
                         median(tot) - median(srv)])
    t = table(["path", "request", "n", "evaluated", "total p50 ms", "total p90 ms",
               "TTFT p50 ms", "server p50 ms (prompt + predicted)", "total - server p50 ms"],
              rows)
    print(f"\nprompt {len(tokens)} tokens, max_tokens 2, exact's resend reuses {keep}; "
          f"{args.n} rounds in {elapsed:.0f} s, gap {args.gap_ms:.0f} ms; load "
          f"{load0} -> {load1}; toki {toki_bin}"
          + (f", against {args.against}" if args.against else "") + "\n")
    print(t)
    # Paired by round: each request against fast mode's request of the same
    # round and kind, which ran moments before or after it.
    fast = next(p for p in paths if p.name == "fast")
    prow = []
    for p in paths:
        for kind, label in (("gap", "after a pause"), ("b2b", "back to back"),
                            ("gap_stream", "streamed, after a pause"),
                            ("b2b_stream", "streamed, back to back")):
            rs, fs = p.rec[kind], fast.rec[kind]
            if not rs or p is fast:
                continue
            n = min(len(rs), len(fs))
            prow.append([p.name, label, median([rs[i][0] - fs[i][0] for i in range(n)]),
                         median([rs[i][2] - fs[i][2] for i in range(n)]),
                         median([(rs[i][0] - rs[i][2]) - (fs[i][0] - fs[i][2])
                                 for i in range(n)])])
    print("\nPaired with fast mode's request of the same round (p50 of the differences):\n")
    print(table(["path", "request", "total - fast ms", "server - fast's server ms",
                 "(total - server) - fast's ms"], prow))
    print(f"\nfast p50 (after a pause, not streamed): {fast_p50:.2f} ms")
    for name, v in ident.items():
        print(f"{name}: cached answer = toki's uncached answer, text and logprobs: {v}")
    for name, s in stats.items():
        print(f"{name}: tail_cuts {s.get('tail_cuts')}, evaluated_tokens "
              f"{s.get('evaluated_tokens')}, routed {s.get('routed')}, hits {s.get('hits')}")
    if not args.json:
        os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
        args.json = os.path.join(HERE, "results",
                                 time.strftime("bench_short_chat-%Y%m%d-%H%M%S.json"))
    with open(args.json, "w") as f:
        json.dump({"prompt_tokens": len(tokens), "keep": keep, "gap_ms": args.gap_ms,
                   "load": [load0, load1], "paths": {p.name: p.rec for p in paths},
                   "identity": ident, "stats": stats}, f)
    print(f"\nevery measurement: {args.json}")


if __name__ == "__main__":
    main()
