"""Benchmark d (overhead): the latency toki adds to small cached requests, the
cost of its tokenization round trips, throughput with 64 concurrent streaming
clients, and the daemon's memory."""
import asyncio
import time

from common import Client, async_stream_chat, harness, log, median, pct, proc_status, stop, table

REQUEST_TIMEOUT = 60  # seconds; a sequential request stuck longer counts as an error
RUN_DEADLINE = 240  # seconds; a throughput run's requests still open then count as failed

SYSTEM = "You are a helpful assistant who answers in short sentences."


def paired(cd, ct, body, n, on_toki=None):
    """n rounds, each a direct and a toki request for body, in alternating
    order; returns the two lists of milliseconds."""
    direct, via = [], []
    for i in range(n):
        t = {}
        for c in ((cd, ct) if i % 2 == 0 else (ct, cd)):
            t0 = time.perf_counter()
            st, r = c.json("POST", "/v1/chat/completions", body)
            t[c] = (time.perf_counter() - t0) * 1000
            if st != 200:
                raise RuntimeError(f"latency request failed: {st} {r}")
            if c is ct and on_toki:
                on_toki(r)
        direct.append(t[cd])
        via.append(t[ct])
    return direct, via


def latency(quick):
    """Direct requests alternating with requests through toki for the same
    short chat (a cache hit every time after the first), each over its own
    keep-alive connection, max_tokens 1, non-streamed: first with prompts
    made in toki (the default), then, with that daemon stopped, through
    toki --tokenize server. Each phase is side by side with direct."""
    th = harness()
    n = 200 if quick else 600
    ls = th.LlamaServer(slots=1, ctx=2048, cache_ram=0, name="bench-d-lat")
    toki = None
    body = {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": "Say hi."}],
            "temperature": 0, "max_tokens": 1}
    res = {"n": n}

    def pp(v):
        return {"p50": median(v), "p99": pct(v, 99)}
    try:
        cd = Client(ls.port)
        for phase, extra in (("local", []), ("server", ["--tokenize", "server"])):
            toki = th.Toki([ls], mode="fast", extra=extra, name=f"toki-bench-d-lat-{phase}")
            ct = Client(toki.port)
            for _ in range(20):  # warm up both paths and the slot
                cd.json("POST", "/v1/chat/completions", body)
                ct.json("POST", "/v1/chat/completions", body)
            seen = {"tokenize": [], "tokenized": set(), "prompt_n": []}

            def note(r):
                seen["tokenize"].append(r["cache"]["tokenize_ms"])
                seen["tokenized"].add(r["cache"]["tokenized"])
                seen["prompt_n"].append(r["timings"]["prompt_n"])
            direct, via = paired(cd, ct, body, n, note)
            stats = toki.stats()
            ct.close()
            stop(toki)
            toki = None
            res[phase] = {"direct_ms": pp(direct), "toki_ms": pp(via),
                          "paired_added_ms": pp([b - a for a, b in zip(direct, via)]),
                          "tokenize_ms": pp(seen["tokenize"]),
                          "tokenized": sorted(seen["tokenized"]),
                          "max_prompt_n": max(seen["prompt_n"]),
                          "toki_hits": stats.get("hits"), "toki_routed": stats.get("routed"),
                          "prompts": stats["backends"][0].get("prompts")}
        # The round trips --tokenize server makes: /apply-template then
        # /tokenize, straight to the server.
        rt = []
        for _ in range(n):
            t0 = time.perf_counter()
            st, r = cd.json("POST", "/apply-template", {"messages": body["messages"]})
            st2, r2 = cd.json("POST", "/tokenize", {"content": r["prompt"], "add_special": True,
                                                    "parse_special": True})
            rt.append((time.perf_counter() - t0) * 1000)
            if st != 200 or st2 != 200:
                raise RuntimeError("tokenization round trip failed")
        cd.close()
        res["round_trips_ms"] = pp(rt)
    finally:
        stop(toki, ls)
    log(f"  d latency: added p50 {res['local']['paired_added_ms']['p50']:.3f} ms (prompts in "
        f"toki), {res['server']['paired_added_ms']['p50']:.3f} ms (--tokenize server)")
    return res


WORDS = ("the of and to in is was for on that with as it at by from this be are or an not "
         "function return value error file test build run import class self data list string "
         "request server token cache slot prompt model agent code line parse write read").split()


def long_text(rng, n_words):
    lines, line = [], []
    for _ in range(n_words):
        line.append(rng.choice(WORDS))
        if len(line) == 12:
            lines.append(" ".join(line) + ".")
            line = []
    return "\n".join(lines + [" ".join(line)])


def tokenize_cost(quick):
    """What making a prompt costs, in toki and through the server, for a
    short chat and for one of about 30000 tokens: the Anthropic count_tokens
    route (template + tokenize, no generation), through toki with prompts
    made in toki and with --tokenize server, alternating. Cold: the long
    text differs every time (nothing in toki's fragment cache); warm: the
    same long history each time with a new short question at the end (an
    agent's next turn). toki's own time is the cache block's tokenize_ms
    and /toki/stats' local_ms / server_ms."""
    import random
    th = harness()
    reps = 5 if quick else 15
    models = [("stories260K (SentencePiece, 512 tokens)", th.test_model()),
              ("Qwen 3 vocabulary (BPE, 151k tokens)", th.tokenizer_model("qwen3", "qwen2"))]
    out = []
    for label, model in models:
        ls = th.LlamaServer(model=model, slots=1, ctx=2048, cache_ram=0, name="bench-d-tok")
        tl = tsv = None
        try:
            tl = th.Toki([ls], mode="fast", name="toki-bench-d-tok")
            tsv = th.Toki([ls], mode="fast", extra=["--tokenize", "server"],
                          name="toki-bench-d-tok-server")
            cl, cs = Client(tl.port), Client(tsv.port)
            for _ in range(50):  # until the probes have ended
                p = tl.stats()["backends"][0].get("prompts", {})
                if p and "probing" not in p.get("status", "probing"):
                    break
                time.sleep(0.1)
            rng = random.Random(7)

            def count(c, system, question):
                body = {"system": system, "messages": [{"role": "user", "content": question}]}
                t0 = time.perf_counter()
                st, r = c.json("POST", "/anthropic/v1/messages/count_tokens", body)
                ms = (time.perf_counter() - t0) * 1000
                if st != 200:
                    raise RuntimeError(f"count_tokens failed: {st} {r}")
                return ms, r["input_tokens"]

            # Words for about 30000 tokens on this vocabulary.
            _, n1 = count(cs, long_text(rng, 2000), "q")
            n_words = int(2000 * 30000 / max(n1, 1))
            for case in ("short", "long cold", "long warm"):
                history = long_text(rng, n_words)
                row = {"model": label, "case": case, "local_ms": [], "server_ms": [],
                       "toki_local_ms": [], "toki_server_ms": [], "tokens": None}
                for i in range(reps):
                    if case == "short":
                        system, q = SYSTEM, f"Say hi {i}."
                    elif case == "long cold":
                        system, q = f"Session {rng.random()}.\n" + long_text(rng, n_words), "Go on."
                    else:
                        system, q = history, f"And now step {i}?"
                    for c, key, toki in ((cl, "local", tl), (cs, "server", tsv))[::(1 if i % 2 else -1)]:
                        before = toki.stats()["backends"][0]["prompts"]
                        ms, n = count(c, system, q)
                        after = toki.stats()["backends"][0]["prompts"]
                        row[key + "_ms"].append(ms)
                        spent = (after["local_ms"] - before["local_ms"]) + \
                                (after["server_ms"] - before["server_ms"])
                        row["toki_" + key + "_ms"].append(spent)
                        if row["tokens"] is None:
                            row["tokens"] = n
                p = tl.stats()["backends"][0]["prompts"]
                row["local_used"] = p["local"] > 0 and p["mismatches"] == 0
                row["prompts"] = p
                out.append(row)
                log(f"  d tokenize {label} {case}: {row['tokens']} tokens, toki "
                    f"{median(row['toki_local_ms']):.2f} ms here vs {median(row['toki_server_ms']):.2f} ms "
                    f"via the server; count_tokens {median(row['local_ms']):.2f} vs "
                    f"{median(row['server_ms']):.2f} ms")
            cl.close()
            cs.close()
        finally:
            stop(tl, tsv, ls)
    return out


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
    tok = tokenize_cost(quick)
    b2b = back_to_back(quick)
    tp4 = throughput(quick, clients=4)
    tp = throughput(quick)
    lo, sv = lat["local"], lat["server"]
    t1 = table(["", "p50 ms", "p99 ms"], [
        ["llama-server alone (phase 1)", lo["direct_ms"]["p50"], lo["direct_ms"]["p99"]],
        ["through toki, prompts made in toki (phase 1)", lo["toki_ms"]["p50"],
         lo["toki_ms"]["p99"]],
        ["**added by toki** (paired difference, phase 1)", lo["paired_added_ms"]["p50"],
         lo["paired_added_ms"]["p99"]],
        ["of which: making the prompt in toki (cache.tokenize_ms)", lo["tokenize_ms"]["p50"],
         lo["tokenize_ms"]["p99"]],
        ["llama-server alone (phase 2)", sv["direct_ms"]["p50"], sv["direct_ms"]["p99"]],
        ["through toki --tokenize server (phase 2)", sv["toki_ms"]["p50"], sv["toki_ms"]["p99"]],
        ["added by toki --tokenize server (paired difference, phase 2)",
         sv["paired_added_ms"]["p50"], sv["paired_added_ms"]["p99"]],
        ["of which: /apply-template + /tokenize via the server (cache.tokenize_ms)",
         sv["tokenize_ms"]["p50"], sv["tokenize_ms"]["p99"]],
        ["the same two round trips, straight to the server", lat["round_trips_ms"]["p50"],
         lat["round_trips_ms"]["p99"]],
    ])
    t_tok = table(["vocabulary", "prompt", "tokens", "made in toki: ms (p50)",
                   "by the server: ms (p50)", "count_tokens via toki: ms (p50)",
                   "count_tokens via --tokenize server: ms (p50)"],
                  [[r["model"], r["case"], r["tokens"], median(r["toki_local_ms"]),
                    median(r["toki_server_ms"]), median(r["local_ms"]), median(r["server_ms"])]
                   for r in tok])
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
          f"max_tokens 1, {lat['n']} requests each way per phase, alternating, keep-alive; "
          f"phase 1 toki made the prompts itself ({lo['tokenized']}), phase 2 (that daemon "
          f"stopped) asked the server ({sv['tokenized']}).\n\n{t1}\n\n"
          f"Making prompts: Anthropic count_tokens (template + tokenize, nothing generated), "
          f"through toki with prompts made in toki and with --tokenize server, alternating; "
          f"cold: a new ~30k-token text each time; warm: the same history and a new question "
          f"(the next turn). Milliseconds toki spent on the prompt, from /toki/stats.\n\n{t_tok}\n\n"
          f"Throughput: stories260K, -np 4, 4 and {tp['fast']['clients']} concurrent streaming "
          f"clients (asyncio, keep-alive, {tp['fast']['per_client']} requests each), max_tokens 32; a run "
          f"ends after {RUN_DEADLINE} s at most, requests still open then count as failed.\n\n{t2}\n\n{mem}\n")
    t3 = table(["path", "requests", "ok", "failed", "example failure"], [
        [{"direct": "llama-server alone"}.get(k, "toki " + k), v["requests"], v["ok"], v["failed"],
         (v["samples"] or [""])[0].replace("|", "/")] for k, v in b2b.items() if k != "toki_log"])
    md += (f"\nBack to back: streamed requests sent one after another on one keep-alive "
           f"connection, no pause (stories260K, 1 slot, max_tokens 8).\n\n{t3}\n")
    return {"latency": lat, "tokenize": tok, "back_to_back": b2b, "throughput_4": tp4, "throughput": tp,
            "markdown": md}
