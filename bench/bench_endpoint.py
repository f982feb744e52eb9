#!/usr/bin/env python3
"""Issue 33's targets for the endpoint (`toki up`: one port, every registry
model, models taking turns), side by side in one run:

  swap     an agent trace that alternates two models: evaluated tokens
           (llama-server's own timings.prompt_n) with TOKI_MAX_LOADED=1
           against both models loaded at once, llama-swap's behaviour (the
           same swaps with nothing kept: each model's slot files removed
           before it starts again) and llama-server alone (one server per
           model, both running); identity of every turn against the same
           request uncached (cache_prompt: false), text and every logprob;
           the seconds a swap adds to the request that causes it.
  latency  everything warm: p50 of /tokenize and of a 1-token chat through
           the endpoint against a single-model toki (`toki up --model
           FILE`), interleaved.
  turns    two agents at once, each on a model of its own, both models on
           the CPU: every request's seconds and the wall time until both are
           done, through the endpoint (models on the CPU take turns),
           through --against's endpoint (an older toki, which relays both at
           once), two llama-servers alone at once, and each the agents one
           after the other (the work itself); the answers of both endpoints
           compared, text and logprobs. With --keeps the requests ask for no
           logprobs and send top_k 0, so that toki cannot read the answer's
           token ids and keeps its rows after each answer by its text (a keep
           evaluates where that re-tokenizes otherwise): the work after an
           answer, which the CPU turn waits for since 671fbb2; answers are
           then compared by their text. With --threads N, the same with
           both models given -t N (their registry args), where two models
           whose threads fit the CPUs together share the turn, and two
           llama-servers alone at -t N.
  soak     --soak-s seconds, 3 models, a memory cap (TOKI_MEMORY_MB) that
           fits 2, 8 clients, a random llama-server killed every 5-15 s:
           requests lost (failed with no kill of their model's server while
           they ran), the endpoint's RSS and open fds after the warm-up and
           at the end, and llama-servers left after `toki down`.

  python3 bench/bench_endpoint.py [swap] [latency] [turns] [soak] [--quick]
      [--soak-s 600] [--toki BIN | --build-head] [--against OLD_BIN] [--keeps]
      [--threads N] [--out F.json]
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import common as c

th = c.harness()


def conversations(seed, count, turns):
    sys.path.insert(0, os.path.join(c.SOURCE_DIR, "tests", "integration"))
    from test_exact_identity import conversations as convs
    return convs(seed, count, turns)


def answer(resp):
    ch = resp["choices"][0]
    probs = [(p["token"], p["logprob"]) for p in (ch.get("logprobs") or {}).get("content") or []]
    return ch["message"]["content"], probs


class Endpoint:
    """A `toki up` with a registry of its own, in a state folder of its own."""

    def __init__(self, models, env_extra=None, single=None, ctx=2048, binary=None, args=()):
        self.binary = binary or th.TOKI_BIN
        self.tmp = tempfile.mkdtemp(prefix="toki-bench-ep-")
        self.state = os.path.join(self.tmp, "state")
        self.env = dict(os.environ, TOKI_STATE_DIR=self.state,
                        TOKI_MODEL_REGISTRY=os.path.join(self.tmp, "models.yaml"),
                        TOKI_LLAMA_SERVER=th.llama_server_path())
        self.env.pop("TOKI_MAX_LOADED", None)
        self.env.pop("TOKI_MEMORY_MB", None)
        self.env.update(env_extra or {})
        with open(self.env["TOKI_MODEL_REGISTRY"], "w") as f:
            f.write("models:\n")
            for name, path in models.items():
                f.write("  %s:\n    path: %s\n    ctx: %d\n" % (name, path, ctx))
                if args:
                    f.write("    args: %s\n" % json.dumps(list(args)))
            f.write("active: %s\n" % next(iter(models)))
        self.port = th.free_port()
        args = ["up", "--port", str(self.port)]
        if single:
            args += ["--model", single, "--ctx", str(ctx)]
        r = self.toki(*args)
        if r.returncode != 0:
            raise RuntimeError("toki up: " + r.stdout + r.stderr)

    def toki(self, *args):
        return subprocess.run([self.binary, *args], capture_output=True, text=True,
                              env=self.env, timeout=300)

    def slots_dir(self, name):
        return os.path.join(self.state, "run", name, "slots")

    def pid(self):
        """The endpoint's own process (toki serve --registry)."""
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read()
            except OSError:
                continue
            if (b"--registry" in cmd and b"serve" in cmd
                    and self.state.encode() in env):
                return int(pid)
        return None

    def processes(self, what=b"llama-server"):
        found = []
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ")
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if what in cmd and self.tmp.encode() in cmd and state != "Z":
                found.append((int(pid), cmd.decode(errors="replace")))
        return found

    def down(self):
        r = self.toki("down")
        return r.returncode

    def close(self):
        self.down()
        shutil.rmtree(self.tmp, ignore_errors=True)


def chat_body(model, msgs, **kw):
    b = {"messages": msgs, "max_tokens": 16, "temperature": 0, "logprobs": True}
    if model:
        b["model"] = model
    b.update(kw)
    return b


def run_trace(port, trace, model_names, before=None):
    """Sends the trace's turns in order: (model, conversation, turn). Each
    conversation's history grows with its answers. Returns a record per
    request."""
    cl = c.Client(port)
    hist = {}
    out = []
    for model, conv, turn, system, user in trace:
        h = hist.setdefault((model, conv), [{"role": "system", "content": system}])
        h.append({"role": "user", "content": user})
        if before:
            before(model)
        t0 = time.perf_counter()
        st, r = cl.json("POST", "/v1/chat/completions",
                        chat_body(model_names.get(model), h))
        dt = time.perf_counter() - t0
        if st != 200:
            raise RuntimeError(f"{model} turn {turn}: {st} {r}")
        text, probs = answer(r)
        out.append({"model": model, "conv": conv, "turn": turn, "seconds": dt,
                    "evaluated": r["timings"]["prompt_n"],
                    "route": (r.get("cache") or {}).get("route"),
                    "body": chat_body(model_names.get(model), list(h)),
                    "text": text, "probs": probs})
        h.append({"role": "assistant", "content": text})
    cl.close()
    return out


def uncached_identity(port, recs):
    cl = c.Client(port)
    same = 0
    for rec in recs:
        st, r = cl.json("POST", "/v1/chat/completions", dict(rec["body"], cache_prompt=False))
        if st == 200 and answer(r) == (rec["text"], rec["probs"]):
            same += 1
    cl.close()
    return same


def bench_swap(args, models, res):
    turns = 3 if args.quick else 6
    convs = {m: conversations(seed, 2, turns) for m, seed in (("a", 31), ("b", 32))}
    trace = []
    for t in range(turns):
        for k in range(2):
            for m in ("a", "b"):
                system, users = convs[m][k]
                trace.append((m, k, t, system[:1500], users[t][:300]))
    names = {"a": "a", "b": "b"}
    rows = {}

    c.log("swap: TOKI_MAX_LOADED=1 (slot files carry the states)")
    ep = Endpoint(models, {"TOKI_MAX_LOADED": "1"})
    try:
        rec = run_trace(ep.port, trace, names)
        same = uncached_identity(ep.port, rec)
        rows["cap1"] = (rec, same)
    finally:
        ep.close()

    c.log("swap: both loaded")
    ep = Endpoint(models)
    try:
        rec = run_trace(ep.port, trace, names)
        rows["both"] = (rec, uncached_identity(ep.port, rec))
    finally:
        ep.close()

    c.log("swap: llama-swap's behaviour (cap 1, nothing kept across a swap)")
    ep = Endpoint(models, {"TOKI_MAX_LOADED": "1"})

    def forget(model):
        d = ep.slots_dir(model)
        if os.path.isdir(d):
            for f in os.listdir(d):
                os.unlink(os.path.join(d, f))
    try:
        rec = run_trace(ep.port, trace, names, before=forget)
        rows["swap"] = (rec, None)
    finally:
        ep.close()

    c.log("swap: llama-server alone, one per model")
    servers = {}
    try:
        ports = {}
        for m, path in models.items():
            ports[m] = th.free_port()
            servers[m] = subprocess.Popen(
                [th.llama_server_path(), "-m", path, "--port", str(ports[m]), "-c", "2048",
                 "-np", "1", "--host", "127.0.0.1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for m in models:
            th.wait_http(ports[m], "/health", timeout=120)
        rec = []
        for item in trace:
            rec += run_trace_alone(ports, item, rec)
        same = 0
        for r_ in rec:
            cl = c.Client(ports[r_["model"]])
            st, r = cl.json("POST", "/v1/chat/completions", dict(r_["body"], cache_prompt=False))
            cl.close()
            if st == 200 and answer(r) == (r_["text"], r_["probs"]):
                same += 1
        rows["alone"] = (rec, same)
    finally:
        for p in servers.values():
            p.kill()
            p.wait()

    n = len(trace)
    both = sum(r["evaluated"] for r in rows["both"][0])
    extra = sorted(a["seconds"] - b["seconds"] for a, b in zip(rows["cap1"][0], rows["both"][0])
                   if a["route"] is not None)
    routes = {}
    for r in rows["cap1"][0]:
        routes[r["route"]] = routes.get(r["route"], 0) + 1
    table = []
    for key, label in (("alone", "llama-server alone (a server per model)"),
                       ("both", "toki endpoint, both loaded"),
                       ("cap1", "toki endpoint, TOKI_MAX_LOADED=1"),
                       ("swap", "llama-swap's behaviour (cap 1, nothing kept)")):
        rec, same = rows[key]
        ev = sum(r["evaluated"] for r in rec)
        table.append([label, n, ev, f"{ev / both:.3f}",
                      "n/a" if same is None else f"{same}/{n}"])
    res["swap"] = {"requests": n, "turns": turns, "routes_cap1": routes,
                   "swap_extra_s": {"median": c.median(extra), "p90": c.pct(extra, 90),
                                    "n": len(extra)},
                   "rows": {k: {"evaluated": sum(r["evaluated"] for r in v[0]),
                                "identical": v[1],
                                "requests": [{k2: r[k2] for k2 in
                                              ("model", "conv", "turn", "seconds", "evaluated",
                                               "route")} for r in v[0]]}
                            for k, v in rows.items()}}
    md = c.table(["run", "requests", "evaluated", "× both loaded", "identical to uncached"],
                 table)
    md += ("\n\nroutes with TOKI_MAX_LOADED=1: %s; every request swaps. The seconds a swap "
           "adds (cap 1 minus both loaded, same request): median %.2f s, p90 %.2f s.\n"
           % (routes, c.median(extra), c.pct(extra, 90)))
    return md


def run_trace_alone(ports, item, done):
    """One turn of the trace straight to its model's own llama-server."""
    model, conv, turn, system, user = item
    h = [{"role": "system", "content": system}]
    for r in done:
        if r["model"] == model and r["conv"] == conv:
            h = list(r["body"]["messages"]) + [{"role": "assistant", "content": r["text"]}]
    h.append({"role": "user", "content": user})
    cl = c.Client(ports[model])
    body = chat_body(None, h)
    st, r = cl.json("POST", "/v1/chat/completions", body)
    cl.close()
    if st != 200:
        raise RuntimeError(f"llama-server {model}: {st} {r}")
    text, probs = answer(r)
    return [{"model": model, "conv": conv, "turn": turn, "seconds": 0.0,
             "evaluated": r["timings"]["prompt_n"], "route": None, "body": body,
             "text": text, "probs": probs}]


def bench_latency(args, models, res):
    n = 60 if args.quick else 300
    path = models["a"]
    ep = Endpoint(models)
    one = Endpoint({"a": path}, single=path)
    try:
        out = {}
        clients = {"endpoint": c.Client(ep.port), "single": c.Client(one.port)}
        tok = {"content": "Once upon a time there was a little dog"}
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                "temperature": 0}
        for name, cl in clients.items():  # warm: both models loaded, connections open
            for m in ("a", "b") if name == "endpoint" else ("a",):
                cl.json("POST", "/tokenize", dict(tok, model=m))
                cl.json("POST", "/v1/chat/completions", dict(chat, model=m))
        for route, body in (("/tokenize", tok), ("/v1/chat/completions", chat)):
            times = {"endpoint": [], "single": []}
            for i in range(n):
                order = ("endpoint", "single") if i % 2 == 0 else ("single", "endpoint")
                for name in order:
                    t0 = time.perf_counter()
                    st, r = clients[name].json("POST", route, dict(body, model="a"))
                    times[name].append((time.perf_counter() - t0) * 1000)
                    if st != 200:
                        raise RuntimeError(f"{name} {route}: {st} {r}")
            out[route] = {k: {"p50": c.median(v), "p90": c.pct(v, 90)} for k, v in times.items()}
        for cl in clients.values():
            cl.close()
    finally:
        ep.close()
        one.close()
    res["latency"] = {"samples": n, "routes": out}
    rows = [[route, n, v["single"]["p50"], v["endpoint"]["p50"],
             v["endpoint"]["p50"] - v["single"]["p50"], v["single"]["p90"], v["endpoint"]["p90"]]
            for route, v in out.items()]
    return c.table(["route", "samples", "single-model p50 ms", "endpoint p50 ms",
                    "endpoint − single p50 ms", "single p90 ms", "endpoint p90 ms"], rows) + "\n"


def turns_agent(port, model, prompts, tokens, out, t0, keeps=False):
    """One agent: its requests one after another, each timed. keeps: no
    logprobs and top_k 0 (toki keeps each answer by its text)."""
    cl = c.Client(port)
    for k, p in enumerate(prompts):
        body = chat_body(model, [{"role": "user", "content": p}], max_tokens=tokens,
                         ignore_eos=True)
        if keeps:
            del body["logprobs"]
            body["top_k"] = 0
        s = time.perf_counter()
        st, r = cl.json("POST", "/v1/chat/completions", body)
        if st != 200:
            raise RuntimeError(f"{model} on {port}: {st} {r}")
        out.append({"model": model, "k": k, "seconds": time.perf_counter() - s,
                    "end": time.perf_counter() - t0, "answer": answer(r)})
    cl.close()


def turns_run(ports, prompts, tokens, together=True, keeps=False):
    """Both agents (ports: model -> (port, name sent)); returns (wall s, records)."""
    recs = []
    t0 = time.perf_counter()
    ts = [threading.Thread(target=turns_agent,
                           args=(port, name, prompts[m], tokens, recs, t0, keeps))
          for m, (port, name) in ports.items()]
    for t in ts:
        t.start()
        if not together:
            t.join()
    for t in ts:
        t.join()
    if len(recs) != sum(len(p) for p in prompts.values()):
        raise RuntimeError("a request failed (see above)")
    return time.perf_counter() - t0, recs


def bench_turns(args, models, res):
    n, tokens = (3, 64) if args.quick else (6, 128)
    paths = {"a": th.generated_model("ep-turn-a", "24M", ctx=4096, seed=1),
             "b": th.generated_model("ep-turn-b", "24M", ctx=4096, seed=2)}
    rng = random.Random(7)
    words = "the a little dog ran over hill and far away to see sun moon".split()
    prompts = {m: [" ".join(rng.choice(words) for _ in range(200)) for _ in range(n)]
               for m in paths}
    rows, out = [], {}
    eps = [("endpoint", None, True, ()), ("endpoint, one after the other", None, False, ())]
    if args.against:
        eps.append(("endpoint (--against)", args.against, True, ()))
    t_args = ("-t", str(args.threads)) if args.threads else ()
    if args.threads:
        # Models whose threads fit the CPUs together share the turn.
        eps += [(f"endpoint, -t {args.threads} each", None, True, t_args),
                (f"endpoint, -t {args.threads} each, one after the other", None, False, t_args)]
        if args.against:
            eps.append((f"endpoint (--against), -t {args.threads} each", args.against, True,
                        t_args))
    for label, binary, together, m_args in eps:
        ep = Endpoint(paths, binary=binary, args=m_args)
        try:
            for m in paths:  # both loaded before the clock starts
                st, r = c.Client(ep.port).json("POST", "/v1/chat/completions", chat_body(
                    m, [{"role": "user", "content": "hi"}], max_tokens=1))
                if st != 200:
                    raise RuntimeError(f"{label} {m}: {st} {r}")
            wall, recs = turns_run({m: (ep.port, m) for m in paths}, prompts, tokens, together,
                                   args.keeps)
            st, stats = th.request(ep.port, "GET", "/toki/stats")
            waits = sum(x.get("turn_waits", 0) for x in stats["models"])
            settle = sum(x.get("settle_s", 0) for x in stats["models"])
            # What the models' toki serves kept after their answers.
            kept = {}
            for x in stats["models"]:
                st, ms = th.request(x["port"], "GET", "/toki/stats")
                kept[x["name"]] = {k: ms.get(k) for k in ("answers_kept", "tail_cuts",
                                                           "tail_cut_tokens")}
            # What each model's exact mode decided at its start: answers
            # of two endpoints differ where a schedule does.
            verdicts = {}
            for m in paths:
                with open(os.path.join(ep.state, "run", m, "serve.log")) as f:
                    verdicts[m] = [ln.split(" exact: ", 1)[1].strip() for ln in f
                                   if " exact: " in ln]
        finally:
            ep.close()
        out[label] = {"wall": wall, "recs": recs, "turn_waits": waits, "exact": verdicts,
                      "settle_s": settle, "kept": kept}
    alones = [("", ())] + ([(f", -t {args.threads} each", t_args)] if args.threads else [])
    for suffix, extra in alones:
        servers = {m: th.LlamaServer(model=p, slots=2, ctx=4096, name=f"turn-{m}", extra=extra)
                   for m, p in paths.items()}
        try:
            ports = {m: (s.port, None) for m, s in servers.items()}
            for label, together in (("llama-server alone, both at once", True),
                                    ("llama-server alone, one after the other", False)):
                wall, recs = turns_run(ports, prompts, tokens, together, args.keeps)
                out[label + suffix] = {"wall": wall, "recs": recs, "turn_waits": None}
        finally:
            for s in servers.values():
                s.kill()
    base = out["endpoint, one after the other"]["wall"]
    for label, o in out.items():
        secs = [r["seconds"] for r in o["recs"]]
        rows.append([label, f"{o['wall']:.2f}", f"{o['wall'] / base:.2f}", f"{c.median(secs):.2f}",
                     f"{max(secs):.2f}", "" if o["turn_waits"] is None else o["turn_waits"],
                     "" if o.get("settle_s") is None else f"{o['settle_s']:.3f}"])
    same = None
    if args.against:
        key = lambda o: {(r["model"], r["k"]): r["answer"] for r in o["recs"]}
        new, old = key(out["endpoint"]), key(out["endpoint (--against)"])
        same = sum(new[k] == old[k] for k in new)
        for k in new:  # where they part: the request and its first token that differs
            if new[k] != old[k]:
                a, b = new[k][1], old[k][1]
                at = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
                c.log(f"turns: {k} differs at token {at}: {a[at] if at is not None else ''} "
                      f"against {b[at] if at is not None else ''}")
    shared_same = None
    if args.threads:
        # Sharing the CPUs changes no answer: the same requests one after
        # the other give the same text and logprobs.
        key = lambda o: {(r["model"], r["k"]): r["answer"] for r in o["recs"]}
        at_once = key(out[f"endpoint, -t {args.threads} each"])
        apart = key(out[f"endpoint, -t {args.threads} each, one after the other"])
        shared_same = sum(at_once[k] == apart[k] for k in at_once)
    res["turns"] = {"requests": 2 * n, "tokens": tokens,
                    "identical_shared_apart": shared_same,
                    "keeps": args.keeps,
                    "rows": {k: {"wall": v["wall"], "turn_waits": v["turn_waits"],
                                 "exact": v.get("exact"), "settle_s": v.get("settle_s"),
                                 "kept": v.get("kept"),
                                 "seconds": [r["seconds"] for r in v["recs"]]}
                             for k, v in out.items()},
                    "identical_new_old": same}
    text = c.table(["path", "wall s (both agents done)", "× the endpoint one after the other",
                    "request p50 s", "request max s", "turn waits",
                    "turn held after answers s"], rows) + "\n"
    what = "text" if args.keeps else "text and logprobs"
    if shared_same is not None:
        text += (f"\nAnswers, -t {args.threads} at once against one after the other: "
                 f"{shared_same}/{2 * n} identical ({what}).\n")
    if same is not None:
        text += f"\nAnswers, endpoint against --against: {same}/{2 * n} identical ({what}).\n"
    return text


def fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def bench_soak(args, models3, res):
    # Sized first: what one model holds, so that the cap fits two, not three.
    ep = Endpoint(models3)
    try:
        cl = c.Client(ep.port)
        cl.json("POST", "/tokenize", {"model": "a", "content": "hi"})
        st, stats = cl.json("GET", "/toki/stats")
        used = [m["memory_bytes"] for m in stats["models"] if m["name"] == "a"][0]
        cl.close()
    finally:
        ep.close()
    # toki keeps 1.5 GiB of the machine free (test_endpoint: 1540 MiB fits one
    # 2.5 MiB model); 2.5 models' worth above that fits two, not three.
    cap_mb = 1536 + int(2.5 * used / (1 << 20)) + 1
    c.log(f"soak: {args.soak_s} s, a model holds {used / (1 << 20):.1f} MiB, "
          f"TOKI_MEMORY_MB={cap_mb}")
    ep = Endpoint(models3, {"TOKI_MEMORY_MB": str(cap_mb)})
    kills = []  # (time, model)
    lock = threading.Lock()
    outcomes = []  # (model, start, end, ok, status, route)
    stop_at = time.time() + args.soak_s
    rng = random.Random(7)
    try:
        cl = c.Client(ep.port)
        for m in models3:  # warm-up: each model loaded once
            cl.json("POST", "/tokenize", {"model": m, "content": "hi"})
        cl.close()
        pid = ep.pid()
        rss0, fd0 = c.proc_status(pid).get("VmRSS"), fds(pid)

        def client(k):
            r = random.Random(100 + k)
            cl = c.Client(ep.port, timeout=300)
            while time.time() < stop_at:
                m = r.choice(list(models3))
                kind = r.choice(["chat", "chat", "stream", "tokenize"])
                t0 = time.time()
                try:
                    if kind == "tokenize":
                        st, body = cl.json("POST", "/tokenize",
                                           {"model": m, "content": "Once upon a time %d" % k})
                        ok = st == 200 and "tokens" in body
                    elif kind == "chat":
                        st, body = cl.json("POST", "/v1/chat/completions",
                                           {"model": m, "max_tokens": 8, "messages": [
                                               {"role": "user", "content": "tell %d" % k}]})
                        ok = st == 200 and "choices" in body
                    else:
                        out = cl.stream_chat({"model": m, "max_tokens": 8, "messages": [
                            {"role": "user", "content": "stream %d" % k}]})
                        st = out["status"]
                        # The last chunk carries llama-server's timings (an
                        # error event does not).
                        ok = st == 200 and out["timings"] is not None
                except Exception as e:  # a broken connection: failed
                    st, ok = repr(e)[:80], False
                    cl.close()
                with lock:
                    outcomes.append((m, t0, time.time(), ok, st, kind))

        def killer():
            while time.time() < stop_at - 5:
                time.sleep(rng.uniform(5, 15))
                procs = ep.processes()
                if not procs:
                    continue
                pid_, cmd = rng.choice(procs)
                m = re.search(r"/([abc])\.gguf", cmd)
                try:
                    os.kill(pid_, signal.SIGKILL)
                except OSError:
                    continue
                with lock:
                    kills.append((time.time(), m.group(1) if m else "?"))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        threads.append(threading.Thread(target=killer))
        for t in threads:
            t.start()
        samples = []
        while any(t.is_alive() for t in threads):
            time.sleep(5)
            samples.append((time.time(), c.proc_status(pid).get("VmRSS"), fds(pid)))
        for t in threads:
            t.join()
        rss1, fd1 = c.proc_status(pid).get("VmRSS"), fds(pid)
        down_rc = ep.down()
        left = ep.processes() + ep.processes(b"toki")
    finally:
        ep.close()

    failed = [o for o in outcomes if not o[3]]

    def killed_during(o):
        # A kill of its model's server while it ran (2 s of grace: the
        # server's death reaches toki after the kill).
        return any(o[0] == m and o[1] - 1 <= t <= o[2] + 2 for t, m in kills)
    in_flight = [o for o in failed if killed_during(o)]
    lost = [o for o in failed if not killed_during(o)]
    res["soak"] = {"seconds": args.soak_s, "cap_mb": cap_mb, "model_mib": used / (1 << 20),
                   "requests": len(outcomes), "failed": len(failed),
                   "failed_in_flight": len(in_flight), "lost": len(lost),
                   "lost_detail": [list(o) for o in lost[:20]], "kills": len(kills),
                   "rss_kib": [rss0, rss1], "fds": [fd0, fd1], "samples": samples,
                   "down_rc": down_rc, "left_after_down": left}
    rows = [[args.soak_s, len(outcomes), len(kills), len(in_flight), len(lost),
             f"{rss0} → {rss1}", f"{fd0} → {fd1}", len(left)]]
    return c.table(["seconds", "requests", "servers killed", "failed in flight (a kill)",
                    "lost", "endpoint RSS KiB", "endpoint fds", "processes left after down"],
                   rows) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", nargs="*", default=["swap", "latency", "turns", "soak"])
    ap.add_argument("--against", help="an older toki: its endpoint in the turns table")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=0,
                    help="turns: rows with both models (and llama-servers alone) at -t N too")
    ap.add_argument("--keeps", action="store_true",
                    help="turns: no logprobs, top_k 0: toki keeps answers by their text")
    ap.add_argument("--soak-s", type=int, default=600)
    ap.add_argument("--toki")
    ap.add_argument("--build-head", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.build_head:
        sys.path.insert(0, c.BENCH_DIR)
        import run as runner
        args.toki = runner.build_head()
    toki = c.use_toki_binary(args.toki or os.path.join(c.SOURCE_DIR, "build", "toki"))
    info = c.machine_info(toki)
    if args.toki:
        d = os.path.dirname(os.path.dirname(os.path.abspath(args.toki)))
        if os.path.exists(os.path.join(d, "COMMIT")):
            with open(os.path.join(d, "COMMIT")) as f:
                info["commit"] = f.read().strip()[:12]
            info["dirty"] = False
    models = {"a": th.generated_model("ep-a", "4M", ctx=4096, seed=1),
              "b": th.generated_model("ep-b", "4M", ctx=4096, seed=2)}
    models3 = dict(models, c=th.generated_model("ep-c", "4M", ctx=4096, seed=3))
    # The soak's kills find a model's server by its file name: a.gguf, b.gguf, c.gguf.
    tmpd = tempfile.mkdtemp(prefix="toki-bench-models-")
    for m, p in list(models3.items()):
        dst = os.path.join(tmpd, m + ".gguf")
        shutil.copy(p, dst)
        models3[m] = dst
    res = {"machine": info, "quick": args.quick}
    md = [f"commit {info['commit']}{' (dirty)' if info.get('dirty') else ''}, "
          f"{info.get('cpu')}, {info['cores']} cores, {info.get('ram_gib')} GiB, "
          f"{info['llama_server']}, {info['date']}\n"]
    out = args.out or os.path.join(c.BENCH_DIR, "results",
                                   time.strftime("endpoint-%Y%m%d-%H%M%S.json"))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    for w in args.which:
        t0 = time.time()
        c.log(f"== {w}")
        part = {"swap": bench_swap, "latency": bench_latency, "turns": bench_turns,
                "soak": bench_soak}[w](args, models3 if w == "soak" else models, res)
        md.append(f"### {w} ({time.time() - t0:.0f} s)\n\n{part}")
        print(md[-1], flush=True)
        with open(out, "w") as f:  # after each part: a later one may fail
            json.dump(res, f, indent=1)
        with open(os.path.splitext(out)[0] + ".md", "w") as f:
            f.write("\n".join(md))
    shutil.rmtree(tmpd, ignore_errors=True)
    c.log(f"wrote {out}")
    ok = True
    if "swap" in res:
        r = res["swap"]["rows"]
        ok &= r["cap1"]["evaluated"] <= 1.05 * r["both"]["evaluated"]
        ok &= r["cap1"]["identical"] == res["swap"]["requests"]
    if "latency" in res:
        ok &= all(v["endpoint"]["p50"] - v["single"]["p50"] <= 0.5
                  for v in res["latency"]["routes"].values())
    if "turns" in res:
        # Toki must not be the slower way to run two models on the CPU.
        r = res["turns"]["rows"]
        ok &= r["endpoint"]["wall"] <= 1.10 * r["endpoint, one after the other"]["wall"]
        ok &= r["endpoint"]["wall"] <= r["llama-server alone, both at once"]["wall"]
    if "soak" in res:
        s = res["soak"]
        ok &= s["lost"] == 0 and not s["left_after_down"]
        ok &= s["rss_kib"][1] <= s["rss_kib"][0] * 1.05 and s["fds"][1] <= s["fds"][0] * 1.05
    print("targets met" if ok else "targets NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
