#!/usr/bin/env python3
"""Issue 35, ask 1: per template family, how much of an answer comes back in
the next request as the tokens generation made, and what the next turn
evaluates under each rule. Plain answers, answers with reasoning, with a
tool call, with both; the next message a user's turn or the tool's result.

Each family is a real llama-server on a random-weight model with the
family's vocabulary and template (the npm tokenizer packages and
@huggingface/ollama-utils, as tests/integration/test_chat_template.py).
For each case:

  P   the server's prompt for the conversation so far (/apply-template,
      /tokenize), with the agent's tools;
  G   what a model of the family writes as its answer: the template's own
      rendering of the assistant message as the latest turn (its training
      format), up to and including its end-of-turn token, as tokenized
      after P. Generation evaluates G's tokens one at a time and never the
      last, so the slot then holds P + G[:-1];
  A'  the message the agent sends back: for answers without tool calls, the
      server's own parse of G, got by forcing a chat generation to G's
      tokens (a grammar of token ids); for tool calls (the server refuses
      a grammar beside tools), the message as written, its arguments the
      JSON text the template wrote;
  N   the next request's prompt: P's messages, A', the next message.

Columns: rows back = the longest common prefix of N and P + G[:-1], past P
(the rows a hot slot lends); the next turn's evaluated tokens, hot, for
llama-server alone (N minus that prefix, at least 1), for toki (BIN's
schedule for N: the answer's rows reused as far as they are one-token
chunks matching the slot; with --rule keep, every answer's rows are kept
after it, as toki does since its keep renders reasoning and tool calls
through the template; with --rule text, the rule before that: an answer
with tool calls or reasoning gets the tail cut after it), for steps to the
end of the turn (every generated token one at a time, kept whatever it
holds: the best a schedule can do) and for a batch (the answer
recomputed, the rule before steps). Schedules are toki's own
(`toki tokenize --chat --schedule`); a family whose template the server
renders its own way (gpt-oss) has no toki schedule here.

  python3 bench/bench_families.py [--toki BIN] [--rule keep|text] [--families a,b] [--json OUT]

Standard library only."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

FAMILIES = [
    # label, npm vocabulary, pre-tokenizer, template (None: the vocabulary's own;
    # "library/...": a GGUF's, from @huggingface/ollama-utils; a path: a file)
    ("qwen3", "qwen3", "qwen2", None),
    ("qwen3-coder", "qwen3", "qwen2", "library/qwen3-coder:30b"),
    ("qwen3-next", "qwen3", "qwen2", "library/qwen3-next:80b"),
    ("llama3", "llama3", "llama-bpe", None),
    ("llama3.2", "llama3_2", "llama-bpe", None),
    ("gemma3", "gemma3", None, None),
    ("deepseek-v3", "deepseek_v3", "deepseek-v3", None),
    ("deepseek-v3.1", "deepseek_v3", "deepseek-v3", "library/deepseek-v3.1:latest"),
    ("devstral", "mistral_nemo", "tekken", "library/devstral:latest"),
    ("gpt-oss", "gptoss", "gpt-4o", "tests/templates/harmony.jinja"),
]

END_MARKERS = ["<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>",
               "<｜end▁of▁sentence｜>", "</s>", "<|end|>", "<|return|>", "<|call|>"]

SYSTEM = ("You are a coding agent working in the user's repository. Keep changes small "
          "and tested. Use the tools to read files and run commands.")
FIRST_USER = "Run the tests."
FIRST_ANSWER = "All 41 tests pass."
USER = "The server ignores --port. Find where the options are parsed."
TEXT = ("The options are parsed in `src/main.c` by `parse_args()`, which never reads "
        "`--port`.\n\nI will add the flag and a test for it.")
REASONING = ("The user says --port is ignored. I should look at how main.c parses "
             "its options, then check the tests.")
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "run_shell",
                     "arguments": json.dumps({"cmd": "grep -n port src/main.c"})}}
TOOL_RESULT = "12:\tint port = 8080;\n48:\tif (!strcmp(argv[i], \"--host\"))"
NEXT_USER = "Good. Now add the flag and its test."

KINDS = [  # answer, next
    ("text", "user"),
    ("reasoning", "user"),
    ("tool call", "tool"),
    ("reasoning + tool call", "tool"),
    ("reasoning + tool call", "user"),
]


def answer_message(kind):
    m = {"role": "assistant", "content": TEXT}
    if "tool call" in kind:
        m["content"] = ""
        m["tool_calls"] = [CALL]
    if "reasoning" in kind:
        m["reasoning_content"] = REASONING
    return m


def next_message(kind):
    if kind == "tool":
        return {"role": "tool", "tool_call_id": "call_1", "content": TOOL_RESULT}
    return {"role": "user", "content": NEXT_USER}


def lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Family:
    def __init__(self, th, toki, label, vocab, pre, template, rule):
        self.th, self.toki, self.label, self.rule = th, toki, label, rule
        if template and template.startswith("library/"):
            template = th.gguf_template(template)
        elif template:
            template = os.path.join(HERE, "..", template)
        self.model = th.tokenizer_model(vocab, pre, template=template)
        self.ls = th.LlamaServer(model=self.model, slots=1, ctx=4096, name=f"fam-{label}")
        st, self.props = th.request(self.ls.port, "GET", "/props")
        self.props_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(self.props, self.props_file)
        self.props_file.close()

    def close(self):
        self.ls.kill()
        os.unlink(self.props_file.name)

    def post(self, path, body):
        st, r = self.th.request(self.ls.port, "POST", path, body)
        return st, r

    def render(self, body, gen=True):
        st, r = self.post("/apply-template", dict(body, add_generation_prompt=gen))
        if st != 200:
            return None
        return r["prompt"]

    def tokens(self, text):
        st, r = self.post("/tokenize", {"content": text, "add_special": True,
                                         "parse_special": True})
        assert st == 200, r
        return r["tokens"]

    def schedule(self, body):
        """toki's chunk starts for a request, or None (declined)."""
        out = subprocess.run([self.toki, "tokenize", "--model", self.model, "--chat", "--props",
                              self.props_file.name, "--schedule", json.dumps(body)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            return None
        r = json.loads(out.stdout)
        return None if "declined" in r or "error" in r else r

    def forced_parse(self, body, gen):
        """The server's parse of a generation forced to gen's tokens."""
        grammar = "root ::= " + " ".join(f"<[{t}]>" for t in gen)
        # As toki's forced runs: the grammar's stack is empty after the last
        # forced token, so the sample after it is an end of generation.
        b = dict(body, grammar=grammar, max_tokens=len(gen) + 1, tool_choice="none",
                 samplers=["top_k"], top_k=1)
        st, r = self.post("/v1/chat/completions", b)
        if st != 200:
            return None, f"forced generation refused ({st}: {str(r)[:120]})"
        msg = r["choices"][0]["message"]
        out = {"role": "assistant", "content": msg.get("content") or ""}
        if msg.get("reasoning_content"):
            out["reasoning_content"] = msg["reasoning_content"]
        return out, None

    def case(self, kind, nxt, tools):
        th = self.th
        kw = {"enable_thinking": "reasoning" in kind, "thinking": "reasoning" in kind}
        # A turn into the conversation (one exchange before it): the steady
        # state, with message starts in P on every template.
        base = {"messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": FIRST_USER},
                             {"role": "assistant", "content": FIRST_ANSWER},
                             {"role": "user", "content": USER}]}
        if tools:
            base["tools"] = tools
        if kw:
            base["chat_template_kwargs"] = kw
        ptext = self.render(base)
        if ptext is None:
            return {"refused": "the template refuses the request"}
        a = answer_message(kind)
        # The answer as the template writes it inside the current turn (a
        # tool's result after it: templates keep reasoning there), from where
        # the rendering parts from the generation prompt up to its end of turn.
        hist = None
        for x in ("tool", "user"):
            hist = self.render(dict(base, messages=base["messages"] + [a, next_message(x)]))
            if hist is not None:
                break
        if hist is None:
            return {"refused": "the template refuses the answer"}
        k = lcp(hist, ptext)
        if k < lcp(self.render(base, gen=False) or "", ptext):
            return {"refused": "the history before the answer renders otherwise"}
        gtext = hist[k:]
        if "tool call" in kind and "run_shell" not in gtext and "grep" not in gtext:
            return {"refused": "the template does not write tool calls"}
        if "reasoning" in kind and "--port is ignored" not in gtext:
            return {"refused": "the template does not write reasoning here"}
        ends = [(gtext.find(m), m) for m in END_MARKERS if gtext.find(m) >= 0]
        if ends:
            at, m = min(ends)
            gtext = gtext[:at + len(m)]
        else:
            gtext += self.props.get("eos_token") or "</s>"
        P = self.tokens(ptext)
        PG = self.tokens(ptext + gtext)
        if PG[:len(P)] != P:
            return {"refused": "P + G does not tokenize with P as its prefix"}
        G = PG[len(P):]
        if "tool call" in kind:
            back_msg, why = a, None
        else:
            back_msg, why = self.forced_parse(base, G[:-1])
            if back_msg is None:
                return {"refused": why}
        nbody = dict(base, messages=base["messages"] + [back_msg, next_message(nxt)])
        ntext = self.render(nbody)
        if ntext is None:
            return {"refused": "the template refuses the next request"}
        N = self.tokens(ntext)
        S = P + G[:-1]
        L = lcp(N, S)
        back = max(0, min(L, len(S)) - len(P))
        r = {"answer_tokens": len(G), "rows": len(G) - 1, "back": back,
             "prompt_intact": L >= len(P), "alone": max(1, len(N) - L), "next": len(N),
             "parse": back_msg if "tool call" not in kind else "as written"}
        # Toki's schedule for P (where its generation prompt chunk starts) and N.
        sp, sn = self.schedule(base), self.schedule(nbody)
        if sp and sn and sn["tokens"] == N and sp["tokens"] == P:
            starts = set(sn["chunks"])
            # The generation prompt's chunk in P (0: one chunk, the grid).
            # (An empty generation prompt, as Mistral's: P's end.)
            g = len(P) if sp.get("header") == "empty" else sp["chunks"][-1] if sp["chunks"] else 0

            def stepped(lo, hi):
                return sum(1 for p in range(lo, hi) if p in starts and p + 1 in starts)

            # Rows of the answer the schedule takes as generation's: one-token
            # chunks from P's end, matching the slot.
            p = len(P)
            while p < L and p in starts and p + 1 in starts:
                p += 1
            reuse_rule = p if L >= len(P) else L
            tail_cut = self.rule == "text" and ("tool call" in kind or "reasoning" in kind)
            reuse_today = min(g, L) if tail_cut else reuse_rule
            r["today"] = max(1, len(N) - reuse_today)
            r["today_one_at_a_time"] = stepped(reuse_today, len(N))
            r["region"] = stepped(len(P), len(N))
            # Every generated token one at a time: the slot's rows reused as
            # far as they match; those not reused of the answer's tokens up to
            # its end of turn go one at a time.
            reuse_all = min(L, len(S))
            r["all_steps"] = max(1, len(N) - reuse_all)
            end = len(P) + lcp(N[len(P):], G[:-1]) if L >= len(P) else reuse_all
            r["all_steps_one_at_a_time"] = max(0, end - reuse_all)
            r["batch"] = max(1, len(N) - min(g, L))
        return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toki", default=os.path.join(HERE, "..", "build", "toki"))
    ap.add_argument("--rule", choices=("keep", "text"), default="keep",
                    help="what toki keeps after an answer: every answer's rows (keep, "
                         "toki's rule), or only a plain text's (text, the rule before)")
    ap.add_argument("--families", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    os.environ.setdefault("TOKI_BIN", os.path.abspath(args.toki))
    import toki_harness as th
    from chat_corpus import TOOLS
    tools = TOOLS
    want = set(args.families.split(",")) if args.families else None
    results = {}
    print("| family | answer | next | answer tokens | rows back (of rows) | alone | toki "
          "(one at a time) | steps to the end of turn (one at a time) | batch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, vocab, pre, template in FAMILIES:
        if want and label not in want:
            continue
        fam = Family(th, os.path.abspath(args.toki), label, vocab, pre, template, args.rule)
        try:
            for kind, nxt in KINDS:
                r = fam.case(kind, nxt, tools)
                if "refused" in r and "tool call" in kind:
                    r2 = fam.case(kind, nxt, None)
                    r = r2 if "refused" not in r2 else r
                results[f"{label}/{kind}/{nxt}"] = r
                if "refused" in r:
                    print(f"| {label} | {kind} | {nxt} | {r['refused']} | | | | | |")
                    continue
                tod = (f"{r['today']} ({r['today_one_at_a_time']})" if "today" in r
                       else "server-rendered")
                alls = (f"{r['all_steps']} ({r['all_steps_one_at_a_time']})" if "today" in r
                        else "")
                intact = "" if r["prompt_intact"] else " (P not intact)"
                print(f"| {label} | {kind} | {nxt} | {r['answer_tokens']} | "
                      f"{r['back']} of {r['rows']}{intact} | {r['alone']} | {tod} | {alls} | "
                      f"{r.get('batch', '')} |", flush=True)
        finally:
            fam.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
