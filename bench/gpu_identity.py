#!/usr/bin/env python3
"""Identity on a GPU backend, the workload of issue 23, side by side with
the CPU backend and llama-server alone; and what the Vulkan remedy costs.

Workload: 6 turns with a system prompt of about 635 tokens in 4 paragraphs,
max_tokens 24, temperature 0, top_logprobs 1, ignore_eos. Each turn is sent,
sent again, then sent with cache_prompt: false (through toki: the same
schedule from an empty slot; alone: llama-server's own uncached run). A turn
counts two comparisons, the send and the resend against the uncached answer,
text and every logprob. "2 interleaved": two such conversations, turn by
turn, on a server with 2 slots.

Backends: ggml's CPU backend; ggml-vulkan on lavapipe at its defaults; and
ggml-vulkan with GGML_VK_DISABLE_COOPMAT=1 (docs/exact.md, "GPU backends").
The cost table runs llama-server alone on a cold 1,024-token prompt, -ub
512, with and without the remedy, ABAB.

  python3 bench/gpu_identity.py [--toki build/toki] [--quick] [--cost-reps 5]
Prints markdown tables and the self-test's verdict and time per backend."""
import argparse
import os
import random
import signal
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

WORDS = ("the cat dog sun moon tree bird river house small big red blue green old new "
         "happy sad runs jumps sings walks looks finds makes takes gives tells asks likes "
         "and but then so because when where why how what who").split()


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def conversation(seed, turns):
    rng = random.Random(seed)
    paras = [" ".join(sentence(rng, 12) for _ in range(10)) for _ in range(4)]
    users = [" ".join(sentence(rng, 10) for _ in range(2)) for _ in range(turns)]
    return "\n\n".join(paras), users


def answer(r):
    c = r["choices"][0]
    probs = [(p["token"], p["logprob"], [(q["token"], q["logprob"]) for q in p["top_logprobs"]])
             for p in (c.get("logprobs") or {}).get("content") or []]
    return c["message"]["content"], probs


def chat(th, port, msgs, **kw):
    b = {"messages": msgs, "temperature": 0, "max_tokens": 24, "logprobs": True,
         "top_logprobs": 1, "ignore_eos": True}
    b.update(kw)
    st, r = th.request(port, "POST", "/v1/chat/completions", b, timeout=600)
    if st != 200:
        raise RuntimeError(f"{st}: {r}")
    return r


def run_conversations(th, port, convs, turns):
    """(identical, comparisons) over the conversations interleaved."""
    hist = [[{"role": "system", "content": s}] for s, _ in convs]
    same = total = 0
    for t in range(turns):
        for i, (_, users) in enumerate(convs):
            msgs = hist[i] + [{"role": "user", "content": users[t]}]
            first = answer(chat(th, port, msgs))
            again = answer(chat(th, port, msgs))
            raw = answer(chat(th, port, msgs, cache_prompt=False))
            same += (first == raw) + (again == raw)
            total += 2
            hist[i] = msgs + [{"role": "assistant", "content": raw[0]}]
    return same, total


def backend_setups():
    return (("CPU", "cpu", None), ("Vulkan (lavapipe), defaults", "vulkan", None),
            ("Vulkan (lavapipe), GGML_VK_DISABLE_COOPMAT=1", "vulkan",
             {"GGML_VK_DISABLE_COOPMAT": "1"}))


def identity(th, models, turns):
    rows = []
    for label, backend, env in backend_setups():
        for mname, model in models:
            cells = []
            selftest = None
            for what in ("toki1", "toki2", "alone"):
                llama = th.LlamaServer(model=model, slots=2, ctx=4096, backend=backend, env=env)
                toki = None
                try:
                    port = llama.port
                    if what != "alone":
                        toki = th.Toki([llama], mode="exact")
                        port = toki.port
                        ex = toki.stats()["backends"][0]["exact"]
                        selftest = f"{ex['selftest']} ({ex['seconds']:.1f} s)"
                    convs = [conversation(s, turns) for s in ((1,) if what != "toki2" else (1, 2))]
                    same, total = run_conversations(th, port, convs, turns)
                    cells.append(f"{same}/{total}")
                finally:
                    if toki:
                        toki.kill(signal.SIGTERM)
                    llama.kill()
            rows.append((label, mname, *cells, selftest))
            print(rows[-1], flush=True)
    return rows


def cost(th, model, reps):
    """llama-server alone on ggml-vulkan: a cold 1,024-token prompt's
    prompt_ms with and without the remedy, alternating."""
    rng = random.Random(9)
    text = " ".join(sentence(rng, 12) for _ in range(200))
    servers = {
        "defaults": th.LlamaServer(model=model, slots=1, ctx=4096, backend="vulkan"),
        "GGML_VK_DISABLE_COOPMAT=1": th.LlamaServer(model=model, slots=1, ctx=4096,
                                                    backend="vulkan",
                                                    env={"GGML_VK_DISABLE_COOPMAT": "1"}),
    }
    try:
        st, tok = th.request(servers["defaults"].port, "POST", "/tokenize", {"content": text},
                             auth=False)
        prompt = tok["tokens"][:1024]
        ms = {k: [] for k in servers}
        for rep in range(reps + 1):
            order = list(servers) if rep % 2 == 0 else list(reversed(servers))
            for k in order:
                st, r = th.request(servers[k].port, "POST", "/completion",
                                   {"prompt": prompt, "n_predict": 1, "cache_prompt": False},
                                   auth=False, timeout=600)
                if rep:  # the first round warms up (shader compiles)
                    ms[k].append(r["timings"]["prompt_ms"])
        return {k: statistics.median(v) for k, v in ms.items()}, len(prompt)
    finally:
        for s in servers.values():
            s.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--toki", default=os.path.join(common.SOURCE_DIR, "build", "toki"))
    ap.add_argument("--quick", action="store_true", help="3 turns instead of 6")
    ap.add_argument("--cost-reps", type=int, default=5)
    args = ap.parse_args()
    common.use_toki_binary(args.toki)
    th = common.harness()
    models = (("random 4M", th.generated_model("identity", params="4M", ctx=8192)),
              ("stories260K", th.test_model()))
    t0 = time.time()
    rows = identity(th, models, 3 if args.quick else 6)
    print("\n| backend | model | toki exact, 1 conversation | toki exact, 2 interleaved | "
          "llama-server alone, cached vs uncached | self-test |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    big = th.generated_model("bench", params="24M", ctx=8192)
    for mname, model in (("random 4M", models[0][1]), ("random 24M", big)):
        med, n = cost(th, model, args.cost_reps)
        a, b = med["defaults"], med["GGML_VK_DISABLE_COOPMAT=1"]
        print(f"\ncost, {mname}, {n}-token cold prompt on lavapipe, median of {args.cost_reps}: "
              f"defaults {a:.0f} ms ({n / a * 1000:.0f} tok/s), GGML_VK_DISABLE_COOPMAT=1 "
              f"{b:.0f} ms ({n / b * 1000:.0f} tok/s), ratio {b / a:.2f}")
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
