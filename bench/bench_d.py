"""Benchmark d (overhead): the latency toki adds to small cached requests, the
cost of its tokenization round trips, throughput with 64 concurrent streaming
clients, and the daemon's memory."""
import threading
import time

from common import Client, harness, log, median, pct, proc_status, stop, table

SYSTEM = "You are a helpful assistant who answers in short sentences."


def latency(quick):
    """Alternates direct and toki requests for the same short chat (a cache
    hit every time after the first), each over its own keep-alive
    connection, max_tokens 1, non-streamed."""
    th = harness()
    n = 200 if quick else 600
    ls = th.LlamaServer(slots=1, ctx=2048, cache_ram=0, name="bench-d-lat")
    toki = None
    try:
        toki = th.Toki([ls], mode="fast", name="toki-bench-d-lat")
        body = {"messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": "Say hi."}],
                "temperature": 0, "max_tokens": 1}
        cd, ct = Client(ls.port), Client(toki.port)
        for _ in range(20):  # warm up both paths and the slot
            cd.json("POST", "/v1/chat/completions", body)
            ct.json("POST", "/v1/chat/completions", body)
        direct, via, paired = [], [], []
        prompt_n = []
        for i in range(n):
            order = (cd, ct) if i % 2 == 0 else (ct, cd)
            t = {}
            for c in order:
                t0 = time.perf_counter()
                st, r = c.json("POST", "/v1/chat/completions", body)
                t[c] = time.perf_counter() - t0
                if st != 200:
                    raise RuntimeError(f"latency request failed: {st} {r}")
                prompt_n.append(r["timings"]["prompt_n"])
            direct.append(t[cd] * 1000)
            via.append(t[ct] * 1000)
            paired.append((t[ct] - t[cd]) * 1000)
        # toki's own round trips: /apply-template then /tokenize, straight to the server.
        tok = []
        for _ in range(n):
            t0 = time.perf_counter()
            st, r = cd.json("POST", "/apply-template", {"messages": body["messages"]})
            st2, r2 = cd.json("POST", "/tokenize", {"content": r["prompt"], "add_special": True,
                                                    "parse_special": True})
            tok.append((time.perf_counter() - t0) * 1000)
            if st != 200 or st2 != 200:
                raise RuntimeError("tokenization round trip failed")
        cd.close()
        ct.close()
        stats = toki.stats()
    finally:
        stop(toki, ls)
    res = {"n": n, "direct_ms": {"p50": median(direct), "p99": pct(direct, 99)},
           "toki_ms": {"p50": median(via), "p99": pct(via, 99)},
           "paired_added_ms": {"p50": median(paired), "p99": pct(paired, 99)},
           "tokenize_ms": {"p50": median(tok), "p99": pct(tok, 99)},
           "max_prompt_n": max(prompt_n), "toki_hits": stats.get("hits"),
           "toki_routed": stats.get("routed")}
    log(f"  d latency: direct p50 {res['direct_ms']['p50']:.3f} toki p50 "
        f"{res['toki_ms']['p50']:.3f} tokenize p50 {res['tokenize_ms']['p50']:.3f}")
    return res


def throughput(quick):
    """64 concurrent streaming clients, each sending a few short chats of its
    own; -np 4 on the server; direct vs toki fast mode."""
    th = harness()
    clients = 64
    per_client = 2 if quick else 4
    max_tokens = 32
    out = {}
    for target in ("direct", "fast"):
        ls = th.LlamaServer(slots=4, ctx=2048, cache_ram=0, name=f"bench-d-tp-{target}")
        toki = None
        try:
            if target == "fast":
                toki = th.Toki([ls], mode="fast", name="toki-bench-d-tp")
                mem_before = proc_status(toki.proc.pid)
            port = toki.port if toki else ls.port
            results = [[] for _ in range(clients)]
            errors = []
            start = threading.Barrier(clients + 1)

            def worker(k):
                c = Client(port)
                start.wait()
                for j in range(per_client):
                    body = {"messages": [{"role": "system", "content": SYSTEM},
                                         {"role": "user",
                                          "content": f"Client {k} asks question {j}: why?"}],
                            "temperature": 0, "max_tokens": max_tokens}
                    try:
                        r = c.stream_chat(body)
                    except Exception as e:  # counted, not fatal
                        errors.append(repr(e))
                        c.close()
                        continue
                    if r["status"] != 200 or not r["timings"]:
                        errors.append(str(r.get("error", r["status"])))
                        continue
                    results[k].append(r)
                c.close()

            threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
            for t in threads:
                t.start()
            start.wait()
            t0 = time.perf_counter()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            done = [r for rs in results for r in rs]
            toks = sum(r["timings"]["predicted_n"] for r in done)
            res = {"clients": clients, "requests": len(done), "errors": len(errors),
                   "error_samples": errors[:3], "wall_s": wall, "tokens_per_s": toks / wall,
                   "requests_per_s": len(done) / wall,
                   "ttft_p50_ms": median([r["ttft"] * 1000 for r in done]),
                   "ttft_p99_ms": pct([r["ttft"] * 1000 for r in done], 99)}
            if toki:
                res["toki_mem_before_kib"] = mem_before
                res["toki_mem_after_kib"] = proc_status(toki.proc.pid)
                res["toki_stats"] = {k: v for k, v in toki.stats().items() if k != "backends"}
            out[target] = res
            log(f"  d throughput {target}: {res['tokens_per_s']:.0f} tok/s, "
                f"{res['requests_per_s']:.1f} req/s, errors {len(errors)}")
        finally:
            stop(toki, ls)
    return out


def bench_d(quick):
    lat = latency(quick)
    tp = throughput(quick)
    t1 = table(["", "p50 ms", "p99 ms"], [
        ["llama-server alone", lat["direct_ms"]["p50"], lat["direct_ms"]["p99"]],
        ["through toki (fast)", lat["toki_ms"]["p50"], lat["toki_ms"]["p99"]],
        ["added by toki (paired difference)", lat["paired_added_ms"]["p50"],
         lat["paired_added_ms"]["p99"]],
        ["of which: /apply-template + /tokenize, direct", lat["tokenize_ms"]["p50"],
         lat["tokenize_ms"]["p99"]],
    ])
    rows = []
    for target, r in tp.items():
        rows.append([{"direct": "llama-server alone"}.get(target, "toki " + target),
                     r["requests"], r["errors"], r["wall_s"], r["tokens_per_s"],
                     r["requests_per_s"], r["ttft_p50_ms"], r["ttft_p99_ms"]])
    t2 = table(["path", "requests", "errors", "wall s", "tokens/s", "requests/s",
                "TTFT p50 ms", "TTFT p99 ms"], rows)
    f = tp["fast"]
    mb, ma = f["toki_mem_before_kib"], f["toki_mem_after_kib"]
    mem = (f"toki RSS before the throughput run {mb.get('VmRSS', 0) / 1024:.1f} MiB, after "
           f"{ma.get('VmRSS', 0) / 1024:.1f} MiB, peak (VmHWM) {ma.get('VmHWM', 0) / 1024:.1f} MiB.")
    md = (f"### d. Overhead\n\nLatency: stories260K, 1 slot, the same short chat (a cache hit), "
          f"max_tokens 1, {lat['n']} requests each way, alternating, keep-alive.\n\n{t1}\n\n"
          f"Throughput: stories260K, -np 4, {tp['fast']['clients']} concurrent streaming "
          f"clients, max_tokens 32.\n\n{t2}\n\n{mem}\n")
    return {"latency": lat, "throughput": tp, "markdown": md}
