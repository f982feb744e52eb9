"""Benchmarks b (evaluated tokens over the prefix limit on the interleaved
agent workload) and c (exact vs fast: evaluated tokens and identity with an
uncached run, at two micro-batch sizes)."""
import os
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
TARGETS = ("direct", "fast", "exact", "grid")


def model_path():
    return harness().generated_model(*MODEL)


def toki_log_lines(toki):
    out = []
    for line in toki.log_text().splitlines():
        if "route=" in line or "warn" in line or "error" in line:
            out.append(line)
    return out


class Target:
    """One path of a run: a fresh llama-server (and toki in front of it).
    target: direct, fast, exact, or fast+slots / exact+slots (toki with slot
    files: --slot-dir on toki, --slot-save-path on llama-server, same folder),
    or fast+server / exact+server (--slot-save-path on llama-server only)."""

    def __init__(self, quick, np, cram, target, ubatch):
        import tempfile
        th = harness()
        p = workload.params(quick)
        self.np, self.cram, self.target, self.ubatch = np, cram, target, ubatch
        self.tag = f"np{np}-cram{cram}-ub{ubatch}-{target}"
        self.mode, _, slots = target.partition("+")
        self.slot_dir = tempfile.mkdtemp(prefix="toki-bench-slots-") if slots else None
        self.toki = self.client = None
        self.recs, self.wall = [], 0.0
        # np "auto": no -np, llama-server's default (4 slots, unified KV cache).
        self.ls = th.LlamaServer(model=model_path(), slots=4 if np == "auto" else np,
                                 ctx=p["per_slot_ctx"], ubatch=ubatch, cache_ram=cram,
                                 name=f"bench-{self.tag}", np_flag=np != "auto",
                                 extra=["--slot-save-path", self.slot_dir] if self.slot_dir
                                 else [])
        try:
            if target != "direct":
                # +server: the server has a --slot-save-path, toki no --slot-dir
                # (toki then saves into it under a bounded set of names).
                self.toki = th.Toki([self.ls], mode=self.mode, ubatch=ubatch,
                                    name=f"toki-bench-{self.tag}",
                                    extra=["--slot-dir", self.slot_dir, "--slot-save-idle-ms", "0"]
                                    if self.slot_dir and slots == "slots" else [])
            self.client = Client(self.toki.port if self.toki else self.ls.port)
        except Exception:
            self.close()
            raise

    def send(self, r, toks):
        """One request of the workload, recorded against its reference."""
        t0 = time.perf_counter()
        res = stream_chat_retrying(self.client, workload.body_of(r))
        self.wall += time.perf_counter() - t0
        if res["status"] != 200 or not res["timings"]:
            raise RuntimeError(f"{self.tag}: request {r['i']} failed: {res}")
        t = res["timings"]
        if self.mode == "exact":  # toki's own uncached answer (exact mode's schedule)
            ref_text, ref_lp = r["toki_reply"], r["toki_reply_logprobs"]
        else:  # llama-server's uncached answer (grid is its schedule)
            ref_text, ref_lp = r["reply"], r.get("reply_logprobs")
        self.recs.append({"i": r["i"], "kind": r["kind"], "session": r["session"],
                          "prompt_tokens": len(toks), "prompt_n": t["prompt_n"],
                          "cache_n": t["cache_n"], "ttft": res["ttft"], "total": res["total"],
                          "prompt_ms": t.get("prompt_ms"), "predicted_n": t.get("predicted_n"),
                          "identical": res["text"] == ref_text,
                          "lp_identical": res["text"] == ref_text and res["logprobs"] == ref_lp,
                          "cache": res["cache"],
                          "route": res["route"], "failures": res["failures"],
                          "text": res["text"][:120]})
        if self.mode == "exact" and not self.recs[-1]["lp_identical"]:
            log(f"  {self.tag}: request {r['i']} ({r['kind']} s{r['session']} t{r['turn']}) "
                f"differs from toki's uncached answer: cache {res['cache']}, timings "
                f"cache_n {t['cache_n']} prompt_n {t['prompt_n']}; reference cache "
                f"{r.get('toki_ref_cache')}; text {res['text'][:60]!r} vs "
                f"{ref_text[:60]!r}")

    def finish(self):
        """Stops the servers; returns the run's summary."""
        toki, recs = self.toki, self.recs
        try:
            if toki and toki.proc.poll() is not None:
                raise RuntimeError(f"{self.tag}: toki exited with status {toki.proc.returncode}")
            stats = toki.stats() if toki else None
            lines = toki_log_lines(toki) if toki else []
            log_path = toki.log_path if toki else None
        finally:
            self.close()
        ev = sum(r["prompt_n"] for r in recs)
        res = {"np": self.np, "cram": self.cram, "target": self.target, "ubatch": self.ubatch,
               "think_s": THINK_S, "evaluated": ev,
               "cached": sum(r["cache_n"] for r in recs), "wall_s": self.wall,
               "ttft_p50": median([r["ttft"] for r in recs]),
               "ttft_p95": pct([r["ttft"] for r in recs], 95),
               "identical": sum(r["identical"] for r in recs), "n": len(recs),
               "lp_identical": sum(r["lp_identical"] for r in recs),
               "failed_attempts": sum(len(r["failures"]) for r in recs),
               "count_mismatch": sum(r["prompt_n"] + r["cache_n"] != r["prompt_tokens"]
                                     for r in recs),
               "cache_block_mismatch": sum(bool(r["cache"]) and
                                           r["cache"].get("evaluated") != r["prompt_n"]
                                           for r in recs),
               "tail_cut_tokens": (stats or {}).get("tail_cut_tokens"),
               "prefill_steps": (stats or {}).get("prefill_steps"),
               "reference": "toki uncached" if self.mode == "exact" else "llama-server uncached",
               "requests": recs, "toki_stats": stats, "toki_log": lines,
               "toki_log_path": log_path, "server_log_path": self.ls.log_path}
        log(f"  {self.tag}: evaluated {ev}, wall {self.wall:.1f} s, identical "
            f"{res['identical']}/{res['n']}, logprobs too {res['lp_identical']}/{res['n']}, "
            f"failed attempts {res['failed_attempts']}")
        return res

    def close(self):
        import shutil
        if self.client:
            self.client.close()
            self.client = None
        stop(self.toki, self.ls)
        if self.slot_dir:
            shutil.rmtree(self.slot_dir, ignore_errors=True)


def run_lockstep(quick, requests, tokens, np, cram, targets, ubatch):
    """Replays the request list through every target at once, each on its own
    fresh server: request i goes to each target in turn (the order rotating
    with i), one request in flight at a time, so the targets see the same
    machine at the same moments and their times pair up request by request.
    Returns {target: summary}."""
    opened = []
    try:
        for t in targets:
            opened.append(Target(quick, np, cram, t, ubatch))
        for k, (r, toks) in enumerate(zip(requests, tokens)):
            j = k % len(opened)
            for tg in opened[j:] + opened[:j]:
                if THINK_S:
                    time.sleep(THINK_S)
                tg.send(r, toks)
        out = {}
        while opened:
            tg = opened.pop(0)
            out[tg.target] = tg.finish()
        return out
    finally:
        for tg in opened:
            tg.close()


def run_config(quick, requests, tokens, np, cram, target, ubatch):
    """Replays the request list through one fresh server (and toki), streamed."""
    return run_lockstep(quick, requests, tokens, np, cram, (target,), ubatch)[target]


_runs = {}


def failed_run(np, cram, target, ubatch, e):
    log(f"  np{np}-cram{cram}-ub{ubatch}-{target}: FAILED: {e!r}")
    nan = float("nan")
    return {"np": np, "cram": cram, "target": target, "ubatch": ubatch,
            "error": repr(e)[:300], "evaluated": nan, "cached": nan,
            "wall_s": nan, "ttft_p50": nan, "ttft_p95": nan, "identical": 0,
            "n": 0, "lp_identical": 0, "failed_attempts": "run failed",
            "requests": []}


def cached_run(quick, requests, tokens, np, cram, target, ubatch):
    """run_config once per configuration (b and c share runs). A run that
    fails is recorded with its error (and reported as such), not fatal."""
    key = (quick, np, cram, target, ubatch)
    if key not in _runs:
        try:
            _runs[key] = run_config(quick, requests, tokens, np, cram, target, ubatch)
        except Exception as e:
            _runs[key] = failed_run(np, cram, target, ubatch, e)
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


def label(target):
    mode, _, slots = target.partition("+")
    return ({"direct": "llama-server alone"}.get(mode, "toki " + mode) +
            {"slots": " + slot files", "server": ", server's folder"}.get(slots, ""))


def references(quick, ubatch=512, requests=None):
    """The request list with both references: llama-server's uncached answer
    (workload.reference) and toki's own (workload.toki_reference)."""
    model = model_path()
    reqs, tokens, secs = workload.reference(quick, model, ubatch, requests=requests)
    workload.toki_reference(quick, model, reqs, ubatch)
    return reqs, tokens, secs


def ident(r):
    return f"{r['identical']}/{r['n']}", f"{r['lp_identical']}/{r['n']}"


def bench_b(quick):
    requests, tokens, ref_secs = references(quick)
    limit, per = prefix_limit(tokens)
    glimit = grid_limit(tokens, 512)
    wl = workload_summary(requests, tokens, limit, ref_secs)
    toki_vs_ls = sum(r["toki_reply"] == r["reply"] and
                     r["toki_reply_logprobs"] == r["reply_logprobs"] for r in requests)
    log(f"benchmark b: {wl['requests']} requests, {wl['prompt_tokens_total']} prompt tokens, "
        f"limit {limit}")
    runs = []
    for np in (1, 2, 4):
        for cram in (0, 8192):
            for target in TARGETS:
                runs.append(cached_run(quick, requests, tokens, np, cram, target, 512))
    rows = []
    for r in runs:
        rows.append([r["np"], r["cram"], label(r["target"]), r["evaluated"],
                     r["evaluated"] / limit, r.get("tail_cut_tokens", "") or "",
                     r["ttft_p50"] * 1000, r["ttft_p95"] * 1000, r["wall_s"],
                     r.get("reference", ""), *ident(r), r["failed_attempts"]])
    t1 = table(["-np", "--cache-ram", "path", "evaluated", "eval/limit", "tail cut tokens",
                "TTFT p50 ms", "TTFT p95 ms", "wall s", "reference", "text = reference",
                "text and logprobs = reference", "failed attempts (retried)"], rows)
    pivot = []
    for np in (1, 2, 4):
        for cram in (0, 8192):
            row = [np, cram]
            by = {x["target"]: x for x in runs if x["np"] == np and x["cram"] == cram}
            for target in TARGETS:
                row.append(by[target]["evaluated"] / limit)
            row.append(by["exact"]["evaluated"] / by["fast"]["evaluated"])
            pivot.append(row)
    t2 = table(["-np", "--cache-ram", "llama-server alone", "toki fast", "toki exact",
                "toki grid", "exact / fast"], pivot)
    md = (f"### b. Interleaved agent workload\n\n{wl['requests']} requests "
          f"({', '.join(f'{v} {k}' for k, v in wl['kinds'].items())}), "
          f"{wl['prompt_tokens_total']} prompt tokens in all, longest prompt "
          f"{wl['prompt_tokens_max']}, limit {limit} tokens (grid limit {glimit}). Model "
          f"{MODEL[1]} generated, -ub 512, per-slot context {workload.params(quick)['per_slot_ctx']}, "
          f"{int(THINK_S * 1000)} ms between requests. Evaluated: the sum of each answer's "
          f"timings.prompt_n (through toki: all of a request's steps; equal to its cache "
          f"block's `evaluated`); tail cuts (toki's 1-token requests after an exact-mode "
          f"answer, off the path) are counted apart. Identity: toki exact against toki's own "
          f"uncached answers (the same list through a fresh toki exact, `cache_prompt: "
          f"false`), the others against llama-server's uncached answers; the two references "
          f"agree on {toki_vs_ls}/{len(requests)} requests (text + logprobs).\n\n"
          f"evaluated / limit:\n\n{t2}\n\n{t1}\n")
    return {"workload": wl, "limit_per_request": per, "grid_limit": glimit, "runs": runs,
            "markdown": md, "references_agree": toki_vs_ls,
            "reference_replies": [{"i": r["i"], "session": r["session"], "kind": r["kind"],
                                   "turn": r["turn"], "reply": r["reply"],
                                   "toki_reply": r["toki_reply"],
                                   "reply_tokens": r.get("reply_tokens"),
                                   "header_tokens": r.get("header_tokens"),
                                   "toki_ref_cache": r.get("toki_ref_cache")}
                                  for r in requests]}


def bench_c(quick):
    requests, tokens, _ = references(quick)
    limit, _ = prefix_limit(tokens)
    np, cram = 4, 0
    out = {"np": np, "cram": cram, "limit": limit, "by_ubatch": {}}
    rows = []
    for ub in (512, 64):
        if ub == 512:
            ref_reqs = requests
            ref_secs = None
        else:
            ref_reqs, _, ref_secs = references(quick, ub, requests=requests)
        uncached = sum(len(t) for t in tokens)
        rows.append([ub, "no cache (cache_prompt false)", uncached, uncached / limit, "", "", "",
                     "", "", "", ""])
        res = {}
        for target in TARGETS:
            res[target] = cached_run(quick, ref_reqs, tokens, np, cram, target, ub)
        fast_ev = res["fast"]["evaluated"]
        for target in TARGETS:
            r = res[target]
            extra = (r["evaluated"] - fast_ev) / r["n"] if r["n"] else float("nan")
            per_req = [a["prompt_n"] - b["prompt_n"] for a, b in
                       zip(r["requests"], res["fast"]["requests"])]
            loss = [q["cache"]["matched"] - q["cache"]["reuse"] for q in r["requests"]
                    if q.get("cache")]
            rows.append([ub, label(target), r["evaluated"], r["evaluated"] / limit,
                         f"{sum(loss) / len(loss):.1f} / {max(loss)}" if loss else "",
                         f"{extra:+.1f}", f"{max(per_req):+d}" if target != "fast" and per_req else "",
                         r.get("reference", ""), *ident(r), r["failed_attempts"]])
        out["by_ubatch"][ub] = {"runs": {k: v for k, v in res.items()},
                                "uncached_evaluated": uncached, "reference_s": ref_secs}
    t = table(["-ub", "path", "evaluated", "eval/limit",
               "declined per request: matched - reused, mean / max",
               "extra vs fast per request (mean)",
               "extra vs fast (max one request)", "reference", "text = reference",
               "text and logprobs = reference", "failed attempts (retried)"], rows)
    out["markdown"] = (f"### c. Exact vs fast\n\nSame workload, -np {np}, --cache-ram {cram}, "
                       f"limit {limit}. Identity: each answer's text byte for byte and every "
                       f"generated token's log-probability, float for float, against its "
                       f"reference at the same -ub: toki exact against toki's own uncached "
                       f"answer, the others against llama-server's (`cache_prompt: false`, "
                       f"1 slot).\n\n{t}\n")
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


def bound_extra(requests):
    """What exact mode may evaluate beyond fast on the workload (issue 12's
    bound): for every request, its header (the generation prompt), and for
    a request that continues a conversation, the previous turn's generated
    tokens (which exact mode recomputes in a batch). Returns (generated sum,
    header sum)."""
    gen = hdr = 0
    last = {}
    for r in requests:
        hdr += r.get("header_tokens") or 0
        key = (r["session"], r["kind"])
        if r["kind"] != "title" and key in last:
            gen += last[key].get("reply_tokens") or 0
        last[key] = r
    return gen, hdr


def bench_e(quick):
    """b's workload with toki's slot files: before evicting a slot toki saves
    its content to a file (llama-server's slot save) and restores it when that
    beats recomputing, which no per-slot cache can do on its own when sessions
    share a system prompt. Every configuration of b: -np 1/2/4, --cache-ram 0
    and 8192, fast, exact and grid; llama-server alone beside them."""
    requests, tokens, _ = references(quick)
    limit, _ = prefix_limit(tokens)
    glimit = grid_limit(tokens, 512)
    gen, hdr = bound_extra(requests)
    rows = []
    runs = []
    pivot = []
    for np in (1, 2, 4):
        for cram in (0, 8192):
            by = {}
            for target in ("direct", "fast+slots", "exact+slots", "grid+slots"):
                r = cached_run(quick, requests, tokens, np, cram, target, 512)
                by[target] = r
                runs.append(r)
                st = r.get("toki_stats") or {}
                slots = "slots" in target
                rows.append([np, cram, label(target), r["evaluated"], r["evaluated"] / limit,
                             r["evaluated"] / glimit if target.startswith("grid") else "",
                             st.get("saves", "") if slots else "",
                             st.get("restores", "") if slots else "",
                             r.get("tail_cut_tokens", "") or "",
                             r["ttft_p50"] * 1000, r["ttft_p95"] * 1000, r["wall_s"],
                             r.get("reference", ""), *ident(r), r["failed_attempts"]])
            f, e = by["fast+slots"]["evaluated"], by["exact+slots"]["evaluated"]
            declined = sum(q["cache"]["matched"] - q["cache"]["reuse"]
                           for q in by["exact+slots"]["requests"] if q.get("cache"))
            pivot.append([np, cram, by["direct"]["evaluated"], f, e, by["grid+slots"]["evaluated"],
                          e / f, f + gen + hdr, e - f, declined,
                          "yes" if e <= f + gen + hdr else "no",
                          "yes" if e / f <= 1.15 else "no"])
    t = table(["-np", "--cache-ram", "path", "evaluated", "eval/limit", "eval/grid limit",
               "slot saves", "slot restores", "tail cut tokens", "TTFT p50 ms", "TTFT p95 ms",
               "wall s", "reference", "text = reference", "text and logprobs = reference",
               "failed attempts (retried)"], rows)
    t2 = table(["-np", "--cache-ram", "llama-server alone", "fast + slot files",
                "exact + slot files", "grid + slot files", "exact / fast",
                "bound: fast + generated + headers", "exact - fast",
                "exact declined (matched - reused)", "exact <= bound",
                "exact / fast <= 1.15"], pivot)
    md = (f"### e. The same workload with toki's slot files\n\nb's workload (limit {limit}; "
          f"grid limit, -ub 512: {glimit}), -ub 512; toki with --slot-dir "
          f"(llama-server --slot-save-path, the same folder) and --slot-save-idle-ms 0 (save "
          f"only on eviction); llama-server alone (no slot files) beside them. The bound "
          f"(issue 12): fast's evaluated + the previous turns' generated tokens that the "
          f"next turns carry ({gen}) + every request's header ({hdr}).\n\n{t2}\n\n{t}\n")
    return {"limit": limit, "grid_limit": glimit, "bound_generated": gen, "bound_headers": hdr,
            "pivot": pivot,
            "runs": [r for r in runs if "slots" in r["target"]], "markdown": md}


NW_TARGETS = ("direct", "fast", "exact", "fast+server", "exact+server", "fast+slots",
              "exact+slots")


def n_configs():
    """-np x --cache-ram of bench n; TOKI_BENCH_N_CONFIGS="2:8192,1:0" runs
    only those (a rerun of one configuration)."""
    only = os.environ.get("TOKI_BENCH_N_CONFIGS")
    if only:
        out = []
        for c in only.split(","):
            np, cram = c.split(":")
            out.append((np if np == "auto" else int(np), int(cram)))
        return out
    return [(np, cram) for np in (1, 2, 4, "auto") for cram in (0, 8192)]


def paired_ttft(a, b):
    """b's TTFT minus a's, request by request (both runs in lockstep): the
    median difference in ms, how many of b's were no later than a's, and the
    median difference of what TTFT holds besides the server's own prompt
    time (its prefill, the noisiest part): the hops, templates, queues."""
    pairs = list(zip(a["requests"], b["requests"]))
    d = [(y["ttft"] - x["ttft"]) * 1000 for x, y in pairs]
    rest = [(y["ttft"] * 1000 - y["prompt_ms"]) - (x["ttft"] * 1000 - x["prompt_ms"])
            for x, y in pairs if x.get("prompt_ms") is not None and y.get("prompt_ms") is not None]
    nan = float("nan")
    return (median(d) if d else nan), sum(v <= 0 for v in d), len(d), (median(rest) if rest
                                                                         else nan)


def bench_n(quick):
    """Never worse than llama-server alone (issue 13, item 10): b's workload in
    every -np (1, 2, 4, and llama-server's own default: no -np, 4 slots on a
    unified KV cache) x --cache-ram (0, 8192) configuration, llama-server
    alone beside toki fast and toki exact, each with and without slot files
    (llama-server --slot-save-path and toki --slot-dir). The seven paths of a
    configuration run in lockstep (run_lockstep), so TTFTs pair up."""
    requests, tokens, _ = references(quick)
    limit, _ = prefix_limit(tokens)
    pivot, rows, runs = [], [], []
    for np, cram in n_configs():
        try:
            by = run_lockstep(quick, requests, tokens, np, cram, NW_TARGETS, 512)
        except Exception as e:
            by = {t: failed_run(np, cram, t, 512, e) for t in NW_TARGETS}
        for target in NW_TARGETS:
            r = by[target]
            runs.append(r)
            rows.append([np, cram, label(target), r["evaluated"], r["evaluated"] / limit,
                         r["ttft_p50"] * 1000, r["ttft_p95"] * 1000, r["wall_s"],
                         r.get("reference", ""), *ident(r), r["failed_attempts"]])
        a = by["direct"]
        row = [np, cram, a["evaluated"]]
        for target in NW_TARGETS[1:]:
            row.append(f"{by[target]['evaluated']} ({by[target]['evaluated'] / a['evaluated']:.2f})")
        for target in ("fast", "fast+slots"):
            d, le, n, rest = paired_ttft(a, by[target])
            by[target]["ttft_vs_alone_ms"] = d
            by[target]["ttft_less_prompt_vs_alone_ms"] = rest
            row.append(f"{d:+.1f} ({le}/{n}; {rest:+.1f})")
        row.append("yes" if max(by[t]["evaluated"] for t in ("fast", "fast+server", "fast+slots"))
                   <= a["evaluated"] else "no")
        pivot.append(row)
    t1 = table(["-np", "--cache-ram", "llama-server alone", "toki fast", "toki exact",
                "toki fast, server's folder", "toki exact, server's folder",
                "toki fast + slot files", "toki exact + slot files",
                "TTFT fast - alone, median ms (fast no later; less prompt time)",
                "TTFT fast + slot files - alone, median ms (no later; less prompt time)",
                "every fast <= alone"], pivot)
    t2 = table(["-np", "--cache-ram", "path", "evaluated", "eval/limit", "TTFT p50 ms",
                "TTFT p95 ms", "wall s", "reference", "text = reference",
                "text and logprobs = reference", "failed attempts (retried)"], rows)
    md = (f"### n. Never worse than llama-server alone\n\nb's workload (limit {limit}), "
          f"-ub 512. Evaluated tokens (and their ratio to llama-server alone's) per "
          f"configuration; \"auto\" is llama-server without -np (4 slots, unified KV cache, "
          f"idle slots moved to its RAM cache when --cache-ram is on). Slot files: "
          f"llama-server --slot-save-path DIR and toki --slot-dir DIR; server's folder: "
          f"llama-server --slot-save-path DIR, toki without --slot-dir. The seven paths of a "
          f"configuration run in lockstep, each on its own server: request i goes to each "
          f"in turn, the order rotating, so TTFTs are compared request by request; \"less "
          f"prompt time\": the same median difference of TTFT minus the server's own "
          f"prompt_ms (its prefill), what toki's hop adds.\n\n"
          f"{t1}\n\n{t2}\n")
    return {"limit": limit, "pivot": pivot, "runs": runs, "markdown": md}
