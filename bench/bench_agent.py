"""Benchmarks g, h and i: what an agent does that a replay does not.

  g  cold cost of chunking: a cold ~8k-token, ~40-message agent prompt, TTFT
     through toki exact (its prefill steps) vs llama-server uncached vs toki
     fast, side by side (three 1-slot servers, requests alternating), medians
  h  concurrency: 4 agent sessions at once (threads, each its own multi-turn
     conversation) on one -np 4 backend: llama-server alone vs toki fast vs
     toki exact; generated tokens/s, TTFT p50/p95, evaluated; every answer
     against its uncached reference
  i  interrupt + resend (issue 14): a turn streamed and cancelled by the
     client during generation, then sent again; a turn cancelled during its
     prefill, then sent again: evaluated tokens of the resends, llama-server
     alone vs toki fast vs toki exact"""
import json
import random
import subprocess
import threading
import time

import bench_bc
import workload
from common import (Client, answer_of, harness, log, median, pct, stop, stream_chat_cancel,
                    stream_chat_retrying, table, tokenize_chat, wait_idle)

MODEL_24M = ("bench", "24M", 32768)
MODEL_4M = ("bench", "4M", 32768)
G_MODEL = MODEL_24M  # run.py --g-model


def label(target):
    return {"direct": "llama-server alone"}.get(target, "toki " + target)


def same(a, b):
    return a[0] == b[0] and a[1] == b[1]


def agent_prompt(seed, n_messages, tokens, nonce=""):
    """An agent-like chat: a system prompt (tools and rules, ~15% of the
    tokens), then user / assistant / tool-output turns of varied sizes
    (tool outputs as user messages, as agents that flatten them send), the
    last one a user message. About `tokens` tokens in all."""
    rng = random.Random(seed)
    kinds = []
    for i in range(n_messages - 1):
        kinds.append(("user", "assistant", "tool", "assistant")[i % 4])
    if kinds[-1] == "assistant":
        kinds[-1] = "user"
    weights = {"user": (0.3, 1.5), "assistant": (0.2, 2.0), "tool": (0.5, 4.0)}
    raw = [rng.uniform(*weights[k]) for k in kinds]
    budget = tokens * 0.85
    sizes = [max(8, int(budget * w / sum(raw))) for w in raw]
    msgs = [{"role": "system", "content": f"{nonce}You are a coding agent with tools: read, "
             "write, edit, search, run. Rules follow. " +
             workload.text_of_tokens(rng, int(tokens * 0.15))}]
    for k, n in zip(kinds, sizes):
        text = workload.text_of_tokens(rng, n)
        if k == "tool":
            msgs.append({"role": "user", "content": "Tool output (run):\n" + text})
        elif k == "assistant":
            msgs.append({"role": "assistant", "content": "I will run the tool. " + text})
        else:
            msgs.append({"role": "user", "content": text})
    return msgs


# ---- g ----

G_REPS = 5  # run.py --g-reps


def exact_steps(model, msgs):
    """The prompt tokens toki makes for a chat request and where exact mode's
    requests end when nothing is cached (chunk ends, tail splits, long
    chunks in parts; the last is the prompt's end), from `toki tokenize`."""
    th = harness()
    out = subprocess.run([th.TOKI_BIN, "tokenize", "--model", model, "--chat", "--schedule",
                          "--ubatch", "512"],
                         input=json.dumps({"messages": msgs}), capture_output=True, text=True,
                         check=True)
    j = json.loads(out.stdout)
    return j["tokens"], j["steps"]


def prefill_in_steps(client, toks, ends):
    """Evaluates toks from an empty slot in one request per step (n_predict
    0, as toki's prefill steps) ending at ends[:-1], and a last one to
    ends[-1] == len(toks) that generates a token; checks that every step
    reused the one before. Returns the time to that token and the server's
    prompt time summed."""
    t0 = time.perf_counter()
    prompt_ms, prev = 0.0, 0
    for i, end in enumerate(ends):
        st, r = client.json("POST", "/completion",
                            {"prompt": toks[:end], "n_predict": 1 if end == len(toks) else 0,
                             "cache_prompt": i > 0, "temperature": 0})
        if st != 200 or r["timings"]["cache_n"] != prev or r["timings"]["prompt_n"] != end - prev:
            raise RuntimeError(f"g steps: {st} {r.get('timings') if st == 200 else r}")
        prompt_ms += r["timings"]["prompt_ms"]
        prev = end
    return {"ttft_ms": (time.perf_counter() - t0) * 1000, "prompt_n": len(toks), "cache_n": 0,
            "prompt_ms": prompt_ms, "cache": {"steps": len(ends), "chunks": None},
            "route": None}


def settle(toki, server_port, timeout=60):
    """Waits until toki has no slot busy (an answer's tail cut is done) and
    the server has none processing: the next path starts on a quiet
    server."""
    t0 = time.perf_counter()
    while any(sl["busy"] for b in toki.stats()["backends"] for sl in b["slots"]):
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError("g: toki's slot stayed busy")
        time.sleep(0.02)
    wait_idle(server_port, timeout)


def bench_g(quick):
    th = harness()
    model = th.generated_model(*G_MODEL)
    n_msgs, n_tok, ctx = (12, 2000, 4096) if quick else (40, 8000, 10240)
    reps = 2 if quick else G_REPS
    # Every path runs on one 1-slot llama-server, one request at a time, so
    # that no path gains from a faster process or a better placed one (apart
    # they differed by up to 10%). Two rows without toki: llama-server fed
    # exact mode's steps itself ("steps"), and the same prompt in steps of
    # 512 tokens, its own micro-batch grid ("steps512"). They tell the cost
    # of the schedule on the backend from toki's hops, and the cost of the
    # number of requests from that of the micro-batches. Each path begins
    # from an empty slot, on the same prompt as the others in its
    # repetition. This machine's speed drifts by 10-20% over minutes, so the
    # target's pair runs back to back in ABBA order (direct, exact, exact,
    # direct; the next repetition the other way round), which cancels a
    # steady drift: its ratio is the sum of exact's two over the sum of
    # direct's two. The other paths follow, once each, in rotating order,
    # against the mean of their repetition's direct runs.
    order = ("direct", "exact", "fast", "steps", "steps512")
    others = order[2:]
    server = th.LlamaServer(model=model, slots=1, ctx=ctx, ubatch=512, cache_ram=0,
                            name="bench-g")
    tokis, clients = {}, {}
    recs = {t: [] for t in order}
    try:
        for t in ("exact", "fast"):
            tokis[t] = th.Toki([server], mode=t, ubatch=512, name=f"toki-bench-g-{t}")
        for t in order:
            clients[t] = Client((tokis.get(t) or server).port)
        n_tokens = []
        for rep in range(reps):
            # A new first line each repetition: nothing of it is in any cache.
            msgs = agent_prompt(31, n_msgs, n_tok, nonce=f"Run {rep}: {random.random():.6f}. ")
            toks, ends = exact_steps(model, msgs)
            n_tokens.append(len(toks))
            body = {"messages": msgs, "temperature": 0, "max_tokens": 2}
            pair = ("direct", "exact") if rep % 2 == 0 else ("exact", "direct")
            k = rep % len(others)
            for t in pair + pair[::-1] + others[k:] + others[:k]:
                # The same prompt for every path: the run before left it in
                # the slot, so a tiny prompt replaces it (erasing needs
                # --slot-save-path, which would have toki save slots). A
                # toki path sends it through its toki, which then knows what
                # the slot holds.
                if t in tokis:
                    st, r = clients[t].json("POST", "/v1/chat/completions",
                                            {"messages": [{"role": "user", "content": "x"}],
                                             "max_tokens": 1, "cache_prompt": False})
                    settle(tokis[t], server.port)
                else:
                    st, r = clients[t].json("POST", "/completion",
                                            {"prompt": toks[:1], "n_predict": 0,
                                             "cache_prompt": False})
                if st != 200:
                    raise RuntimeError(f"g: clearing the slot: {st} {r}")
                time.sleep(bench_bc.THINK_S)
                if t.startswith("steps"):
                    e = ends if t == "steps" else list(range(512, len(toks), 512)) + [len(toks)]
                    r = prefill_in_steps(clients[t], toks, e)
                    recs[t].append(r)
                    log(f"  g rep {rep} {t}: {len(toks)} tokens, {r['ttft_ms']:.0f} ms, "
                        f"{len(e)} requests")
                    continue
                b = dict(body, cache_prompt=False) if t == "direct" else body
                r = stream_chat_retrying(clients[t], b)
                if r["status"] != 200 or not r["timings"]:
                    raise RuntimeError(f"g {t}: {r}")
                if not len(toks) - 16 < r["timings"]["prompt_n"] <= len(toks):
                    raise RuntimeError(f"g {t}: not one cold evaluation, {r['timings']}")
                if t in tokis:
                    settle(tokis[t], server.port)
                recs[t].append({"ttft_ms": r["ttft"] * 1000, "prompt_n": r["timings"]["prompt_n"],
                                "cache_n": r["timings"]["cache_n"],
                                "prompt_ms": r["timings"].get("prompt_ms"),
                                "cache": r["cache"], "route": r["route"]})
                log(f"  g rep {rep} {t}: {n_tokens[-1]} tokens, ttft {r['ttft'] * 1000:.0f} ms, "
                    f"evaluated {r['timings']['prompt_n']}, steps "
                    f"{(r['cache'] or {}).get('steps', '-')}")
        stats = {t: tokis[t].stats() for t in tokis}
    finally:
        for c in clients.values():
            c.close()
        stop(*tokis.values(), server)
    base = median([r["ttft_ms"] for r in recs["direct"]])

    def paired(t):
        """This path's TTFT over llama-server's in the same repetition (its
        two runs each for exact, the mean of direct's two for the others)."""
        d = [recs["direct"][i]["ttft_ms"] + recs["direct"][i + 1]["ttft_ms"]
             for i in range(0, len(recs["direct"]), 2)]
        if t == "direct":
            return [1.0] * len(d)
        if t == "exact":
            return [(recs[t][2 * i]["ttft_ms"] + recs[t][2 * i + 1]["ttft_ms"]) / d[i]
                    for i in range(len(d))]
        return [2 * r["ttft_ms"] / d[i] for i, r in enumerate(recs[t])]

    rows = []
    names = {"direct": "llama-server alone (cache_prompt false)",
             "steps": "llama-server alone, fed exact's steps",
             "steps512": "llama-server alone, in steps of 512 tokens"}
    for t in order:
        rs = recs[t]
        ttft = [r["ttft_ms"] for r in rs]
        steps = [(r["cache"] or {}).get("steps") for r in rs]
        pr = paired(t)
        rows.append([names.get(t) or label(t) + " (cold)",
                     f"{min(r['prompt_n'] for r in rs)}-{max(r['prompt_n'] for r in rs)}",
                     f"{steps[0]}" if steps[0] else "1",
                     " / ".join(f"{x:.0f}" for x in ttft), median(ttft),
                     median(ttft) / base, median(pr), f"{min(pr):.3f}-{max(pr):.3f}",
                     median([r["prompt_ms"] for r in rs if r["prompt_ms"] is not None])])
    t = table(["path", "evaluated", "requests", "TTFT ms, each run", "TTFT median ms",
               "median / llama-server's", "median of paired ratios", "paired range",
               "server prompt_ms median"], rows)
    ratio = median(paired("exact"))
    md = (f"### g. Cold cost of chunking\n\nAn agent-like prompt: system + {n_msgs - 1} "
          f"user / assistant / tool-output messages of varied sizes, {min(n_tokens)}-"
          f"{max(n_tokens)} tokens (a new first line each repetition, so nothing is cached); "
          f"model {G_MODEL[1]} generated, -ub 512, every path on one 1-slot server (-c {ctx}), "
          f"one request at a time, {reps} repetitions; in each, llama-server alone and toki "
          f"exact twice, back to back in ABBA order, then the other paths once each. A paired "
          f"ratio is a path's TTFT over llama-server's in the same repetition (exact: its two "
          f"over llama-server's two; the others: over the mean of llama-server's two). "
          f"max_tokens 2, streamed; the step rows' time is to the end of a 1-token "
          f"/completion after their prefills, not streamed. "
          f"Exact / llama-server uncached, median of paired ratios: **{ratio:.3f}**.\n\n{t}\n")
    return {"prompt_tokens": n_tokens, "records": recs, "toki_stats": stats,
            "exact_over_direct": ratio,
            "fast_over_direct": median(paired("fast")),
            "markdown": md}


# ---- h ----

def bench_h(quick):
    th = harness()
    model = th.generated_model(*MODEL_4M)
    sessions, turns, sys_tok, ctx = (4, 3, 500, 4096) if quick else (4, 5, 1200, 6144)
    max_tokens = 32
    results = {}
    for target in ("direct", "fast", "exact"):
        ls = th.LlamaServer(model=model, slots=4, ctx=ctx, ubatch=512, cache_ram=0,
                            name=f"bench-h-{target}")
        toki = None
        try:
            if target != "direct":
                toki = th.Toki([ls], mode=target, ubatch=512, name=f"toki-bench-h-{target}")
            port = (toki or ls).port
            recs = []
            lock = threading.Lock()
            errors = []

            def session(s):
                rng = random.Random(1000 + s)
                c = Client(port)
                msgs = [{"role": "system", "content": f"Session {s}. " +
                         workload.text_of_tokens(rng, sys_tok + 150 * s)}]
                try:
                    for turn in range(turns):
                        if turn:
                            time.sleep(bench_bc.THINK_S)
                        msgs = msgs + [{"role": "user", "content": " ".join(
                            workload.sentence(rng) for _ in range(rng.randint(2, 8)))}]
                        body = dict({"messages": msgs, "temperature": 0,
                                     "max_tokens": max_tokens}, **workload.LOGPROBS)
                        t0 = time.perf_counter()
                        r = stream_chat_retrying(c, body)
                        if r["status"] != 200 or not r["timings"]:
                            raise RuntimeError(f"h {target} session {s} turn {turn}: {r}")
                        with lock:
                            recs.append({"session": s, "turn": turn, "t0": t0,
                                         "t1": time.perf_counter(), "ttft": r["ttft"],
                                         "prompt_n": r["timings"]["prompt_n"],
                                         "predicted_n": r["timings"]["predicted_n"],
                                         "answer": answer_of(r), "body": body,
                                         "cache": r["cache"], "failures": r["failures"]})
                        msgs = msgs + [{"role": "assistant", "content": r["text"]}]
                except Exception as e:  # reported after the join
                    errors.append(repr(e))
                finally:
                    c.close()

            threads = [threading.Thread(target=session, args=(s,)) for s in range(sessions)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            if errors:
                raise RuntimeError("; ".join(errors))
            stats = toki.stats() if toki else None
        finally:
            stop(toki, ls)
        results[target] = {"records": recs, "wall_s": wall, "toki_stats": stats}
        log(f"  h {target}: wall {wall:.1f} s, evaluated {sum(r['prompt_n'] for r in recs)}")
    # References, one request at a time on a 1-slot server: toki's own
    # uncached answer for exact, llama-server's for the others.
    ls = th.LlamaServer(model=model, slots=1, ctx=ctx, ubatch=512, cache_ram=0, name="bench-h-ref")
    ls2 = th.LlamaServer(model=model, slots=1, ctx=ctx, ubatch=512, cache_ram=0,
                         name="bench-h-ref-toki")
    toki = None
    try:
        toki = th.Toki([ls2], mode="exact", ubatch=512, name="toki-bench-h-ref")
        cl, ct = Client(ls.port), Client(toki.port)
        for target, res in results.items():
            c = ct if target == "exact" else cl
            n = 0
            for r in res["records"]:
                j = stream_chat_retrying(c, dict(r["body"], cache_prompt=False))
                if j["status"] != 200:
                    raise RuntimeError(f"h reference: {j}")
                r["identical"] = same(r["answer"], answer_of(j))
                n += r["identical"]
                if target == "exact" and not r["identical"]:
                    log(f"  h exact: session {r['session']} turn {r['turn']} differs from "
                        f"toki's uncached answer: cache {r['cache']}; reference cache "
                        f"{j.get('cache')}")
            res["identical"] = n
        cl.close()
        ct.close()
    finally:
        stop(toki, ls, ls2)
    rows = []
    for target, res in results.items():
        rs = res["records"]
        gen = sum(r["predicted_n"] for r in rs)
        ttft = [r["ttft"] * 1000 for r in rs]
        rows.append([label(target), len(rs), gen, res["wall_s"], gen / res["wall_s"],
                     median(ttft), pct(ttft, 95), sum(r["prompt_n"] for r in rs),
                     ((res["toki_stats"] or {}).get("tail_cut_tokens") or ""),
                     "toki uncached" if target == "exact" else "llama-server uncached",
                     f"{res['identical']}/{len(rs)}"])
    t = table(["path", "requests", "generated tokens", "wall s", "generated tokens/s",
               "TTFT p50 ms", "TTFT p95 ms", "evaluated", "tail cut tokens", "reference",
               "text + logprobs = reference"], rows)
    for res in results.values():
        for r in res["records"]:
            r.pop("body", None)
    ratio = ((sum(r["predicted_n"] for r in results["exact"]["records"]) /
              results["exact"]["wall_s"]) /
             (sum(r["predicted_n"] for r in results["fast"]["records"]) /
              results["fast"]["wall_s"]))
    md = (f"### h. Concurrency: {sessions} agent sessions at once on one backend\n\n"
          f"{sessions} threads, each its own conversation ({turns} turns, its own system "
          f"prompt of ~{sys_tok}-{sys_tok + 150 * (sessions - 1)} tokens, the reply fed back, "
          f"{int(bench_bc.THINK_S * 1000)} ms between a session's turns), max_tokens "
          f"{max_tokens}, streamed; one llama-server -np {4} (model {MODEL_4M[1]} generated, "
          f"-ub 512, per-slot context {ctx}). Wall: first request to last answer, pauses "
          f"included. Identity: every answer replayed alone afterwards with "
          f"`cache_prompt: false` (exact through a fresh toki exact, the others on "
          f"llama-server). Exact / fast generated tokens/s: **{ratio:.2f}**.\n\n{t}\n")
    return {"results": results, "exact_over_fast_tps": ratio, "markdown": md}


# ---- i ----

def bench_i(quick):
    th = harness()
    model = th.generated_model(*MODEL_24M)
    sys_tok, new_tok = (600, 300) if quick else (1500, 500)
    results = {}
    rng = random.Random(77)
    system = "You are a coding agent. " + workload.text_of_tokens(rng, sys_tok)
    u1 = " ".join(workload.sentence(rng) for _ in range(3))
    u2 = " ".join(workload.sentence(rng) for _ in range(3))
    # Turn 3 brings three new messages (a user line and two tool outputs):
    # its prefill is long enough to cancel, and has chunk boundaries inside.
    u3 = [" ".join(workload.sentence(rng) for _ in range(2)),
          "Tool output (search):\n" + workload.text_of_tokens(rng, new_tok),
          "Tool output (read):\n" + workload.text_of_tokens(rng, new_tok)]
    refs = {}
    for target in ("direct", "fast", "exact"):
        ls = th.LlamaServer(model=model, slots=1, ctx=8192, ubatch=512, cache_ram=0,
                            name=f"bench-i-{target}")
        toki = None
        try:
            if target != "direct":
                toki = th.Toki([ls], mode=target, ubatch=512, name=f"toki-bench-i-{target}")
            port = (toki or ls).port
            c = Client(port)
            lc = Client(ls.port)

            def body(msgs, n=16):
                return dict({"messages": msgs, "temperature": 0, "max_tokens": n},
                            **workload.LOGPROBS)
            steps = []
            m1 = [{"role": "system", "content": system}, {"role": "user", "content": u1}]
            r1 = stream_chat_retrying(c, body(m1))
            steps.append(("turn 1", m1, r1))
            m2 = m1 + [{"role": "assistant", "content": r1["text"]},
                       {"role": "user", "content": u2}]
            time.sleep(bench_bc.THINK_S)
            cancel_gen = stream_chat_cancel(port, body(m2, 64), after_tokens=3)
            wait_idle(ls.port)
            time.sleep(bench_bc.THINK_S)
            r2 = stream_chat_retrying(c, body(m2))
            steps.append(("turn 2 resent after a cancel during generation", m2, r2))
            m3 = m2 + [{"role": "assistant", "content": r2["text"]}] + \
                [{"role": "user", "content": u} for u in u3]
            n1, n2, n3 = (len(tokenize_chat(lc, m)) for m in (m1, m2, m3))
            # Cancel at about 35% of turn 3's new tokens' expected prefill
            # (the rate from turn 1), before any token comes.
            rate = r1["timings"]["prompt_ms"] / max(1, r1["timings"]["prompt_n"])
            after_s = 0.35 * rate * (n3 - n2) / 1000.0
            time.sleep(bench_bc.THINK_S)
            cancel_pre = stream_chat_cancel(port, body(m3, 64), after_s=after_s)
            wait_idle(ls.port)
            time.sleep(bench_bc.THINK_S)
            r3 = stream_chat_retrying(c, body(m3))
            steps.append(("turn 3 resent after a cancel during prefill", m3, r3))
            if target in ("direct", "exact"):
                for name, m, _ in steps:
                    time.sleep(bench_bc.THINK_S)
                    j = stream_chat_retrying(c, dict(body(m), cache_prompt=False))
                    refs.setdefault(target, {})[name] = answer_of(j)
            c.close()
            lc.close()
            stats = toki.stats() if toki else None
            lines = [l for l in (toki.log_text() if toki else ls.log_text()).splitlines()
                     if any(k in l for k in ("route=", "cancel", "keeps", "went away"))] \
                if toki else []
        finally:
            stop(toki, ls)
        ntok = {"turn 1": n1, "turn 2": n2, "turn 3": n3}
        results[target] = {"steps": [(n, ntok[n[:6]], r) for n, m, r in steps],
                           "cancel_gen": cancel_gen, "cancel_pre": cancel_pre,
                           "prompt_tokens": {"turn2": n2, "turn3": n3},
                           "cancel_pre_after_s": after_s, "toki_stats": stats, "toki_log": lines}
        log(f"  i {target}: resend after gen cancel evaluated {r2['timings']['prompt_n']}, "
            f"after prefill cancel {r3['timings']['prompt_n']} (cancel after "
            f"{cancel_pre['closed_at']:.2f} s, {cancel_pre['tokens']} tokens seen)")
    rows = []
    for target, res in results.items():
        ref = refs["exact" if target == "exact" else "direct"]
        for name, n, r in res["steps"]:
            cb = r["cache"] or {}
            cancel = {"turn 2": res["cancel_gen"], "turn 3": res["cancel_pre"]}.get(name[:6])
            rows.append([label(target), name, n,
                         (f"closed after {cancel['tokens']} tokens, {cancel['closed_at']:.2f} s"
                          if cancel else ""),
                         r["timings"]["prompt_n"], r["timings"]["cache_n"],
                         cb.get("route", ""), cb.get("steps", ""),
                         r["ttft"] * 1000, "yes" if same(answer_of(r), ref[name]) else "no"])
    t = table(["path", "request", "prompt tokens", "the cancelled request before it",
               "evaluated", "cached", "route", "steps", "TTFT ms",
               "text + logprobs = uncached reference"], rows)
    md = (f"### i. Interrupt and resend (issue 14)\n\nOne slot, -c 8192, -ub 512, model "
          f"{MODEL_24M[1]} generated. Turn 1 (a ~{sys_tok}-token system prompt and a user "
          f"line), then turn 2 streamed (max_tokens 64) and the connection closed by the "
          f"client after 3 tokens, then turn 2 sent again; then turn 3 (three new messages, "
          f"~{2 * new_tok} tokens) streamed and closed during its prefill (at ~35% of the "
          f"expected prefill time), then sent again. \"Evaluated\" of a resend is what the "
          f"cancel left unusable. The reference for identity: toki's uncached answer for "
          f"exact, llama-server's for the others.\n\n{t}\n")
    for res in results.values():
        res["steps"] = [(n, k, {x: r[x] for x in ("timings", "cache", "ttft", "route", "text")})
                        for n, k, r in res["steps"]]
    return {"results": results, "markdown": md}
