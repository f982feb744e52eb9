"""Benchmarks b (evaluated tokens over the prefix limit on the interleaved
agent workload) and c (exact vs fast: evaluated tokens and identity with an
uncached run, at two micro-batch sizes)."""
import time

import workload
from common import (Client, harness, lcp, log, median, pct, prefix_limit, stop,
                    stream_chat_retrying, table)

# A generated random-weight model: prefill cost is visible. Its greedy text is
# mostly one token repeated, so the identity check also compares every token's
# log-probability with the uncached run's (workload.LOGPROBS).
MODEL = ("bench", "4M", 32768)
# Seconds between one request's end and the next one's start (an agent runs
# its tools between turns). Not counted in the wall time. See docs/benchmarks.md:
# with none, toki reuses a backend connection llama-server has just closed.
THINK_S = 0.25
TARGETS = ("direct", "fast", "exact")


def model_path():
    return harness().generated_model(*MODEL)


def toki_log_lines(toki):
    out = []
    for line in toki.log_text().splitlines():
        if "route=" in line or "warn" in line or "error" in line:
            out.append(line)
    return out


def run_config(quick, requests, tokens, np, cram, target, ubatch):
    """Replays the request list through one fresh server (and toki), streamed.
    target: direct, fast, exact, or fast+slots / exact+slots (toki with slot
    files: --slot-dir on toki, --slot-save-path on llama-server, same folder)."""
    import shutil
    import tempfile
    th = harness()
    p = workload.params(quick)
    tag = f"np{np}-cram{cram}-ub{ubatch}-{target}"
    mode, _, slots = target.partition("+")
    slot_dir = tempfile.mkdtemp(prefix="toki-bench-slots-") if slots else None
    ls = th.LlamaServer(model=model_path(), slots=np, ctx=p["per_slot_ctx"], ubatch=ubatch,
                        cache_ram=cram, name=f"bench-{tag}",
                        extra=["--slot-save-path", slot_dir] if slot_dir else [])
    toki = None
    try:
        if target != "direct":
            toki = th.Toki([ls], mode=mode, ubatch=ubatch, name=f"toki-bench-{tag}",
                           extra=["--slot-dir", slot_dir, "--slot-save-idle-ms", "0"]
                           if slot_dir else [])
        c = Client(toki.port if toki else ls.port)
        recs = []
        wall = 0.0
        for r, toks in zip(requests, tokens):
            if THINK_S and recs:
                time.sleep(THINK_S)
            t0 = time.perf_counter()
            res = stream_chat_retrying(c, workload.body_of(r))
            wall += time.perf_counter() - t0
            if res["status"] != 200 or not res["timings"]:
                raise RuntimeError(f"{tag}: request {r['i']} failed: {res}")
            t = res["timings"]
            recs.append({"i": r["i"], "kind": r["kind"], "session": r["session"],
                         "prompt_tokens": len(toks), "prompt_n": t["prompt_n"],
                         "cache_n": t["cache_n"], "ttft": res["ttft"], "total": res["total"],
                         "identical": res["text"] == r["reply"],
                         "lp_identical": res["text"] == r["reply"] and
                                         res["logprobs"] == r.get("reply_logprobs"),
                         "cache": res["cache"],
                         "route": res["route"], "failures": res["failures"],
                         "text": res["text"][:120]})
        c.close()
        if toki and toki.proc.poll() is not None:
            raise RuntimeError(f"{tag}: toki exited with status {toki.proc.returncode}")
        stats = toki.stats() if toki else None
        lines = toki_log_lines(toki) if toki else []
        log_path = toki.log_path if toki else None
    finally:
        stop(toki, ls)
        if slot_dir:
            shutil.rmtree(slot_dir, ignore_errors=True)
    ev = sum(r["prompt_n"] for r in recs)
    res = {"np": np, "cram": cram, "target": target, "ubatch": ubatch, "think_s": THINK_S,
           "evaluated": ev,
           "cached": sum(r["cache_n"] for r in recs), "wall_s": wall,
           "ttft_p50": median([r["ttft"] for r in recs]),
           "ttft_p95": pct([r["ttft"] for r in recs], 95),
           "identical": sum(r["identical"] for r in recs), "n": len(recs),
           "lp_identical": sum(r["lp_identical"] for r in recs),
           "failed_attempts": sum(len(r["failures"]) for r in recs),
           "count_mismatch": sum(r["prompt_n"] + r["cache_n"] != r["prompt_tokens"] for r in recs),
           "requests": recs, "toki_stats": stats, "toki_log": lines, "toki_log_path": log_path,
           "server_log_path": ls.log_path}
    log(f"  {tag}: evaluated {ev}, wall {wall:.1f} s, identical {res['identical']}/{res['n']}, "
        f"logprobs too {res['lp_identical']}/{res['n']}, failed attempts {res['failed_attempts']}")
    return res


_runs = {}


def cached_run(quick, requests, tokens, np, cram, target, ubatch):
    """run_config once per configuration (b and c share runs). A run that
    fails is recorded with its error (and reported as such), not fatal."""
    key = (quick, np, cram, target, ubatch)
    if key not in _runs:
        try:
            _runs[key] = run_config(quick, requests, tokens, np, cram, target, ubatch)
        except Exception as e:
            log(f"  np{np}-cram{cram}-ub{ubatch}-{target}: FAILED: {e!r}")
            nan = float("nan")
            _runs[key] = {"np": np, "cram": cram, "target": target, "ubatch": ubatch,
                          "error": repr(e)[:300], "evaluated": nan, "cached": nan,
                          "wall_s": nan, "ttft_p50": nan, "ttft_p95": nan, "identical": 0,
                          "n": 0, "lp_identical": 0, "failed_attempts": "run failed",
                          "requests": []}
    return _runs[key]


def workload_summary(requests, tokens, limit, ref_secs):
    n = [len(t) for t in tokens]
    kinds = {}
    for r in requests:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    return {"requests": len(requests), "kinds": kinds, "prompt_tokens_total": sum(n),
            "prompt_tokens_max": max(n), "limit": limit,
            "system_prompt_tokens": sorted({len(t) for t, r in zip(tokens, requests)
                                            if r["kind"] != "title" and
                                            (r["turn"] == 1)}),
            "uncached_run_s": ref_secs}


def bench_b(quick):
    model = model_path()
    requests, tokens, ref_secs = workload.reference(quick, model, 512)
    limit, per = prefix_limit(tokens)
    wl = workload_summary(requests, tokens, limit, ref_secs)
    log(f"benchmark b: {wl['requests']} requests, {wl['prompt_tokens_total']} prompt tokens, "
        f"limit {limit}")
    runs = []
    for np in (1, 2, 4):
        for cram in (0, 8192):
            for target in TARGETS:
                runs.append(cached_run(quick, requests, tokens, np, cram, target, 512))
    rows = []
    for r in runs:
        rows.append([r["np"], r["cram"], {"direct": "llama-server alone"}.get(
            r["target"], "toki " + r["target"]), r["evaluated"], limit,
            r["evaluated"] / limit, r["ttft_p50"] * 1000, r["ttft_p95"] * 1000, r["wall_s"],
            f"{r['identical']}/{r['n']}", f"{r['lp_identical']}/{r['n']}", r["failed_attempts"]])
    t1 = table(["-np", "--cache-ram", "path", "evaluated", "limit", "eval/limit",
                "TTFT p50 ms", "TTFT p95 ms", "wall s", "text = uncached",
                "text and logprobs = uncached",
                "failed attempts (retried)"], rows)
    pivot = []
    for np in (1, 2, 4):
        for cram in (0, 8192):
            row = [np, cram]
            for target in TARGETS:
                r = next(x for x in runs if x["np"] == np and x["cram"] == cram and
                         x["target"] == target)
                row.append(r["evaluated"] / limit)
            pivot.append(row)
    t2 = table(["-np", "--cache-ram", "llama-server alone", "toki fast", "toki exact"], pivot)
    md = (f"### b. Interleaved agent workload\n\n{wl['requests']} requests "
          f"({', '.join(f'{v} {k}' for k, v in wl['kinds'].items())}), "
          f"{wl['prompt_tokens_total']} prompt tokens in all, longest prompt "
          f"{wl['prompt_tokens_max']}, limit {limit} tokens. Model "
          f"{MODEL[1]} generated, -ub 512, per-slot context {workload.params(quick)['per_slot_ctx']}, "
          f"{int(THINK_S * 1000)} ms between requests.\n\nevaluated / limit:\n\n{t2}\n\n{t1}\n")
    return {"workload": wl, "limit_per_request": per, "runs": runs, "markdown": md,
            "reference_replies": [{"i": r["i"], "session": r["session"], "kind": r["kind"],
                                   "turn": r["turn"], "reply": r["reply"]} for r in requests]}


def bench_c(quick):
    model = model_path()
    requests, tokens, _ = workload.reference(quick, model, 512)
    limit, _ = prefix_limit(tokens)
    np, cram = 4, 0
    out = {"np": np, "cram": cram, "limit": limit, "by_ubatch": {}}
    rows = []
    for ub in (512, 64):
        if ub == 512:
            ref_reqs = requests
            ref_secs = None
        else:
            ref_reqs, _, ref_secs = workload.reference(quick, model, ub, requests=requests)
        uncached = sum(len(t) for t in tokens)
        rows.append([ub, "no cache (cache_prompt false)", uncached, uncached / limit, "", "", "",
                     f"{len(tokens)}/{len(tokens)}", f"{len(tokens)}/{len(tokens)}", ""])
        res = {}
        for target in TARGETS:
            r = cached_run(quick, ref_reqs, tokens, np, cram, target, ub)
            res[target] = r
        fast_ev = res["fast"]["evaluated"]
        for target in TARGETS:
            r = res[target]
            extra = (r["evaluated"] - fast_ev) / r["n"] if r["n"] else float("nan")
            per_req = [a["prompt_n"] - b["prompt_n"] for a, b in
                       zip(r["requests"], res["fast"]["requests"])]
            loss = [q["cache"]["matched"] - q["cache"]["reuse"] for q in r["requests"]
                    if q.get("cache")]
            rows.append([ub, {"direct": "llama-server alone"}.get(target, "toki " + target),
                         r["evaluated"], r["evaluated"] / limit,
                         f"{sum(loss) / len(loss):.1f} / {max(loss)}" if loss else "",
                         f"{extra:+.1f}", f"{max(per_req):+d}" if target != "fast" and per_req else "",
                         f"{r['identical']}/{r['n']}", f"{r['lp_identical']}/{r['n']}",
                         r["failed_attempts"]])
        out["by_ubatch"][ub] = {"runs": {k: v for k, v in res.items()},
                                "uncached_evaluated": uncached, "reference_s": ref_secs}
    t = table(["-ub", "path", "evaluated", "eval/limit",
               "grid loss per request: matched - reused, mean / max",
               "extra vs fast per request (mean)",
               "extra vs fast (max one request)", "text = uncached",
               "text and logprobs = uncached", "failed attempts (retried)"], rows)
    out["markdown"] = (f"### c. Exact vs fast\n\nSame workload, -np {np}, --cache-ram {cram}, "
                       f"limit {limit}. Identity: the streamed text compared byte for byte "
                       f"with an uncached run (`cache_prompt: false`, 1 slot, same -ub) of the "
                       f"same request; \"text and logprobs\": also every generated token's "
                       f"log-probability, float for float.\n\n{t}\n")
    return out


def grid_limit(tokens, ub):
    """The limit for exact mode: what an uncached run's micro-batch grid lets
    any cache reuse. A request may reuse only whole micro-batches of its best
    earlier prefix (reuse cut back to a multiple of -ub, and at most n - 1):
    sum of n_i - floor(min(LCP_i, n_i - 1) / ub) * ub."""
    total = 0
    for i, t in enumerate(tokens):
        best = 0
        for j in range(i):
            best = max(best, lcp(t, tokens[j]))
        total += len(t) - (min(best, len(t) - 1) // ub) * ub
    return total


def bench_e(quick):
    """b's workload with toki's slot files: before evicting a slot toki saves
    its content to a file (llama-server's slot save) and restores it when that
    beats recomputing, which no per-slot cache can do on its own when sessions
    share a system prompt. Every configuration of b: -np 1/2/4, --cache-ram 0
    and 8192, fast and exact."""
    model = model_path()
    requests, tokens, _ = workload.reference(quick, model, 512)
    limit, _ = prefix_limit(tokens)
    glimit = grid_limit(tokens, 512)
    rows = []
    runs = []
    for np in (1, 2, 4):
        for cram in (0, 8192):
            for target in ("direct", "fast", "exact", "fast+slots", "exact+slots"):
                if "slots" not in target and (quick, np, cram, target, 512) not in _runs:
                    continue  # b's rows, when b ran in this process
                r = cached_run(quick, requests, tokens, np, cram, target, 512)
                runs.append(r)
                st = r.get("toki_stats") or {}
                exact = target.startswith("exact")
                rows.append([np, cram, {"direct": "llama-server alone"}.get(target, "toki " + target),
                             r["evaluated"], r["evaluated"] / limit,
                             r["evaluated"] / glimit if exact else "",
                             st.get("saves", "") if "slots" in target else "",
                             st.get("restores", "") if "slots" in target else "",
                             r["ttft_p50"] * 1000, r["ttft_p95"] * 1000, r["wall_s"],
                             f"{r['identical']}/{r['n']}", f"{r['lp_identical']}/{r['n']}",
                             r["failed_attempts"]])
    t = table(["-np", "--cache-ram", "path", "evaluated", "eval/limit", "eval/grid limit",
               "slot saves", "slot restores", "TTFT p50 ms", "TTFT p95 ms", "wall s",
               "text = uncached", "text and logprobs = uncached", "failed attempts (retried)"],
              rows)
    md = (f"### e. The same workload with toki's slot files\n\nb's workload (limit {limit}; "
          f"grid limit for exact mode, -ub 512: {glimit}), -ub 512; toki with --slot-dir "
          f"(llama-server --slot-save-path, the same folder) and --slot-save-idle-ms 0 (save "
          f"only on eviction). Rows without slot files are b's runs (when b ran in the same "
          f"invocation).\n\n{t}\n")
    return {"limit": limit, "grid_limit": glimit,
            "runs": [r for r in runs if "slots" in r["target"]], "markdown": md}
