#!/usr/bin/env python3
"""The cold replay of a long agent conversation (issue 35): what a request
costs when nothing of it is cached, now that exact mode evaluates every
earlier answer's tokens one at a time (steps), against exact mode before
steps (an earlier toki binary) and llama-server alone.

A 30-turn conversation is built once through toki (its answers are the
model's own, so that their tokens are the ones generation made); then its
next turn is sent with cache_prompt false (toki's uncached reference: every
chunk from an empty slot) through each toki, and cache_prompt false straight
to llama-server, in ABC order, --reps times. Each path has a llama-server of
its own (-np 1), on the same model. Reported: the wall time (median), the
requests toki made (the cache block's steps), the tokens evaluated, and the
rows evaluated one at a time (the answers' tokens).

  python3 bench/bench_replay.py --base-toki BIN [--toki BIN] [--turns 30]
      [--answer-tokens 48] [--params 24M] [--reps 3] [--also LABEL=BIN ...]

Then the next turn hot (the conversation's slot as the last answer left it),
through each toki and llama-server alone: the tokens each evaluated.

Standard library only; tests/integration/toki_harness.py starts the
processes (build/toki, or $TOKI_BIN / --toki)."""
import argparse
import os
import random
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

WORDS = ("the file function test error build change line module import return value call "
         "list read write open close check path name type class method config run fix add "
         "remove update result output input data server client request cache slot").split()


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toki", help="the toki binary (default build/toki or $TOKI_BIN)")
    ap.add_argument("--base-toki", required=True, help="exact mode before steps, to compare")
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--answer-tokens", type=int, default=48)
    ap.add_argument("--params", default="24M", choices=["4M", "24M"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--also", action="append", default=[], metavar="LABEL=BIN",
                    help="another toki binary in exact mode, a row of its own (repeatable)")
    args = ap.parse_args()
    if args.toki:
        os.environ["TOKI_BIN"] = os.path.abspath(args.toki)
    os.environ.setdefault("TOKI_BIN", os.path.join(HERE, "..", "build", "toki"))
    import toki_harness as th
    model = th.generated_model("replay", params=args.params, ctx=32768)
    bins = {"exact (steps)": th.TOKI_BIN, "exact (before)": os.path.abspath(args.base_toki)}
    for a in args.also:
        label, _, b = a.partition("=")
        bins[f"exact ({label})"] = os.path.abspath(b)
    servers, tokis = {}, {}
    try:
        for name in ("alone", *bins):
            servers[name] = th.LlamaServer(model=model, slots=1, ctx=32768, name="replay")
        for name, b in bins.items():
            own = th.TOKI_BIN
            th.TOKI_BIN = b
            try:
                tokis[name] = th.Toki([servers[name]], mode="exact", name="replay")
            finally:
                th.TOKI_BIN = own
        rng = random.Random(35)
        msgs = [{"role": "system", "content": text(rng, 400)}]
        build = tokis["exact (steps)"]
        for t in range(args.turns):
            msgs.append({"role": "user", "content": text(rng, 40)})
            st, r = build.chat(msgs, max_tokens=args.answer_tokens)
            if st != 200:
                raise RuntimeError(f"turn {t}: {st} {r}")
            msgs.append({"role": "assistant", "content": r["choices"][0]["message"]["content"]})
        msgs.append({"role": "user", "content": text(rng, 40)})
        body = {"messages": msgs, "max_tokens": 8, "temperature": 0, "logprobs": True,
                "top_logprobs": 1}
        rows = {name: [] for name in ("alone", *bins)}
        answers = {}
        for _ in range(args.reps):
            for name in rows:
                port, auth = ((servers[name].port, False) if name == "alone"
                              else (tokis[name].port, True))
                t0 = time.time()
                st, r = th.request(port, "POST", "/v1/chat/completions",
                                   dict(body, cache_prompt=False), auth=auth)
                wall = time.time() - t0
                if st != 200:
                    raise RuntimeError(f"{name}: {st} {r}")
                c = r.get("cache", {})
                rows[name].append((wall, r["timings"]["prompt_n"], c.get("steps", 1),
                                   c.get("replayed", 0)))
                answers.setdefault(name, []).append(
                    (r["choices"][0]["message"]["content"], r["choices"][0].get("logprobs")))
        n = rows["alone"][0][1]
        print(f"{args.turns}-turn conversation, {args.params} model, answers of up to "
              f"{args.answer_tokens} tokens; its next turn: {n} prompt tokens; "
              f"cache_prompt false, median of {args.reps}")
        print("| path | wall s | against exact (before) | requests to the server | evaluated |"
              " of which one at a time | repeatable |")
        print("|---|---|---|---|---|---|---|")
        base = statistics.median(r[0] for r in rows["exact (before)"])
        for name, rs in rows.items():
            wall = statistics.median(r[0] for r in rs)
            same = all(a == answers[name][0] for a in answers[name])
            print(f"| {name} | {wall:.2f} | {wall / base:.2f}x | {rs[0][2]} | {rs[0][1]} | "
                  f"{rs[0][3]} | {'yes' if same else 'no'} |")
        # The turn after, hot: each path's slot holds the conversation and
        # the answer its last uncached run gave, which the turn carries.
        user = text(rng, 40)
        print("\nThe turn after (its answer, a new user message), cached:")
        print("| path | prompt | evaluated | cached |")
        print("|---|---|---|---|")
        for name in rows:
            port, auth = ((servers[name].port, False) if name == "alone"
                          else (tokis[name].port, True))
            nxt = msgs + [{"role": "assistant", "content": answers[name][-1][0]},
                          {"role": "user", "content": user}]
            st, r = th.request(port, "POST", "/v1/chat/completions", dict(body, messages=nxt),
                               auth=auth)
            if st != 200:
                raise RuntimeError(f"{name}: {st} {r}")
            tm = r["timings"]
            print(f"| {name} | {tm['prompt_n'] + tm['cache_n']} | {tm['prompt_n']} | "
                  f"{tm['cache_n']} |")
    finally:
        for tk in tokis.values():
            tk.kill(signal.SIGTERM)
        for s in servers.values():
            s.kill()


if __name__ == "__main__":
    main()
