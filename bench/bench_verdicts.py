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

  python3 bench/bench_verdicts.py [--starts 40] [--params 24M] [--toki BIN] [--against OLD]

Standard library only; uses tests/integration/toki_harness.py."""
import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile

import common as c

th = c.harness()


def start(binary, model):
    """One managed start: the backend's `exact` block of /toki/stats."""
    state = tempfile.mkdtemp(prefix="toki-bench-verdict-")
    env = dict(os.environ, TOKI_STATE_DIR=state, TOKI_LLAMA_SERVER=th.llama_server_path())
    p = subprocess.Popen([binary, "serve", "--port", "0", "--model", model, "--name", "m",
                          "--ctx", "2048"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True)
    try:
        line = p.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"{binary} did not start: {line}")
        port = int(line.strip().rsplit(":", 1)[1])
        th.wait_http(port, "/health", timeout=300)
        st, stats = th.request(port, "GET", "/toki/stats")
        if st != 200:
            raise RuntimeError(f"/toki/stats answered {st}")
        return stats["backends"][0]["exact"]
    finally:
        p.terminate()
        p.wait(60)
        shutil.rmtree(state, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=40)
    ap.add_argument("--params", default="24M")
    ap.add_argument("--toki")
    ap.add_argument("--against", help="an older toki, started in turn with --toki")
    args = ap.parse_args()
    toki = c.use_toki_binary(args.toki or os.path.join(c.SOURCE_DIR, "build", "toki"))
    bins = {"toki": toki}
    if args.against:
        bins["--against"] = args.against
    model = th.generated_model("verdicts", args.params, ctx=4096, seed=1)
    counts = {label: collections.Counter() for label in bins}
    for i in range(args.starts):
        for label, binary in bins.items():
            ex = start(binary, model)
            verdict = ex["verdict"].split(":")[0] if ex["selftest"] != "verified" else "verified"
            counts[label][(verdict, "steps" if ex["steps"] else "no steps")] += 1
        c.log(f"start {i + 1}: " + "; ".join(f"{label} {dict(n)}" for label, n in counts.items()))
    rows = []
    for label, n in counts.items():
        for (verdict, steps), k in sorted(n.items(), key=lambda kv: -kv[1]):
            rows.append([label, bins[label], verdict, steps, k])
    print(c.table(["binary", "path", "verdict", "steps", "starts"], rows))


if __name__ == "__main__":
    main()
