#!/usr/bin/env python3
"""Fleet benchmark: 1, 2 and 3 llama-servers (each -np 2) behind one
`toki serve` (fast mode, or exact with --mode exact) vs the same servers used round-robin (request i goes
to server i mod n, no id_slot: llama-server picks the slot itself), on the
interleaved agent workload of bench/workload.py widened to six sessions.

  python3 bench/bench_fleet.py [--backends 1,2,3] [--slot-files] [--repeat N]
                               [--mode fast|exact] [--pin] [--per-request]
                               [--toki build/toki] [--against OTHER] [--out FILE.json]

--pin gives each server a core of its own and one thread (-t 1), as a host
each: without it, servers that share this machine's cores slow each other
down tenfold whenever two compute at once, and the router's choices (which
read the speeds it measures) vary with that from run to run.
--per-request prints, after each run, the requests that evaluated more than
their own share of the limit (+2), with the route toki took (the JSON has
them for every run: over_limit).

The sessions run concurrently, as six agents would: the workload's schedule
(session s starts s events after session 0) is replayed in steps, the
requests of one step at once (one per session at most) and the next step when
they are done, so a conversation's turns stay in order and the limit (each
request's tokens that no earlier request could have left in a cache,
bench/common.py prefix_limit) is the same for every configuration. Reports
requests/s and generated tokens/s over the wall time, streamed time to first
token p50/p95, and evaluated prompt tokens over the limit. In exact mode
every answer of --toki's binary is also compared, text and logprobs, with
its own uncached answer to the same request (workload.toki_reference).

The replay (steps_of, replay, HostClient, toki_sender, round_robin_sender,
summarize) is also what tests/integration/test_fleet.py runs across network
namespaces. Standard library only."""
import argparse
import http.client
import json
import os
import sys
import threading
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)
import common  # noqa: E402
import workload  # noqa: E402

# Six sessions, each: a shared base system prompt plus its own part, four
# main turns, a two-turn sub-agent and a title request.
FLEET = dict(sessions=6, main_turns=4, sub_turns=2, main_base=600, main_tails=(150, 350, 600),
             sub_base=350, sub_tails=(150, 250, 400), max_tokens=24, per_slot_ctx=4096)
MODEL = ("fleet", "4M", 8192)  # a generated random-weight model: prefill cost is visible
SLOTS = 2
REQUEST_TIMEOUT = 120  # seconds of silence: a request that waits longer has hung

# workload.build and workload.reference size the workload with
# workload.params(quick); a string key selects these sizes instead.
_PARAMS = {"fleet": FLEET}
_params_orig = workload.params
if not getattr(workload.params, "fleet_aware", False):
    def _params(quick):
        if isinstance(quick, str) and quick in _PARAMS:
            return _PARAMS[quick]
        return _params_orig(quick)
    _params.fleet_aware = True
    workload.params = _params


def model_path(seed=1):
    return common.harness().generated_model(*MODEL, seed=seed)


def reference(model, key="fleet"):
    """The fixed request list (from workload.reference's uncached run), its
    token lists, the prefix limit and the seconds the uncached run took.
    Kept in a file beside the generated models, keyed by the model's
    content, the sizes and the llama-server, so that a second run skips it."""
    import hashlib
    th = common.harness()
    h = hashlib.sha256()
    with open(model, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    h.update(json.dumps(_PARAMS[key], sort_keys=True).encode())
    with open(workload.__file__, "rb") as f:  # how the requests are made
        h.update(f.read())
    h.update(os.path.realpath(th.llama_server_path()).encode())
    path = os.path.join(th.WORK_DIR, f"fleet-reference-{h.hexdigest()[:16]}.json")
    try:
        with open(path) as f:
            d = json.load(f)
        reqs, tokens, secs = d["requests"], d["tokens"], d["seconds"]
    except (OSError, ValueError, KeyError):
        reqs, tokens, secs = workload.reference(key, model, 512)
        tmp = path + f".{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"requests": reqs, "tokens": tokens, "seconds": secs}, f)
        os.replace(tmp, path)
    limit, _ = common.prefix_limit(tokens)
    return reqs, tokens, limit, secs


# ---- replay ----

def steps_of(requests):
    """Groups request indices by schedule step: the e-th event of session s
    is at step e + s (workload.schedule), one event per session a step."""
    seen = {}
    steps = {}
    for r in requests:
        e = seen.get(r["session"], 0)
        seen[r["session"]] = e + 1
        steps.setdefault(e + r["session"], []).append(r["i"])
    return [steps[k] for k in sorted(steps)]


class HostClient(common.Client):
    """common.Client on any address (the fleet's hosts are not all
    127.0.0.1)."""

    def __init__(self, host, port, timeout=600):
        super().__init__(port, timeout)
        self.host = host

    def _conn(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return self.conn


def toki_sender(port, host="127.0.0.1", extra=None, timeout=600):
    """send(i, body) through toki: a fresh connection per request."""
    def send(i, body):
        c = HostClient(host, port, timeout)
        try:
            return c.stream_chat(dict(body, **(extra or {})))
        finally:
            c.close()
    return send


def round_robin_sender(backends, extra=None, timeout=600):
    """send(i, body) straight to backend i mod n, given as (host, port)."""
    def send(i, body):
        host, port = backends[i % len(backends)]
        c = HostClient(host, port, timeout)
        try:
            r = c.stream_chat(dict(body, **(extra or {})))
        finally:
            c.close()
        r["backend"] = f"http://{host}:{port}"
        return r
    return send


def body_of(req):
    """A request's body: its messages at temperature 0 (workload.body_of may
    add fields for the identity benchmarks; the fleet needs none)."""
    return {"messages": req["messages"], "temperature": 0, "max_tokens": req["max_tokens"]}


def replay(requests, send, body_of=body_of, stop_on_error=False):
    """Runs the requests step by step (steps_of), each step's at once.
    Returns (results by request index, wall seconds). With stop_on_error,
    a step with a failed request (not a 200 with timings) ends the replay:
    the rest are left None."""
    results = [None] * len(requests)

    def one(i):
        try:
            results[i] = send(i, body_of(requests[i]))
        except Exception as e:  # recorded, asserted on by the caller
            results[i] = {"status": 0, "error": repr(e), "text": "", "ttft": float("nan"),
                          "total": float("nan"), "timings": None, "cache": None}
    t0 = time.perf_counter()
    for step in steps_of(requests):
        threads = [threading.Thread(target=one, args=(i,)) for i in step]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if stop_on_error and any(results[i]["status"] != 200 or not results[i].get("timings")
                                 for i in step):
            break
    return results, time.perf_counter() - t0


def summarize(results, limit, wall):
    n_all = len(results)  # those a stopped replay did not send are None
    results = [r for r in results if r is not None]
    ok = [r for r in results if r["status"] == 200 and r.get("timings")]
    ev = sum(r["timings"]["prompt_n"] for r in ok)
    gen = sum(r["timings"].get("predicted_n", 0) for r in ok)
    ttft = [r["ttft"] for r in ok]
    per_backend = {}
    for r in ok:
        b = (r.get("cache") or {}).get("backend") or r.get("backend") or "?"
        per_backend[b] = per_backend.get(b, 0) + 1
    return {"n": n_all, "ok": len(ok), "evaluated": ev, "limit": limit,
            "eval_over_limit": ev / limit, "generated": gen, "wall_s": wall,
            "req_per_s": len(ok) / wall, "gen_tok_per_s": gen / wall,
            "ttft_p50_ms": common.median(ttft) * 1000, "ttft_p95_ms": common.pct(ttft, 95) * 1000,
            "per_backend": per_backend,
            "errors": [r.get("error") for r in results if r["status"] != 200][:5]}


# ---- the benchmark ----

PIN_THREADS = 1  # a pinned server's threads: one core's


def start_server(th, k, pin, **kw):
    """Server k; with pin, on core k alone with one thread: the affinity
    is this process's while it starts the server, which inherits it."""
    if not pin:
        return th.LlamaServer(**kw)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < k + 1:
        sys.exit(f"--pin: server {k} needs core {k}; this machine lends {len(cores)}")
    kw["threads"] = PIN_THREADS
    os.sched_setaffinity(0, {cores[k]})
    try:
        return th.LlamaServer(**kw)
    finally:
        os.sched_setaffinity(0, cores)


def over_limit(requests, results, per):
    """The requests that evaluated more than their share of the limit (per,
    bench/common.py prefix_limit) plus 2: index, session, kind, evaluated,
    share, and toki's route, backend and restored file."""
    out = []
    for i, (q, r) in enumerate(zip(requests, results)):
        if r is None or not r.get("timings") or r["timings"]["prompt_n"] <= per[i] + 2:
            continue
        c = r.get("cache") or {}
        out.append([i, q["session"], q.get("kind"), r["timings"]["prompt_n"], per[i],
                    c.get("route"), c.get("backend") or r.get("backend"), c.get("restored")])
    return out


def run_one(n, target, requests, limit, model, slot_dir=False, toki_bin=None, mode="fast",
            pin=False, per=None, show=False):
    """One configuration on fresh servers. slot_dir (toki only): the
    servers share one --slot-save-path, toki's --slot-dir. toki_bin: another
    toki binary than the harness's (--against). mode: toki's --reuse. pin:
    each server on a core of its own (start_server). per: each request's
    share of the limit, for over_limit; show: print those."""
    import shutil
    import tempfile
    th = common.harness()
    servers, toki = [], None
    load0 = (common.loadavg() or [float("nan")])[0]  # the machine is shared: say how busy
    sd = tempfile.mkdtemp(prefix="toki-fleet-slots-") if slot_dir else None
    extra = ("--slot-save-path", sd) if sd else ()
    try:
        for k in range(n):
            servers.append(start_server(th, k, pin, model=model, slots=SLOTS,
                                        ctx=FLEET["per_slot_ctx"], ubatch=512, cache_ram=0,
                                        extra=extra, name=f"fleet-bench-{n}-{k}"))
        if target == "toki":
            default_bin = th.TOKI_BIN
            th.TOKI_BIN = toki_bin or default_bin
            try:
                toki = th.Toki(servers, mode=mode, ubatch=512, name=f"toki-fleet-bench-{n}",
                               extra=("--slot-dir", sd) if sd else ())
            finally:
                th.TOKI_BIN = default_bin
            send = toki_sender(toki.port, timeout=REQUEST_TIMEOUT)
        else:
            send = round_robin_sender([("127.0.0.1", s.port) for s in servers],
                                      timeout=REQUEST_TIMEOUT)
        # The reference is the harness's binary's: another binary (--against)
        # may have another schedule, and so other uncached answers.
        exact = target == "toki" and mode == "exact"
        checked = exact and not toki_bin
        results, wall = replay(requests, send, body_of=workload.body_of if exact else body_of,
                               stop_on_error=True)
        s = summarize(results, limit, wall)
        if per:
            s["over_limit"] = over_limit(requests, results, per)
        if checked:
            s["identical"] = sum(r is not None and r["status"] == 200 and
                                 common.answer_of(r) == (q["toki_reply"], q["toki_reply_logprobs"])
                                 for r, q in zip(results, requests))
        if toki:
            st = toki.stats()
            s["restores"], s["saves"] = st.get("restores"), st.get("saves")
            # No server died here: a backend marked down is a spurious one.
            s["down_events"] = toki.log_text().count(" is down: ")
    finally:
        common.stop(toki, *servers)
        if sd:
            shutil.rmtree(sd, ignore_errors=True)
    s.update(backends=n, target=target, slot_dir=bool(sd), load_start=load0,
             mode=mode if target == "toki" else None, pinned=pin)
    common.log(f"  {n} backend(s), {target}: {s['ok']}/{s['n']} ok, evaluated {s['evaluated']} "
               f"({s['eval_over_limit']:.2f}x limit), {s['req_per_s']:.2f} req/s, "
               f"{s['gen_tok_per_s']:.1f} tok/s, TTFT p50 {s['ttft_p50_ms']:.0f} ms, "
               f"wall {wall:.1f} s"
               + (f", identical {s['identical']}/{s['n']}" if "identical" in s else ""))
    for row in s.get("over_limit", []) if show else []:
        common.log("    request {} (session {}, {}): evaluated {}, its share {}; route {}, "
                   "{}, restored {}".format(*row))
    return s


def bench_fleet(counts=(1, 2, 3), slot_files=False, repeat=1, against=None, mode="fast",
                pin=False, show=False):
    """Every configuration `repeat` times, the repeats interleaved (this
    machine is shared and its speed drifts); the table gives medians.
    against: (label, binary) of another toki, run beside every toki
    configuration. mode: toki's --reuse (exact: each answer checked
    against toki's uncached one)."""
    model = model_path()
    requests, tokens, limit, ref_secs = reference(model)
    _, per = common.prefix_limit(tokens)
    if mode == "exact":
        # The servers' thread count is in their bits: the reference runs
        # with the same.
        workload.toki_reference("fleet", model, requests, 512,
                                **({"threads": PIN_THREADS} if pin else {}))
    kinds = {}
    for r in requests:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    common.log(f"fleet workload: {len(requests)} requests, {sum(map(len, tokens))} prompt tokens, "
               f"limit {limit}, uncached run {ref_secs:.1f} s")
    configs = []
    for n in counts:
        tokis = [(n, "toki", False, None)]
        if slot_files:
            tokis.append((n, "toki", True, None))
        if against:
            tokis += [(n, t, sd, against) for (n, t, sd, _) in tokis]
        configs += tokis[:1] + [(n, "round-robin", False, None)] + tokis[1:]
    runs = []
    for rep in range(repeat):
        for n, target, sd, other in configs:
            r = run_one(n, target, requests, limit, model, slot_dir=sd,
                        toki_bin=other[1] if other else None, mode=mode, pin=pin, per=per,
                        show=show)
            r["repeat"] = rep
            r["against"] = other[0] if other else None
            runs.append(r)
    med = common.median
    rows = []
    for n, target, sd, other in configs:
        rs = [r for r in runs if (r["backends"], r["target"], r["slot_dir"], r["against"]) ==
              (n, target, sd, other[0] if other else None)]
        walls = [r["wall_s"] for r in rs]
        rows.append([n, ((f"toki {mode} + slot files" if sd else f"toki {mode}")
                         + (f" ({other[0]})" if other else ""))
                     if target == "toki" else "round-robin",
                     med([r["req_per_s"] for r in rs]), med([r["gen_tok_per_s"] for r in rs]),
                     med([r["ttft_p50_ms"] for r in rs]), med([r["ttft_p95_ms"] for r in rs]),
                     med([r["evaluated"] for r in rs]), med([r["eval_over_limit"] for r in rs]),
                     f"{med(walls):.1f} ({min(walls):.1f}-{max(walls):.1f})",
                     f"{sum(r['ok'] for r in rs)}/{sum(r['n'] for r in rs)}",
                     (f"{sum(r['identical'] for r in rs)}/{sum(r['n'] for r in rs)}"
                      if all("identical" in r for r in rs) else ""),
                     sum(r.get("down_events", 0) for r in rs) if target == "toki" else "",
                     f"{min(r['load_start'] for r in rs):.1f}-"
                     f"{max(r['load_start'] for r in rs):.1f}"])
    t = common.table(["backends (-np 2 each)", "routing", "req/s", "gen tok/s", "TTFT p50 ms",
                      "TTFT p95 ms", "evaluated", "eval/limit",
                      f"wall s (min-max of {repeat})", "ok",
                      "identical to toki uncached (exact)", "backends marked down",
                      "load avg at start"], rows)
    md = (f"{len(requests)} requests ({', '.join(f'{v} {k}' for k, v in kinds.items())}), "
          f"{sum(map(len, tokens))} prompt tokens in all, longest prompt "
          f"{max(map(len, tokens))}, limit {limit} tokens; model {MODEL[1]} generated "
          f"(ctx {FLEET['per_slot_ctx']} a slot), -ub 512, `--cache-ram 0`"
          f"{', each server on a core of its own with -t 1 (--pin)' if pin else ''}. Medians of "
          f"{repeat} run{'s' if repeat > 1 else ''} per row, the repeats interleaved.\n\n{t}\n")
    return {"workload": {"requests": len(requests), "kinds": kinds, "limit": limit,
                         "prompt_tokens": sum(map(len, tokens)), "reference_s": ref_secs},
            "runs": runs, "markdown": md}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="1,2,3", help="backend counts (default 1,2,3)")
    ap.add_argument("--toki", default=os.path.join(common.SOURCE_DIR, "build", "toki"),
                    help="the toki binary (default build/toki; copied aside for the run)")
    ap.add_argument("--out", help="JSON results (default bench/results/fleet-DATE.json)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each configuration, interleaved; the table gives medians")
    ap.add_argument("--slot-files", action="store_true",
                    help="also toki with slot files (the servers share one --slot-save-path, "
                         "toki's --slot-dir)")
    ap.add_argument("--mode", choices=["fast", "exact"], default="fast",
                    help="toki's --reuse (default fast); exact checks every answer against "
                         "toki's uncached one, text and logprobs")
    ap.add_argument("--pin", action="store_true",
                    help="each server on a core of its own with one thread, as a host each "
                         "(needs a core per server)")
    ap.add_argument("--per-request", action="store_true",
                    help="print the requests over their share of the limit after each run")
    ap.add_argument("--against", metavar="OTHER",
                    help="another toki binary (an older build, say), run beside --toki in "
                         "every toki configuration, interleaved; its rows carry its path")
    args = ap.parse_args()
    if not os.access(args.toki, os.X_OK):
        sys.exit(f"no toki binary at {args.toki}: build it first")
    against = None
    if args.against:
        if not os.access(args.against, os.X_OK):
            sys.exit(f"no toki binary at {args.against}")
        import shutil
        import tempfile
        other = os.path.join(tempfile.mkdtemp(prefix="toki-bench-against-"), "toki")
        shutil.copy2(args.against, other)  # as --toki is: a rebuild cannot swap it
        against = (args.against, other)
    import signal
    # SIGTERM unwinds like Ctrl-C, so that the servers started are stopped.
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    common.use_toki_binary(args.toki)
    info = common.machine_info(args.toki)
    info["command"] = " ".join(["python3", "bench/bench_fleet.py"] + sys.argv[1:])
    t0 = time.perf_counter()
    r = bench_fleet(tuple(int(x) for x in args.backends.split(",")), args.slot_files,
                    args.repeat, against, args.mode, args.pin, args.per_request)
    info["total_s"] = time.perf_counter() - t0
    info["loadavg_end"] = common.loadavg()
    header = (f"## Fleet benchmark\n\n- date: {info['date']}\n- machine: {info.get('cpu')}, "
              f"{info['cores']} cores, {info.get('ram_gib')} GiB RAM (load average at start: "
              f"{info['loadavg_start']})\n- toki: commit {info['commit']}"
              f"{' (dirty working tree)' if info['dirty'] else ''}, {info['toki_version']}\n"
              f"- llama-server: {info['llama_server']}\n- command: `{info['command']}`\n"
              f"- total: {info['total_s']:.0f} s\n")
    print(header + "\n" + r["markdown"], flush=True)
    out = args.out or os.path.join(BENCH_DIR, "results",
                                   "fleet-" + time.strftime("%Y%m%d-%H%M%S") + ".json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"machine": info, "fleet": r}, f, indent=1, default=str)
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(header + "\n" + r["markdown"])
    common.log(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
