"""Benchmark d (overhead): the latency toki adds to small cached requests, the
cost of its tokenization round trips, throughput with 64 concurrent streaming
clients, and the daemon's memory."""
import asyncio
import time

from common import Client, async_stream_chat, harness, log, median, pct, proc_status, stop, table

REQUEST_TIMEOUT = 60  # seconds; a sequential request stuck longer counts as an error
RUN_DEADLINE = 240  # seconds; a throughput run's requests still open then count as failed

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


def back_to_back(quick):
    """Streamed requests sent one after another with no pause, over one
    keep-alive client connection, direct and through toki: how many fail.
    llama-server closes its connection after every streamed response."""
    th = harness()
    n = 40 if quick else 100
    out = {}
    ls = th.LlamaServer(slots=1, ctx=2048, cache_ram=0, name="bench-d-b2b")
    toki = None
    try:
        toki = th.Toki([ls], mode="fast", name="toki-bench-d-b2b")
        for target, port in (("direct", ls.port), ("fast", toki.port)):
            c = Client(port, timeout=REQUEST_TIMEOUT)
            ok = failed = 0
            samples = []
            for i in range(n):
                body = {"messages": [{"role": "system", "content": SYSTEM},
                                     {"role": "user", "content": f"Question {i % 5}: why?"}],
                        "temperature": 0, "max_tokens": 8}
                try:
                    r = c.stream_chat(body)
                    good = r["status"] == 200 and r["timings"]
                except Exception as e:
                    r, good = {"status": repr(e)}, False
                    c.close()
                if good:
                    ok += 1
                else:
                    failed += 1
                    if len(samples) < 3:
                        samples.append(f"{r['status']} {r.get('error', '')[:100]}")
            c.close()
            out[target] = {"requests": n, "ok": ok, "failed": failed, "samples": samples}
        out["toki_log"] = [l for l in toki.log_text().splitlines()
                           if " warn" in l or " error" in l][:10]
    finally:
        stop(toki, ls)
    log(f"  d back-to-back: direct failed {out['direct']['failed']}/{n}, "
        f"toki failed {out['fast']['failed']}/{n}")
    return out


def throughput(quick, threads_http=None, clients=64):
    """Concurrent streaming clients (64 by default; asyncio, one keep-alive
    connection each), each sending a few short chats of its own; -np 4 on the
    server; direct vs toki fast mode."""
    th = harness()

    per_client = 2 if quick else 4
    max_tokens = 32
    out = {}
    extra = ["--threads-http", str(threads_http)] if threads_http else []
    for target in ("direct", "fast"):
        ls = th.LlamaServer(slots=4, ctx=2048, cache_ram=0, extra=extra,
                            name=f"bench-d-tp-{target}-th{threads_http or 'default'}")
        toki = None
        try:
            if target == "fast":
                toki = th.Toki([ls], mode="fast", name="toki-bench-d-tp")
                mem_before = proc_status(toki.proc.pid)
            port = toki.port if toki else ls.port
            results = [[] for _ in range(clients)]
            errors = []
            reconnects = [0]

            async def worker(k):
                conn = {}
                for j in range(per_client):
                    body = {"messages": [{"role": "system", "content": SYSTEM},
                                         {"role": "user",
                                          "content": f"Client {k} asks question {j}: why?"}],
                            "temperature": 0, "max_tokens": max_tokens}
                    try:
                        r = await async_stream_chat(conn, port, body, RUN_DEADLINE)
                    except Exception as e:  # counted, not fatal
                        errors.append(repr(e))
                        continue
                    if r["status"] != 200 or not r["timings"]:
                        errors.append(str(r.get("error", r["status"])))
                        continue
                    r["done_at"] = time.perf_counter()
                    results[k].append(r)
                if conn.get("w") is not None:
                    conn["w"].close()
                reconnects[0] += conn.get("retries", 0)

            async def all_clients():
                try:
                    await asyncio.wait_for(
                        asyncio.gather(*(worker(k) for k in range(clients))), RUN_DEADLINE)
                except asyncio.TimeoutError:
                    pass

            t0 = time.perf_counter()
            asyncio.run(all_clients())
            wall = time.perf_counter() - t0
            unfinished = clients * per_client - sum(len(x) for x in results) - len(errors)
            errors += [f"still open after the {RUN_DEADLINE} s deadline"] * unfinished
            done = [r for rs in results for r in rs]
            toks = sum(r["timings"]["predicted_n"] for r in done)
            res = {"clients": clients, "per_client": per_client, "requests": len(done), "errors": len(errors),
                   "error_samples": errors[:3], "client_reconnects": reconnects[0], "wall_s": wall, "tokens_per_s": toks / wall,
                   "requests_per_s": len(done) / wall,
                   "last_success_s": max((r["done_at"] for r in done), default=t0) - t0,
                   "ttft_p50_ms": median([r["ttft"] * 1000 for r in done]),
                   "ttft_p99_ms": pct([r["ttft"] * 1000 for r in done], 99)}
            if toki:
                res["toki_mem_before_kib"] = mem_before
                res["toki_mem_after_kib"] = proc_status(toki.proc.pid)
                rc = toki.proc.poll()
                res["toki_exit"] = rc
                if rc is None:
                    res["toki_stats"] = {k: v for k, v in toki.stats().items()
                                         if k != "backends"}
                else:  # it died during the run: say how, and keep the log's last lines
                    res["toki_log_tail"] = toki.log_text().splitlines()[-8:]
                    log(f"  toki exited during the throughput run: {rc}")
            res["threads_http"] = threads_http or "default"
            out[target] = res
            log(f"  d throughput {target} (--threads-http {res['threads_http']}): {res['tokens_per_s']:.0f} tok/s, "
                f"{res['requests_per_s']:.1f} req/s, errors {len(errors)}")
        finally:
            stop(toki, ls)
    return out


def bench_d(quick):
    lat = latency(quick)
    b2b = back_to_back(quick)
    tp4 = throughput(quick, clients=4)
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
    for target, r in list(tp4.items()) + list(tp.items()):
        rows.append([{"direct": "llama-server alone"}.get(target, "toki " + target),
                     r["clients"], r["requests"], r["errors"], r["wall_s"], r["tokens_per_s"],
                     r["requests_per_s"], r["ttft_p50_ms"], r["ttft_p99_ms"]])
    t2 = table(["path", "clients", "requests ok", "failed", "wall s", "tokens/s", "requests/s",
                "TTFT p50 ms", "TTFT p99 ms"], rows)
    f = tp["fast"]
    mb, ma = f["toki_mem_before_kib"], f["toki_mem_after_kib"]
    if ma:
        mem = (f"toki RSS before the {f['clients']}-client run {mb.get('VmRSS', 0) / 1024:.1f} MiB, "
               f"after {ma.get('VmRSS', 0) / 1024:.1f} MiB, peak (VmHWM) "
               f"{ma.get('VmHWM', 0) / 1024:.1f} MiB.")
    else:
        mem = (f"toki RSS before the {f['clients']}-client run {mb.get('VmRSS', 0) / 1024:.1f} MiB "
               f"(peak {mb.get('VmHWM', 0) / 1024:.1f} MiB); none after: the process was gone.")
    for target, r in list(tp4.items()) + list(tp.items()):
        if r.get("toki_exit") is not None:
            mem += (f" With {r['clients']} clients toki DIED during the run (exit status "
                    f"{r['toki_exit']}; a negative number is the signal).")
        if r["errors"]:
            mem += (f" {target} with {r['clients']} clients: {r['errors']} requests failed "
                    f"(e.g. {r['error_samples'][:1]}); the last success came "
                    f"{r['last_success_s']:.1f} s into the run.")
    md = (f"### d. Overhead\n\nLatency: stories260K, 1 slot, the same short chat (a cache hit), "
          f"max_tokens 1, {lat['n']} requests each way, alternating, keep-alive.\n\n{t1}\n\n"
          f"Throughput: stories260K, -np 4, 4 and {tp['fast']['clients']} concurrent streaming "
          f"clients (asyncio, keep-alive, {tp['fast']['per_client']} requests each), max_tokens 32; a run "
          f"ends after {RUN_DEADLINE} s at most, requests still open then count as failed.\n\n{t2}\n\n{mem}\n")
    t3 = table(["path", "requests", "ok", "failed", "example failure"], [
        [{"direct": "llama-server alone"}.get(k, "toki " + k), v["requests"], v["ok"], v["failed"],
         (v["samples"] or [""])[0].replace("|", "/")] for k, v in b2b.items() if k != "toki_log"])
    md += (f"\nBack to back: streamed requests sent one after another on one keep-alive "
           f"connection, no pause (stories260K, 1 slot, max_tokens 8).\n\n{t3}\n")
    return {"latency": lat, "back_to_back": b2b, "throughput_4": tp4, "throughput": tp,
            "markdown": md}
