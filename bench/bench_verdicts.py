#!/usr/bin/env python3
"""Is exact mode's self-test verdict the same at every start?

A verdict other than "verified" (an "unknown", a failure) changes exact
mode's schedule (no steps without it: docs/exact.md), and so the answers. A
verdict that hangs on chance makes the same request's answer hang on its
server's start: the self-test's insert request once sampled at the server's
default temperature, and a byte token's NUL made toki refuse the answer, in
about 1 start of 15 of a random 24M model's (docs/benchmarks.md).

N managed starts (`toki serve --model FILE`, exact mode, a fresh state
folder each, so that no verdict kept from an earlier start is taken) of a
random-weight model, for each binary in turn; counts of each verdict.

With --another-client, the starts are of toki in front of one llama-server
the bench runs (`--backend`), where another client uses it during the
self-test (tests/integration/slow_backend.py, mode intrude, on the real
server): `same`, a request on the test's slot before a step that reuses
it; `beside`, a stream on the other slot that runs beside the test for
--beside-s seconds. Each start's answer bits are compared with a clean
start's (`bits` in /toki/stats: the same rows), and the test's seconds
counted (`--another-client none`: the cost of the test alone).

  python3 bench/bench_verdicts.py [--starts 40] [--params 24M] [--toki BIN] [--against OLD]
                                  [--another-client none|same|beside] [--beside-s 0.3]

Standard library only; uses tests/integration/toki_harness.py."""
import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import common as c

th = c.harness()


def exact_at_start(binary, args, env, while_starting=None):
    """`toki serve ARGS` with a fresh state folder: the backend's `exact`
    block of /toki/stats once it is up. while_starting() runs once toki
    listens."""
    state = tempfile.mkdtemp(prefix="toki-bench-verdict-")
    p = subprocess.Popen([binary, "serve", "--port", "0", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True,
                         env=dict(os.environ, TOKI_STATE_DIR=state, **env),
                         start_new_session=True)
    try:
        line = p.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"{binary} did not start: {line}")
        port = int(line.strip().rsplit(":", 1)[1])
        if while_starting:
            while_starting()
        th.wait_http(port, "/health", timeout=300)
        st, stats = th.request(port, "GET", "/toki/stats")
        if st != 200:
            raise RuntimeError(f"/toki/stats answered {st}")
        return stats["backends"][0]["exact"]
    finally:
        p.terminate()
        p.wait(60)
        shutil.rmtree(state, ignore_errors=True)


def start(binary, model):
    """One managed start."""
    return exact_at_start(binary, ["--model", model, "--name", "m", "--ctx", "2048"],
                          {"TOKI_LLAMA_SERVER": th.llama_server_path()})


def start_brought(binary, llama, client, beside_s):
    """One start in front of llama, another client at the self-test."""
    from slow_backend import SlowBackend
    proxy = SlowBackend(llama.url, mode="intrude")
    if client != "none":
        proxy.intrusions = 1
        proxy.intrude_slot = "same" if client == "same" else "other"
        proxy.intrude_hold = client == "beside"

    def leave_later():
        # The stream runs beside_s seconds from the test's first request.
        deadline = time.time() + 60
        while not proxy.intruded and time.time() < deadline:
            time.sleep(0.005)
        time.sleep(beside_s)
        proxy.release()

    try:
        return exact_at_start(binary, ["--backend", proxy.url], {},
                              leave_later if client == "beside" else None)
    finally:
        proxy.release()
        proxy.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=40)
    ap.add_argument("--params", default="24M")
    ap.add_argument("--toki")
    ap.add_argument("--against", help="an older toki, started in turn with --toki")
    ap.add_argument("--another-client", choices=("none", "same", "beside"))
    ap.add_argument("--beside-s", type=float, default=0.3)
    args = ap.parse_args()
    toki = c.use_toki_binary(args.toki or os.path.join(c.SOURCE_DIR, "build", "toki"))
    bins = {"toki": toki}
    if args.against:
        bins["--against"] = args.against
    model = th.generated_model("verdicts", args.params, ctx=4096, seed=1)
    counts = {label: collections.Counter() for label in bins}
    seconds = {label: [] for label in bins}
    llama = clean = None
    if args.another_client:
        # --context-shift: the other client's stream runs until it leaves.
        llama = th.LlamaServer(model=model, slots=2, ctx=2048, name="bench-verdicts",
                               extra=["--context-shift"])
        clean = start_brought(toki, llama, "none", 0)["bits"]
    try:
        for i in range(args.starts):
            for label, binary in bins.items():
                if llama:
                    ex = start_brought(binary, llama, args.another_client, args.beside_s)
                else:
                    ex = start(binary, model)
                verdict = (ex["verdict"].split(":")[0] if ex["selftest"] != "verified"
                           else "verified")
                key = (verdict, "steps" if ex["steps"] else "no steps")
                if clean:
                    key += ("clean bits" if ex["bits"] == clean else "other bits",
                            f"tries {ex.get('tries', 1)}")
                counts[label][key] += 1
                seconds[label].append(ex["seconds"])
            c.log(f"start {i + 1}: " + "; ".join(f"{label} {dict(n)}"
                                                 for label, n in counts.items()))
    finally:
        if llama:
            llama.kill()
    rows = []
    for label, n in counts.items():
        for key, k in sorted(n.items(), key=lambda kv: -kv[1]):
            rows.append([label, bins[label], *key, k,
                         f"{statistics.median(seconds[label]):.3f}"])
    head = ["binary", "path", "verdict", "steps"]
    if clean:
        head += ["bits", "tries"]
    print(c.table(head + ["starts", "self-test s (median, all)"], rows))


if __name__ == "__main__":
    main()
