"""Benchmark a (the seed's table): one slot, 8,192 context, a ~1,372-token
prompt (a long system prompt and one user line) on a 24M generated model.
Evaluated tokens and streamed time to first token, cold (empty slot) vs hot
(the same prompt again), through toki in exact, grid and fast mode and
direct. Identity: every answer (text and every token's log-probability)
against its reference: toki's own uncached answer (`cache_prompt: false`
through toki exact) for exact mode, llama-server's uncached answer for the
others.

Then a short cached chat (under 512 tokens): its hot TTFT through toki
exact and fast next to llama-server alone answering it from its cache, on
three 1-slot servers side by side, requests alternating; the decode step
(llama-server's timings.predicted_per_token_ms) to judge "within one decode
step"."""
import random
import time

import bench_bc
import workload
from common import (Client, answer_of, harness, header_tokens, stream_chat_retrying, log,
                    median, pct, stop, table, tokenize_chat)

MODEL = ("bench", "24M", 32768)
TARGET_TOKENS = 1372
USER_LINE = "Please summarise the rules above in one sentence."
TARGETS = ("direct", "fast", "exact", "grid")
SHORT_SYSTEM = "You are a helpful assistant. Answer briefly and plainly."
SHORT_USER = "What is the capital of the small red house by the river, and why?"


def label(target):
    return {"direct": "llama-server alone"}.get(target, "toki " + target)


def make_prompt(client):
    """A system prompt grown sentence by sentence, then cut word by word, until
    the whole chat prompt is TARGET_TOKENS tokens (or the nearest below)."""
    rng = random.Random(5)
    words = []
    while len(" ".join(words)) < TARGET_TOKENS * workload.CHARS_PER_TOKEN * 1.6:
        words += workload.sentence(rng, 6, 18).split()

    def msgs(n):
        return [{"role": "system", "content": " ".join(words[:n])},
                {"role": "user", "content": USER_LINE}]
    lo, hi = 1, len(words)
    while lo < hi:  # the largest word count whose prompt fits
        mid = (lo + hi + 1) // 2
        if len(tokenize_chat(client, msgs(mid))) <= TARGET_TOKENS:
            lo = mid
        else:
            hi = mid - 1
    m = msgs(lo)
    return m, len(tokenize_chat(client, m))


def same(a, b):
    return a[0] == b[0] and a[1] == b[1]


def seed_shape(quick, model):
    th = harness()
    rounds = 1 if quick else 2
    hots = 2
    results = {}
    messages = n_tokens = None
    refs = {}
    for target in TARGETS:
        cold, hot = [], []
        for rnd in range(rounds):
            # Cold: a fresh server (and toki), so the slot is empty. (Slot erase
            # needs --slot-save-path on this llama-server build: 501 without.)
            ls = th.LlamaServer(model=model, slots=1, ctx=8192, ubatch=512, cache_ram=0,
                                name=f"bench-a-{target}")
            toki = None
            try:
                if target != "direct":
                    toki = th.Toki([ls], mode=target, ubatch=512, name=f"toki-bench-a-{target}")
                if messages is None:
                    messages, n_tokens = make_prompt(Client(ls.port))
                    log(f"benchmark a: prompt of {n_tokens} tokens")
                c = Client(toki.port if toki else ls.port)
                body = dict({"messages": messages, "temperature": 0, "max_tokens": 4},
                            **workload.LOGPROBS)
                cold.append(stream_chat_retrying(c, body))
                for _ in range(hots):
                    time.sleep(bench_bc.THINK_S)
                    hot.append(stream_chat_retrying(c, body))
                if rnd == rounds - 1 and target in ("direct", "exact"):
                    # The references: llama-server's uncached answer, and toki's
                    # own (exact mode's schedule from an empty slot).
                    time.sleep(bench_bc.THINK_S)
                    # Streamed, as the answers it is compared with: a non-streamed
                    # multi-step answer's numbers are rewritten (see the docs).
                    j = stream_chat_retrying(c, dict(body, cache_prompt=False))
                    if j["status"] != 200:
                        raise RuntimeError(f"benchmark a reference {target}: {j}")
                    refs[target] = {"answer": answer_of(j), "cache": j.get("cache"),
                                    "timings": j.get("timings")}
                    # The same, not streamed: does it carry the same numbers?
                    time.sleep(bench_bc.THINK_S)
                    st, ns = c.json("POST", "/v1/chat/completions",
                                    dict(body, cache_prompt=False))
                    refs[target]["not_streamed"] = answer_of(ns) if st == 200 else None
                stats = toki.stats() if toki else None
                c.close()
            finally:
                stop(toki, ls)
        for r in cold + hot:
            if r["status"] != 200 or not r["timings"]:
                raise RuntimeError(f"benchmark a {target}: {r}")
        results[target] = {
            "cold_evaluated": [r["timings"]["prompt_n"] for r in cold],
            "hot_evaluated": [r["timings"]["prompt_n"] for r in hot],
            "cold_ttft_ms": [r["ttft"] * 1000 for r in cold],
            "hot_ttft_ms": [r["ttft"] * 1000 for r in hot],
            "cold_cache": [r["cache"] for r in cold],
            "hot_cache": [r["cache"] for r in hot],
            "answers": [answer_of(r) for r in cold + hot],
            "toki_stats": stats,
            "failed_attempts": sum(len(r["failures"]) for r in cold + hot),
        }
        log(f"  a {target}: cold {results[target]['cold_evaluated']} "
            f"hot {results[target]['hot_evaluated']}")
    rows = []
    for target, r in results.items():
        ref = refs["exact" if target == "exact" else "direct"]["answer"]
        n_same = sum(same(a, ref) for a in r["answers"])
        r["identical_to_reference"] = n_same
        hc = r["hot_cache"][-1] or {}
        rows.append([label(target), round(median(r["cold_evaluated"])),
                     round(median(r["hot_evaluated"])),
                     f"{hc.get('steps', '')}/{hc.get('chunks', '')}" if hc.get("steps") else "",
                     median(r["cold_ttft_ms"]), median(r["hot_ttft_ms"]),
                     median(r["cold_ttft_ms"]) / median(r["hot_ttft_ms"]),
                     ("toki uncached" if target == "exact" else "llama-server uncached"),
                     f"{n_same}/{len(r['answers'])}", r["failed_attempts"]])
    t = table(["path", "evaluated cold", "evaluated hot", "hot steps/chunks", "TTFT cold ms",
               "TTFT hot ms", "cold/hot TTFT", "reference", "text + logprobs = reference",
               "failed attempts (retried)"], rows)
    ex_ref_eq_ls = same(refs["exact"]["answer"], refs["direct"]["answer"])
    ns = {t: refs[t].get("not_streamed") for t in refs}
    ns_same = {t: bool(ns[t]) and same(ns[t], refs[t]["answer"]) for t in refs}
    md = (f"1 slot, -c 8192, -ub 512, model {MODEL[1]} generated, prompt {n_tokens} tokens "
          f"(system + one user line), max_tokens 4, streamed, logprobs. Medians of {rounds} "
          f"cold (each on a fresh server) and {rounds * hots} hot requests. Identity: every "
          f"answer (cold and hot), text and every token's logprob, against the reference. "
          f"toki's uncached answer {'equals' if ex_ref_eq_ls else 'differs from'} "
          f"llama-server's uncached answer (another schedule). The same uncached request "
          f"not streamed carries the same text and logprobs: llama-server alone "
          f"{'yes' if ns_same['direct'] else 'no'}, through toki exact "
          f"{'yes' if ns_same['exact'] else 'no'} "
          f"({ns['exact'][1] if ns['exact'] else ''} vs {refs['exact']['answer'][1]}).\n\n{t}\n")
    return {"prompt_tokens": n_tokens, "results": results, "references": refs,
            "toki_uncached_equals_llama_uncached": ex_ref_eq_ls, "not_streamed_same": ns_same,
            "markdown": md}


def short_chat(quick, model):
    """A cached chat under 512 tokens, sent again and again: hot TTFT through
    toki exact and fast vs llama-server alone (each its own 1-slot server,
    requests alternating so the machine's noise falls on all alike)."""
    th = harness()
    n = 8 if quick else 30
    msgs = [{"role": "system", "content": SHORT_SYSTEM}, {"role": "user", "content": SHORT_USER}]
    servers, tokis, clients = {}, {}, {}
    recs = {t: [] for t in ("direct", "exact", "fast")}
    try:
        for t in recs:
            servers[t] = th.LlamaServer(model=model, slots=1, ctx=8192, ubatch=512, cache_ram=0,
                                        name=f"bench-a-short-{t}")
            if t != "direct":
                tokis[t] = th.Toki([servers[t]], mode=t, ubatch=512,
                                   name=f"toki-bench-a-short-{t}")
            clients[t] = Client((tokis.get(t) or servers[t]).port)
        lc = Client(servers["direct"].port)
        n_tokens = len(tokenize_chat(lc, msgs))
        header = header_tokens(lc, msgs)
        lc.close()
        body = dict({"messages": msgs, "temperature": 0, "max_tokens": 4}, **workload.LOGPROBS)
        for t in recs:  # warm: the first request fills each cache
            stream_chat_retrying(clients[t], body)
        for i in range(n):
            for t in (("direct", "exact", "fast") if i % 2 == 0 else ("fast", "exact", "direct")):
                time.sleep(bench_bc.THINK_S)
                recs[t].append(stream_chat_retrying(clients[t], body))
        refs = {}
        for t, c in (("direct", clients["direct"]), ("exact", clients["exact"])):
            time.sleep(bench_bc.THINK_S)
            refs[t] = answer_of(stream_chat_retrying(c, dict(body, cache_prompt=False)))
        stats = {t: tokis[t].stats() for t in tokis}
    finally:
        for c in clients.values():
            c.close()
        stop(*tokis.values(), *servers.values())
    out = {"prompt_tokens": n_tokens, "header_tokens": header, "n": n, "by_target": {}}
    rows = []
    step = median([r["timings"]["predicted_per_token_ms"] for r in recs["direct"]])
    direct_p50 = median([r["ttft"] * 1000 for r in recs["direct"]])
    for t, rs in recs.items():
        ttft = [r["ttft"] * 1000 for r in rs]
        ev = [r["timings"]["prompt_n"] for r in rs]
        ref = refs["exact" if t == "exact" else "direct"]
        ident = sum(same(answer_of(r), ref) for r in rs)
        st = stats.get(t) or {}
        out["by_target"][t] = {"ttft_ms": ttft, "evaluated": ev,
                               "decode_ms": [r["timings"]["predicted_per_token_ms"] for r in rs],
                               "cache": [r["cache"] for r in rs], "identical": ident,
                               "toki_stats": st}
        rows.append([label(t), f"{min(ev)}-{max(ev)}", median(ttft), pct(ttft, 90),
                     median(ttft) - direct_p50,
                     median([r["timings"]["predicted_per_token_ms"] for r in rs]),
                     f"{st.get('tail_cuts', '')}" if st else "",
                     ("toki uncached" if t == "exact" else "llama-server uncached"),
                     f"{ident}/{len(rs)}"])
    out["decode_step_ms"] = step
    out["exact_minus_direct_p50_ms"] = median(out["by_target"]["exact"]["ttft_ms"]) - direct_p50
    t = table(["path", "evaluated hot (min-max)", "TTFT hot p50 ms", "TTFT hot p90 ms",
               "p50 - llama-server alone ms", "decode step ms (predicted_per_token_ms, p50)",
               "tail cuts", "reference", "text + logprobs = reference"], rows)
    out["markdown"] = (f"A short cached chat: {n_tokens} tokens (system + user, header "
                       f"{header} tokens), max_tokens 4, streamed; each path its own 1-slot "
                       f"server (-c 8192, -ub 512), {n} hot requests each, alternating, "
                       f"{int(bench_bc.THINK_S * 1000)} ms apart. Decode step: llama-server "
                       f"alone's p50 {step:.2f} ms; exact's p50 TTFT is "
                       f"{out['exact_minus_direct_p50_ms']:+.2f} ms from llama-server alone's."
                       f"\n\n{t}\n")
    return out


def bench_a(quick):
    model = harness().generated_model(*MODEL)
    seed = seed_shape(quick, model)
    short = short_chat(quick, model)
    md = ("### a. One slot, cold vs hot\n\n" + seed["markdown"] +
          "\n#### a2. A short cached chat\n\n" + short["markdown"])
    return {"seed": seed, "short": short, "markdown": md}
