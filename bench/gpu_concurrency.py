#!/usr/bin/env python3
"""Concurrency on one backend: what exact mode's one request at a time costs
beside llama-server alone and toki fast, with identity side by side.

Exact mode runs one request at a time per backend (llama-server batches the
tokens of concurrent slots together, which moves the micro-batch boundaries
and so the answers). On a GPU, batching four slots costs little more than
running one, so that is where exact mode gives up the most. This measures it:

  alone  llama-server -np 4 on its own
  fast   toki serve --reuse fast in front of a llama-server it starts (-np 4)
  exact  toki serve --reuse exact, the same

each on a fresh server with the same arguments (-ngl 99 by default). Four
agent sessions at once (threads), each a multi-turn conversation: a long
system prompt (a base all sessions share, as tool definitions are, plus a
session part), a user message a turn, the answer fed back; temperature 0,
logprobs, ignore_eos (every configuration generates the same token count),
no pause between turns. Per configuration: wall time (first request to last
answer), generated tokens and tokens/s, time to first token, prompt tokens
evaluated (timings.prompt_n summed; through toki the sum of its steps), and
identity: afterwards every request is sent again, one at a time, with
cache_prompt: false through the same configuration (toki's uncached answer
for exact and fast, llama-server's for alone), and the answers compared,
text and every logprob. Its time is the "serial uncached" column.

Exact mode is expected to be identical on every request; alone and fast may
not be (reported, not a failure). Exits 1 when exact mode was not identical
on every request or its self-test did not verify the backend, 2 on a usage
error or when something broke.

  TOKI_GPU_LLAMA_SERVER=/path/llama-server python3 bench/gpu_concurrency.py \\
      [--toki build/toki] [--models random,stories260K] [--params 350M] \\
      [--sessions 4] [--turns 5] [--max-tokens 96] [--json FILE]

Standard library only; the models come from `toki gguf gen` (cached under
~/.cache/tokirecur/test/) and ../shared/models/stories260K.gguf (else
$TOKI_TEST_MODEL, else a generated 1M model); logs go there too."""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import workload  # noqa: E402
from common import Client, answer_of, log, median, pct, stream_chat_retrying, table  # noqa: E402

CONFIGS = ("alone", "fast", "exact")
LABEL = {"alone": "llama-server alone", "fast": "toki fast", "exact": "toki exact"}


# ---- the workload ----

def sessions_of(args, seed=7):
    """Per session: its system prompt and its user messages, fixed before the
    run so that every configuration is sent the same user side. The answers
    fed back are each configuration's own."""
    rng = random.Random(seed)
    base_tok = int(args.system_tokens * 0.75)
    base = ("You are a coding agent. You can read, write and edit files, search the "
            "tree and run commands. Tools and rules follow.\n\n" +
            "\n\n".join(workload.text_of_tokens(rng, base_tok // 4) for _ in range(4)))
    out = []
    for s in range(args.sessions):
        srng = random.Random(seed * 100 + s)
        tail = int(args.system_tokens * 0.25 * (1 + s / 2))
        out.append({
            "system": base + f"\n\nSession {s}: the repository and the task.\n" +
                      workload.text_of_tokens(srng, tail),
            "users": [" ".join(workload.sentence(srng) for _ in range(srng.randint(2, 6)))
                      for _ in range(args.turns)],
        })
    return out


def body_of(msgs, args):
    return dict({"messages": msgs, "temperature": 0, "max_tokens": args.max_tokens,
                 "ignore_eos": True}, **workload.LOGPROBS)


# ---- the servers ----

class Server:
    """llama-server alone, or toki serve with a llama-server it manages
    (--model, --llama-server), on free ports; stop() ends both."""

    def __init__(self, config, model, args, tag):
        th = common.harness()
        self.config = config
        self.run_dir = None
        self.proc = None
        t0 = time.perf_counter()
        llama = ["-ub", str(args.ubatch), "--override-kv",
                 f"llama.context_length=int:{args.ctx}"] + list(args.llama_arg)
        env = dict(os.environ, **dict(kv.split("=", 1) for kv in args.llama_env))
        if config == "alone":
            # The same arguments toki gives the server it manages (cmd-serve.c,
            # start_managed), less --slot-save-path and --metrics.
            self.port = th.free_port()
            argv = [args.llama_server, "-m", model, "--host", "127.0.0.1", "--port",
                    str(self.port), "-np", str(args.sessions), "-c",
                    str(args.ctx * args.sessions), "--cache-ram", "0"] + llama
            self.proc = th.Process(argv, f"gpuconc-{tag}-alone-{self.port}.log", env=env)
        else:
            self.run_dir = tempfile.mkdtemp(prefix=f"gpuconc-{config}-", dir=th.WORK_DIR)
            argv = [th.TOKI_BIN, "serve", "--port", "0", "--reuse", config, "--model", model,
                    "--llama-server", args.llama_server, "--slots", str(args.sessions),
                    "--ctx", str(args.ctx), "--ubatch", str(args.ubatch),
                    "--run-dir", self.run_dir, "--slot-save-idle-ms", "0"]
            for a in llama:
                argv += ["--llama-arg", a]
            for kv in args.llama_env:
                argv += ["--llama-env", kv]
            self.proc = th.Process(argv, f"gpuconc-{tag}-{config}-{os.getpid()}.log")
            line = self.proc.proc.stdout.readline()
            if "listening on" not in line:
                raise RuntimeError(f"toki {config} did not start: {line}{self.proc.log_text()}")
            self.port = int(line.strip().rsplit(":", 1)[1])
        self.log_path = self.proc.log_path
        # toki answers /health with 200 once its backend is up: loaded, and
        # in exact mode self-tested (after the Vulkan remedy's restart, if
        # the first test failed).
        deadline = time.time() + args.start_timeout
        while True:
            if self.proc.proc.poll() is not None:
                raise RuntimeError(f"{config} exited at start:\n{self.proc.log_text()[-3000:]}")
            try:
                st, _ = th.request(self.port, "GET", "/health", timeout=5)
                if st == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"{config}: no /health in {args.start_timeout} s "
                                   f"(log {self.log_path})")
            time.sleep(0.1)
        self.start_s = time.perf_counter() - t0

    def stats(self):
        if self.config == "alone":
            return None
        return common.harness().request(self.port, "GET", "/toki/stats")[1]

    def stop(self):
        if self.proc is None:
            return
        # toki stops the llama-server it manages as it exits; SIGKILL would
        # leave that server running.
        self.proc.kill(signal.SIGKILL if self.config == "alone" else signal.SIGTERM)
        self.proc = None
        if self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)


def warm_up(port, sessions, args):
    """One uncached request the size of a first turn, before the clock starts:
    GPU backends compile their kernels at first use, and toki probes the
    server's prompts after a start; neither belongs to the concurrent run.
    Its text shares nothing with the sessions' (toki saves what a slot held:
    a warm-up on their shared base would hand the first turns a cache)."""
    c = Client(port)
    try:
        rng = random.Random(99)
        n = len(sessions[0]["system"])
        msgs = [{"role": "system", "content": "Warm-up. " + workload.text_of_tokens(
                    rng, int(n / workload.CHARS_PER_TOKEN))[:n]},
                {"role": "user", "content": "Warm up."}]
        r = stream_chat_retrying(c, dict(body_of(msgs, args), max_tokens=4, cache_prompt=False))
        if r["status"] != 200:
            raise RuntimeError(f"warm-up: {r}")
    finally:
        c.close()


# ---- one configuration ----

def run_config(config, model, tag, sessions, args):
    srv = Server(config, model, args, tag)
    try:
        warm_up(srv.port, sessions, args)
        st0 = srv.stats()
        recs, errors = [], []
        lock = threading.Lock()
        gate = threading.Barrier(len(sessions) + 1)

        def session(s):
            c = Client(srv.port)
            msgs = [{"role": "system", "content": sessions[s]["system"]}]
            try:
                gate.wait()
                for turn, user in enumerate(sessions[s]["users"]):
                    msgs = msgs + [{"role": "user", "content": user}]
                    body = body_of(msgs, args)
                    t0 = time.perf_counter()
                    r = stream_chat_retrying(c, body)
                    if r["status"] != 200 or not r["timings"]:
                        raise RuntimeError(f"{config} session {s} turn {turn}: {r}")
                    with lock:
                        recs.append({"session": s, "turn": turn, "t0": t0,
                                     "t1": time.perf_counter(), "ttft": r["ttft"],
                                     "prompt_n": r["timings"]["prompt_n"],
                                     "cache_n": r["timings"].get("cache_n"),
                                     "predicted_n": r["timings"]["predicted_n"],
                                     "answer": answer_of(r), "body": body,
                                     "cache": r["cache"], "failures": r["failures"]})
                    msgs = msgs + [{"role": "assistant", "content": r["text"]}]
            except Exception as e:  # reported after the join
                errors.append(repr(e))
                gate.abort()
            finally:
                c.close()

        threads = [threading.Thread(target=session, args=(s,), daemon=True)
                   for s in range(len(sessions))]
        for t in threads:
            t.start()
        gate.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        if errors:
            raise RuntimeError("; ".join(errors))
        st1 = srv.stats()
        # The reference: every request again, one at a time, uncached, through
        # the same server (toki: its own schedule from an empty slot).
        recs.sort(key=lambda r: (r["session"], r["turn"]))
        c = Client(srv.port)
        t_ref = time.perf_counter()
        ref_gen = 0
        try:
            for r in recs:
                j = stream_chat_retrying(c, dict(r["body"], cache_prompt=False))
                if j["status"] != 200 or not j["timings"]:
                    raise RuntimeError(f"{config} reference: {j}")
                ref_gen += j["timings"]["predicted_n"]
                r["ref_prompt_n"] = j["timings"]["prompt_n"]
                r["identical"] = answer_of(j) == r["answer"]
                r["same_text"] = answer_of(j)[0] == r["answer"][0]
                if not r["identical"] and config == "exact":
                    log(f"  exact: session {r['session']} turn {r['turn']} differs from "
                        f"toki's uncached answer: cache {r['cache']}; reference {j.get('cache')}")
        finally:
            c.close()
        ref_s = time.perf_counter() - t_ref
        st2 = srv.stats()
    finally:
        srv.stop()
    gen = sum(r["predicted_n"] for r in recs)
    ttft = [r["ttft"] * 1000 for r in recs]
    ex = ((st2 or {}).get("backends") or [{}])[0].get("exact") if st2 else None
    res = {
        "config": config, "label": LABEL[config], "start_s": srv.start_s, "wall_s": wall,
        "requests": len(recs), "generated": gen, "tokens_per_s": gen / wall,
        "ttft_p50_ms": median(ttft), "ttft_p95_ms": pct(ttft, 95),
        "evaluated": sum(r["prompt_n"] for r in recs),
        "prompt_tokens": sum(r["prompt_n"] + (r["cache_n"] or 0) for r in recs),
        "identical": sum(r["identical"] for r in recs),
        "same_text": sum(r["same_text"] for r in recs),
        "serial_uncached_s": ref_s, "serial_uncached_tokens_per_s": ref_gen / ref_s,
        "serial_uncached_evaluated": sum(r["ref_prompt_n"] for r in recs),
        "exact": ex, "log": srv.log_path,
        "tail_cut_tokens": ((st1 or {}).get("tail_cut_tokens", 0) -
                            (st0 or {}).get("tail_cut_tokens", 0)) if st1 else None,
        "records": [{k: v for k, v in r.items() if k != "body"} for r in recs],
    }
    if config == "exact":
        # "verified on this backend", or "... with GGML_VK_DISABLE_COOPMAT=1"
        # where toki applied the Vulkan remedy.
        res["not_verified_answers"] = sum(
            not str((r["cache"] or {}).get("exact", "")).startswith("verified on this backend")
            for r in recs)
    log(f"  {tag} {config}: start {srv.start_s:.1f} s, wall {wall:.1f} s, {gen} tokens, "
        f"{gen / wall:.1f} tok/s, evaluated {res['evaluated']}, identical "
        f"{res['identical']}/{len(recs)}, serial uncached {ref_s:.1f} s"
        + (f", self-test {ex['selftest']} ({ex['seconds']:.1f} s"
           f"{', remedy ' + ex['remedy'] if ex.get('remedy') else ''})" if ex else ""))
    return res


# ---- output ----

def markdown(tag, results):
    rows = []
    alone = results.get("alone")
    for config in CONFIGS:
        r = results.get(config)
        if not r:
            continue
        ex = r.get("exact") or {}
        st = (f"{ex['selftest']}" + (f", {ex['remedy']}" if ex.get("remedy") else "")
              if config == "exact" else "")
        rows.append([r["label"], r["requests"], r["generated"], r["wall_s"], r["tokens_per_s"],
                     r["tokens_per_s"] / alone["tokens_per_s"] if alone else float("nan"),
                     r["ttft_p50_ms"], r["ttft_p95_ms"], r["evaluated"],
                     r["tail_cut_tokens"] if r["tail_cut_tokens"] is not None else "",
                     r["serial_uncached_tokens_per_s"],
                     f"{r['identical']}/{r['requests']}", f"{r['same_text']}/{r['requests']}",
                     st])
    return (f"{tag}\n\n" + table(
        ["path", "requests", "generated tokens", "wall s", "generated tokens/s",
         "/ alone", "TTFT p50 ms", "TTFT p95 ms", "prompt evaluated", "tail cut tokens",
         "serial uncached tokens/s", "text + logprobs = uncached", "text = uncached",
         "exact self-test"], rows))


def info(args):
    def out(cmd):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            return " ".join((p.stdout + p.stderr).split())[:2000]
        except (OSError, subprocess.TimeoutExpired) as e:
            return repr(e)
    i = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cores": os.cpu_count(),
         "loadavg_start": common.loadavg(),
         "commit": out(["git", "-C", common.SOURCE_DIR, "rev-parse", "--short", "HEAD"]),
         "toki": out([common.harness().TOKI_BIN, "version"]),
         "llama_server": args.llama_server,
         "llama_server_version": out([args.llama_server, "--version"]),
         "devices": out([args.llama_server, "--list-devices"])}
    try:
        with open("/proc/cpuinfo") as f:
            i["cpu"] = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")),
                            None)
    except OSError:
        pass
    return i


def models_of(args):
    th = common.harness()
    out = []
    for m in args.models.split(","):
        m = m.strip()
        if m == "random":
            out.append((f"random {args.params}",
                        th.generated_model("gpuconc", params=args.params, ctx=max(8192, args.ctx))))
        elif m == "stories260K":
            out.append(("stories260K", th.test_model()))
        elif os.path.exists(m):
            out.append((os.path.basename(m), m))
        else:
            raise SystemExit(f"gpu_concurrency: --models: random, stories260K or a GGUF path, "
                             f"not {m!r}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--llama-server", default=os.environ.get("TOKI_GPU_LLAMA_SERVER"),
                    help="the llama-server to run (default $TOKI_GPU_LLAMA_SERVER)")
    ap.add_argument("--toki", default=os.environ.get("TOKI_BIN") or
                    os.path.join(common.SOURCE_DIR, "build", "toki"))
    ap.add_argument("--models", default="random,stories260K",
                    help="comma-separated: random (toki gguf gen --params), stories260K, "
                         "or GGUF paths (default random,stories260K)")
    ap.add_argument("--params", default="350M", help="the random model's size (default 350M)")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma-separated subset of alone,fast,exact")
    ap.add_argument("--sessions", type=int, default=4, help="sessions at once = slots (-np)")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--system-tokens", type=int, default=1200,
                    help="about this many tokens of system prompt (on the generated models' "
                         "vocabulary; more on stories260K's)")
    ap.add_argument("--ctx", type=int, default=8192,
                    help="context per slot (default 8192: stories260K's 512-token vocabulary "
                         "makes the default conversation about 4,500 tokens)")
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--ngl", default="99", help="-ngl for every server ('' for none)")
    ap.add_argument("--llama-arg", action="append", default=[],
                    help="another llama-server argument for every configuration (repeatable)")
    ap.add_argument("--llama-env", action="append", default=[],
                    help="K=V in every llama-server's environment (repeatable)")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--json", help="write everything measured here")
    args = ap.parse_args()
    if not args.llama_server:
        ap.error("name the llama-server: --llama-server or TOKI_GPU_LLAMA_SERVER")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not configs or any(c not in CONFIGS for c in configs):
        ap.error("--configs: a comma-separated subset of alone,fast,exact")
    if args.ngl:
        args.llama_arg = ["-ngl", args.ngl] + args.llama_arg
    common.use_toki_binary(args.toki)
    th = common.harness()
    os.makedirs(th.WORK_DIR, exist_ok=True)
    t_all = time.perf_counter()
    out = {"info": info(args), "args": vars(args), "models": {}}
    log(f"gpu_concurrency: {args.llama_server}, {args.sessions} sessions x {args.turns} turns, "
        f"max_tokens {args.max_tokens}, llama-server args {' '.join(args.llama_arg)}")
    sessions = sessions_of(args)
    tables = []
    failed = []
    broke = None

    def save():
        """The JSON so far: written after each model, so that a run stopped
        at its time limit still leaves what it measured."""
        out["seconds"] = time.perf_counter() - t_all
        out["failed"] = failed
        out["broke"] = broke
        out["markdown"] = "\n\n".join(tables)
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump(out, f, indent=1)
            os.replace(args.json + ".tmp", args.json)

    def terminated(sig, frame):
        # timeout(1) sends SIGTERM: unwind, so that every server started
        # here is stopped (they run in sessions of their own) and the JSON
        # says how far the run came.
        raise KeyboardInterrupt(f"signal {sig}")
    signal.signal(signal.SIGTERM, terminated)
    try:
        for mname, model in models_of(args):
            results = {}
            out["models"][mname] = {"path": model, "results": results}
            for config in configs:
                results[config] = run_config(config, model, mname.replace(" ", "-"), sessions,
                                             args)
            tables.append(markdown(f"### {mname}: {args.sessions} sessions x {args.turns} turns, "
                                   f"max_tokens {args.max_tokens}", results))
            print(tables[-1] + "\n", flush=True)
            ex = results.get("exact")
            if ex and (ex["identical"] != ex["requests"] or ex["not_verified_answers"] or
                       (ex["exact"] or {}).get("selftest") != "verified"):
                failed.append(f"{mname}: exact {ex['identical']}/{ex['requests']} identical, "
                              f"self-test {(ex['exact'] or {}).get('selftest')}: "
                              f"{(ex['exact'] or {}).get('verdict')}")
            save()
    except (Exception, KeyboardInterrupt) as e:  # the tables so far, then the failure
        broke = f"{type(e).__name__}: {e}"
        log(f"gpu_concurrency: broke: {broke}")
    save()
    print(f"({out['seconds']:.0f} s; llama-server {out['info']['llama_server_version'][:120]})")
    if args.json:
        print(f"JSON: {args.json}")
    for f in failed:
        print(f"gpu_concurrency: FAILED: {f}", file=sys.stderr)
    if broke:
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
