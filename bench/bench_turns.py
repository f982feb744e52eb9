#!/usr/bin/env python3
"""Conversations in use against one that ended (issue 24, item 2): a user's
own llama-server with -np 2, more conversations than slots. The workload:
a long prompt sent twice, a 4-turn conversation, then two conversations
interleaved, 3 turns each (the two in use must not take turns overwriting
each other while the finished one keeps the other slot). llama-server
alone beside toki fast and exact in front of it (`toki serve --backend`),
each on its own server, with and without slot files, with --cache-ram 0
and the server's default. Evaluated: the server's own count
(llamacpp:prompt_tokens_total, every step and tail cut included, and the
rows of exact mode's forced runs, which the server counts as predicted). Exact
mode's answers are checked against toki's uncached answers, text and
logprobs, every turn.

  python3 bench/bench_turns.py [--toki BIN] [--base-toki BIN] [--think-ms 250]

--base-toki adds a column: exact mode on another toki binary (an earlier
commit's, to compare schedules side by side in one run).

Standard library only; tests/integration/toki_harness.py starts the
processes (build/toki, or $TOKI_BIN / --toki)."""
import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

WORDS = ("the cat dog sun moon tree bird river house small big red blue green old new happy "
         "sad runs jumps sings walks looks finds makes takes gives tells asks likes").split()


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def workload(seed=7):
    """The requests, in order: (conversation, turn) pairs and their
    messages, built as the conversation goes (each turn adds the last
    answer)."""
    rng = random.Random(seed)
    convs = {}
    convs["long"] = {"system": text(rng, 1200), "users": [text(rng, 30)] * 2}
    for name, turns in (("done", 4), ("a", 3), ("b", 3)):
        convs[name] = {"system": text(rng, 400), "users": [text(rng, 60) for _ in range(turns)]}
    order = [("long", 0), ("long", 1)] + [("done", t) for t in range(4)]
    for t in range(3):
        order += [("a", t), ("b", t)]
    return convs, order


def server_prompt_tokens(th, llama):
    st, text_ = th.request(llama.port, "GET", "/metrics", auth=False, raw=True)
    for line in text_.splitlines():
        if line.startswith("llamacpp:prompt_tokens_total "):
            return float(line.split()[1])
    raise RuntimeError("no llamacpp:prompt_tokens_total")


def forced_rows(toki):
    """Rows exact mode's forced runs decoded (an earlier answer replayed one
    token at a time, as one generation): the server counts them as
    predicted tokens, not prompt tokens, so they are added. 0 without toki,
    and on a binary from before forced runs."""
    return toki.stats().get("replay_forced_tokens", 0) if toki else 0


def wait_slots_free(toki):
    """Until toki's slots are free: exact mode's tail cuts are the server's
    work too, and its counter must include them."""
    deadline = time.time() + 60
    while any(s["busy"] for b in toki.stats()["backends"] for s in b["slots"]):
        if time.time() > deadline:
            raise RuntimeError("a slot stayed busy")
        time.sleep(0.02)


def uncached_identical(th, port, auth, sent):
    """How many of the sent (body, text, logprobs) answers the same request
    with cache_prompt false gives again, text and logprobs."""
    identical = 0
    for body, content, lp in sent:
        st, raw = th.request(port, "POST", "/v1/chat/completions",
                             dict(body, cache_prompt=False), auth=auth)
        c = raw["choices"][0]
        identical += (c["message"]["content"], c.get("logprobs")) == (content, lp)
    return identical


def run(th, path, slot_files, cache_ram, think_s):
    convs, order = workload()
    slot_dir = tempfile.mkdtemp(prefix="toki-turns-")
    extra = ["--metrics"] + (["--slot-save-path", slot_dir] if slot_files else [])
    llama = th.LlamaServer(model=MODEL, slots=2, ctx=8192, cache_ram=cache_ram, extra=extra)
    toki = None
    try:
        if path != "alone":
            own = th.TOKI_BIN
            if path == "exact-base":
                th.TOKI_BIN = BASE_TOKI
            try:
                toki = th.Toki([llama], mode="exact" if path == "exact-base" else path,
                               extra=(["--slot-dir", slot_dir] if slot_files else []))
            finally:
                th.TOKI_BIN = own
        port, auth = (toki.port, True) if toki else (llama.port, False)
        before = server_prompt_tokens(th, llama) + forced_rows(toki)
        history = {k: [{"role": "system", "content": v["system"]}] for k, v in convs.items()}
        sent = []
        for name, t in order:
            msgs = history[name] + [{"role": "user", "content": convs[name]["users"][t]}]
            body = {"messages": msgs, "max_tokens": 8, "temperature": 0, "logprobs": True,
                    "top_logprobs": 1}
            st, r = th.request(port, "POST", "/v1/chat/completions", body, auth=auth)
            if st != 200:
                raise RuntimeError(f"{path}: {st} {r}")
            c = r["choices"][0]
            sent.append((body, c["message"]["content"], c.get("logprobs")))
            if name != "long":
                history[name] = msgs + [{"role": "assistant", "content": c["message"]["content"]}]
            time.sleep(think_s)  # the user's (or agent's) think time
        if toki:
            wait_slots_free(toki)
        evaluated = server_prompt_tokens(th, llama) + forced_rows(toki) - before
        identical = (uncached_identical(th, port, auth, sent) if path.startswith("exact")
                     else None)
        return {"evaluated": int(evaluated), "identical": identical, "requests": len(order)}
    finally:
        if toki:
            toki.kill(signal.SIGTERM)
        llama.kill()


BASE_TOKI = None


def main():
    global MODEL, BASE_TOKI
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toki", help="the toki binary (default build/toki or $TOKI_BIN)")
    ap.add_argument("--think-ms", type=float, default=250)
    ap.add_argument("--paths", default="alone,fast,exact")
    ap.add_argument("--base-toki", help="also exact mode on this toki binary (exact-base)")
    args = ap.parse_args()
    if args.base_toki:
        BASE_TOKI = os.path.abspath(args.base_toki)
        args.paths += ",exact-base"
    if args.toki:
        os.environ["TOKI_BIN"] = os.path.abspath(args.toki)
    os.environ.setdefault("TOKI_BIN", os.path.join(HERE, "..", "build", "toki"))
    import toki_harness as th
    MODEL = th.generated_model("turns", params="4M", ctx=8192)
    paths = args.paths.split(",")
    print(f"toki {os.environ['TOKI_BIN']}, think {args.think_ms:.0f} ms, -np 2, 4M model")
    exacts = [p for p in paths if p.startswith("exact")]
    print("| slot files | --cache-ram | " + " | ".join(paths) + " | " +
          " | ".join(f"{p} identical" for p in exacts) + " |")
    print("|---|---|" + "---|" * (len(paths) + len(exacts)))
    for slot_files in (False, True):
        for cram in (0, 8192):
            res = {p: run(th, p, slot_files, cram, args.think_ms / 1000) for p in paths}
            alone = res.get("alone", {}).get("evaluated")
            cells = []
            for p in paths:
                e = res[p]["evaluated"]
                cells.append(f"{e}" + (f" ({e / alone:.2f})" if alone and p != "alone" else ""))
            idn = [f"{res[p]['identical']}/{res[p]['requests']}" for p in exacts]
            print(f"| {'yes' if slot_files else 'no'} | {cram} | " + " | ".join(cells) +
                  " | " + " | ".join(idn) + " |", flush=True)


if __name__ == "__main__":
    main()
