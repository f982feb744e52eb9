#!/usr/bin/env python3
"""Toki Recur benchmarks: a real llama-server and a real `toki serve`.

  python3 bench/run.py [a|b|c|d|e|g|h|i|all] [--quick] [--out bench/results/DATE.json]

  a    one slot, cold vs hot: evaluated tokens and time to first token
  b    interleaved agent workload: evaluated tokens over the prefix limit,
       llama-server alone vs toki fast vs toki exact, -np 1/2/4 x --cache-ram 0/8192
  c    exact vs fast: evaluated tokens and identity with an uncached run, -ub 512 and 64
  d    overhead: added latency, tokenization round trips, 64-client throughput, RSS
  e    b's workload with toki's slot files (--slot-dir), -np 1/2/4, --cache-ram 0/8192
  g    cold cost of chunking: a cold ~8k-token, ~40-message agent prompt, TTFT
  h    concurrency: 4 agent sessions at once on one -np 4 backend
  i    interrupt + resend: a turn cancelled during generation / prefill, sent again
  n    never worse: llama-server alone vs toki fast and exact, with and without slot
       files, -np 1/2/4/default x --cache-ram 0/8192

Prints markdown tables on stdout (progress on stderr) and writes everything it
measured, per request, to the JSON file (and the tables next to it, .md).
Uses tests/integration/toki_harness.py: scripts/provision-llama-server.sh finds
llama-server, generated models are cached under ~/.cache/tokirecur/test/, and
each server's and toki's log is written there too. Standard library only."""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def build_head():
    """Exports HEAD to a temporary directory, builds toki there, returns its path."""
    import subprocess
    import tempfile
    d = tempfile.mkdtemp(prefix="toki-head-")
    common.log(f"building HEAD in {d} ...")
    commit = subprocess.run(["git", "-C", common.SOURCE_DIR, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(f"git -C {common.SOURCE_DIR} archive {commit} | tar -x -C {d}", shell=True,
                   check=True)
    with open(os.path.join(d, "COMMIT"), "w") as f:  # so a later --toki run can say it
        f.write(commit + "\n")
    subprocess.run(["cmake", "-S", d, "-B", os.path.join(d, "build")], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", os.path.join(d, "build"), "-j2", "--target", "toki"],
                   check=True, stdout=subprocess.DEVNULL)
    return os.path.join(d, "build", "toki")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("which", nargs="*", default=["all"],
                    choices=["a", "b", "c", "d", "e", "g", "h", "i", "n", "all"],
                    help="benchmarks to run (default all)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, a few minutes")
    ap.add_argument("--out", help="JSON results (default bench/results/DATE.json)")
    ap.add_argument("--think-ms", type=float, default=250,
                    help="pause between one request's end and the next (a, b, c; default 250; "
                         "not counted in wall times)")
    ap.add_argument("--toki", default=os.path.join(common.SOURCE_DIR, "build", "toki"),
                    help="the toki binary (default build/toki; copied aside for the run)")
    ap.add_argument("--g-reps", type=int, default=5,
                    help="g: repetitions (default 5); each runs llama-server alone and toki "
                         "exact twice (ABBA), the other paths once")
    ap.add_argument("--g-model", default="24M", choices=["4M", "24M"],
                    help="the generated model of benchmark g (default 24M; 4M on a slow machine)")
    ap.add_argument("--build-head", action="store_true",
                    help="build toki from the committed HEAD (git archive, a temporary "
                         "directory) and measure that: no uncommitted edits in the binary")
    args = ap.parse_args()
    if args.build_head:
        args.toki = build_head()
        common.log(f"toki binary: {args.toki}")
    which = ["a", "b", "c", "d", "e", "g", "h", "i", "n"] if "all" in args.which else list(dict.fromkeys(args.which))
    if not os.access(args.toki, os.X_OK):
        sys.exit(f"no toki binary at {args.toki}: build it first "
                 "(cmake -S . -B build && cmake --build build -j2)")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or os.path.join(common.BENCH_DIR, "results", stamp + ".json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)

    common.use_toki_binary(args.toki)
    info = common.machine_info(args.toki)
    head_commit = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.toki))),
                               "COMMIT")
    if not args.build_head and os.path.exists(head_commit):
        # A binary an earlier --build-head run built: say its commit, not HEAD's.
        with open(head_commit) as f:
            info["commit"] = f.read().strip()
        args.build_head = True
    if args.build_head:
        info["dirty"] = False
        info["dirty_files"] = []
        info["toki_built_from"] = "git archive HEAD"
    info["command"] = " ".join(["python3", "bench/run.py"] + sys.argv[1:])
    info["quick"] = args.quick
    results = {"machine": info, "benchmarks": {}}
    t_start = time.perf_counter()

    import bench_a
    import bench_agent
    import bench_bc
    import bench_d
    bench_bc.THINK_S = args.think_ms / 1000.0
    bench_agent.G_MODEL = ("bench", args.g_model, 32768)
    bench_agent.G_REPS = args.g_reps
    info["g_model"] = args.g_model
    info["think_ms"] = args.think_ms
    fns = {"a": bench_a.bench_a, "b": bench_bc.bench_b, "c": bench_bc.bench_c,
           "d": bench_d.bench_d, "e": bench_bc.bench_e,
           "g": bench_agent.bench_g, "h": bench_agent.bench_h, "i": bench_agent.bench_i,
           "n": bench_bc.bench_n}

    header = (f"## Toki Recur benchmarks{' (quick)' if args.quick else ''}\n\n"
              f"- date: {info['date']}\n- machine: {info.get('cpu')}, {info['cores']} cores, "
              f"{info.get('ram_gib')} GiB RAM (load average at start: {info['loadavg_start']})\n"
              f"- toki: commit {info['commit']}{' (dirty working tree)' if info['dirty'] else ''}"
              f"{' (built from git archive HEAD)' if info.get('toki_built_from') else ''}"
              f", {info['toki_version']}, binary sha256 {info['toki_sha256']}\n"
              f"- llama-server: {info['llama_server']}\n- command: `{info['command']}`\n"
              f"- pause between sequential requests (a, b, c): {args.think_ms:g} ms\n")
    print(header, flush=True)
    md = [header]

    def save():
        info["total_s"] = time.perf_counter() - t_start
        info["loadavg_end"] = common.loadavg()
        with open(out, "w") as f:
            json.dump(results, f, indent=1, default=str)
        with open(os.path.splitext(out)[0] + ".md", "w") as f:
            f.write("\n".join(md))

    failed = False
    for w in which:
        common.log(f"benchmark {w} ...")
        t0 = time.perf_counter()
        load0 = common.loadavg()
        try:
            r = fns[w](args.quick)
        except Exception as e:
            import traceback
            traceback.print_exc()
            failed = True
            r = {"error": repr(e), "markdown": f"### {w}: FAILED: {e!r}\n"}
        r["seconds"] = time.perf_counter() - t0
        r["loadavg_start"], r["loadavg_end"] = load0, common.loadavg()
        results["benchmarks"][w] = r
        text = r["markdown"] + (f"\n({w}: {r['seconds']:.0f} s; load average at start "
                                f"{load0}, at end {r['loadavg_end']})\n")
        print(text, flush=True)
        md.append(text)
        save()
    footer = (f"Total: {time.perf_counter() - t_start:.0f} s; load average at end: "
              f"{common.loadavg()}.")
    print(footer)
    md.append(footer + "\n")
    save()
    common.log(f"results: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
