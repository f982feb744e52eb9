#!/usr/bin/env python3
"""A change of the server's own LoRA adapter scales (POST /lora-adapters)
between two turns of a conversation, through toki and on llama-server alone.

A generated model (1M, random weights) with a generated adapter
(tests/integration/lora_adapter.py) on two llama-servers of the same flags
(-np 2, --cache-ram 0): one behind toki (exact mode, slot files), one alone.
Per round: a chat request (cached after the first round), a change of the
scale (1.0 and 0.3 by turns), the same request again, and its uncached
answer (cache_prompt false) at the new scale. Reported per path: how long the
change took to answer, how long the request after it took, and how many of
the answers after a change were the uncached one at the new scales (text and
logprobs), with the tokens the server reused for them.

  python3 bench/bench_lora_change.py [--toki BIN] [-n 20] [--json OUT]

Standard library only."""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

MSGS = [{"role": "system", "content": "You are a storyteller. " * 120},
        {"role": "user", "content": "Once upon a time"}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toki", default=os.path.join(common.SOURCE_DIR, "build", "toki"))
    ap.add_argument("-n", type=int, default=20, help="rounds")
    ap.add_argument("--json")
    a = ap.parse_args()
    th = common.harness()
    import lora_adapter
    toki_bin = common.use_toki_binary(a.toki)
    info = common.machine_info(toki_bin)
    model = th.generated_model("lora", params="1M", ctx=4096)
    adapter = lora_adapter.write(os.path.join(th.WORK_DIR, "lora-1M.gguf"), 128, 2)
    d = tempfile.mkdtemp(prefix="toki-bench-lora-")
    procs = []
    try:
        srv = th.LlamaServer(model=model, slots=2, ctx=2048, name="lora-toki",
                             extra=["--lora", adapter, "--slot-save-path", d])
        procs.append(srv)
        toki = th.Toki([srv], mode="exact", extra=["--slot-dir", d])
        procs.append(toki)
        alone = th.LlamaServer(model=model, slots=2, ctx=2048, name="lora-alone",
                               extra=["--lora", adapter])
        procs.append(alone)
        paths = [("toki", common.Client(toki.port)), ("llama-server alone", common.Client(alone.port))]
        body = {"messages": MSGS, "max_tokens": 8, "temperature": 0, "logprobs": True,
                "top_logprobs": 2}

        def ask(c, **extra):
            st, r = c.json("POST", "/v1/chat/completions", dict(body, **extra))
            assert st == 200, r
            return r

        res = {name: {"change_ms": [], "after_ms": [], "same": 0, "reused": []}
               for name, _ in paths}
        for r in range(a.n):
            scale = 0.3 if r % 2 == 0 else 1.0
            for name, c in paths:
                ask(c)
                t0 = time.perf_counter()
                st, out = c.json("POST", "/lora-adapters", [{"id": 0, "scale": scale}])
                t1 = time.perf_counter()
                assert st == 200, out
                after = ask(c)
                t2 = time.perf_counter()
                ref = ask(c, cache_prompt=False)
                x = res[name]
                x["change_ms"].append((t1 - t0) * 1000)
                x["after_ms"].append((t2 - t1) * 1000)
                x["same"] += (after["choices"][0]["message"]["content"] ==
                              ref["choices"][0]["message"]["content"] and
                              after["choices"][0]["logprobs"] == ref["choices"][0]["logprobs"])
                x["reused"].append(after["timings"]["cache_n"])
        rows = []
        for name, _ in paths:
            x = res[name]
            rows.append([name, common.median(x["change_ms"]), common.median(x["after_ms"]),
                         f"{x['same']}/{a.n}", common.median(x["reused"])])
        print(f"machine: {info.get('cpu')}, {info.get('cores')} cores; commit {info['commit']}"
              f"{' (dirty)' if info['dirty'] else ''}; {info['llama_server']}")
        print(f"{a.n} rounds, a {len(MSGS[0]['content'])}-character system message\n")
        print(common.table(["path", "change p50 ms", "request after it p50 ms",
                            "answers after a change = uncached", "tokens reused after it (p50)"],
                           rows))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"machine": info, "rows": rows}, f, indent=1)
    finally:
        common.stop(*reversed(procs))
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
