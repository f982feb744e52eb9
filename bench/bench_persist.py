"""Benchmark: the first request after a full restart (llama-server and toki),
with and without persistent slot files, for prefixes of 1k, 8k and 32k
tokens on a generated model. Reports TTFT, tokens evaluated (llama-server's
timings.prompt_n), the restore bandwidth toki measured and the disk used.

    python3 bench/bench_persist.py [--sizes 1024,8192,32768] [--params 4M] [--json FILE]
"""
import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
import toki_harness as th  # noqa: E402

WORDS = ("the cat dog sun moon tree bird river house small big red blue green old new happy "
         "sad runs jumps sings walks looks finds makes takes gives tells asks likes").split()


def text_of_tokens(port, n):
    """A system prompt of about n tokens (measured with the server's tokenizer)."""
    words, out = [], ""
    i = 0
    while True:
        chunk = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(200)) + ". "
        i += 1
        cand = out + chunk
        st, t = th.request(port, "POST", "/tokenize", {"content": cand}, auth=False)
        if len(t["tokens"]) > n:
            return out or cand
        out = cand


def stream_ttft(port, msgs):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    body = json.dumps({"messages": msgs, "max_tokens": 4, "temperature": 0, "stream": True})
    t0 = time.time()
    conn.request("POST", "/v1/chat/completions", body,
                 {"Content-Type": "application/json", "Authorization": "Bearer " + th.TEST_TOKEN})
    r = conn.getresponse()
    first, buf, last = None, b"", None
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            ev = ev.decode()
            if not ev.startswith("data: ") or ev == "data: [DONE]":
                continue
            j = json.loads(ev[6:])
            for ch in j.get("choices", []):
                if ch.get("delta", {}).get("content") and first is None:
                    first = time.time() - t0
            if "cache" in j:
                last = j
    return (first if first is not None else time.time() - t0), last


def run_size(model, n, persist, ctx):
    d = tempfile.mkdtemp(prefix="toki-bench-persist-")
    extra_llama = ["--slot-save-path", d]
    llama = th.LlamaServer(model=model, slots=1, ctx=ctx, extra=extra_llama, name="bpersist")
    toki_extra = ["--slot-dir", d, "--slot-save-idle-ms", "300"] if persist else []
    toki = th.Toki([llama], mode="exact", extra=toki_extra, name="bpersist-toki")
    try:
        system = text_of_tokens(llama.port, n)
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Hello"}]
        cold_ttft, cold = stream_ttft(toki.port, msgs)
        msgs2 = msgs + [{"role": "assistant", "content": "Hi."},
                        {"role": "user", "content": "Tell me more."}]
        if persist:
            deadline = time.time() + 600
            while toki.stats()["saves"] < 1 and time.time() < deadline:
                time.sleep(0.1)
        disk = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        toki.kill(signal.SIGTERM)
        llama.kill()
        llama.restart()
        toki = th.Toki([llama], mode="exact", extra=toki_extra, name="bpersist-toki")
        after_ttft, after = stream_ttft(toki.port, msgs2)
        log = toki.log_text()
        m = re.search(r"restored \S+ \((\d+) tokens, (\d+) bytes, ([\d.]+) ms\)", log)
        bw = (int(m.group(2)) / (float(m.group(3)) / 1000.0) / 1e9) if m else None
        return {
            "prefix_tokens": cold["cache"]["prompt_tokens"],
            "persist": persist,
            "cold_ttft_ms": cold_ttft * 1000,
            "after_restart_ttft_ms": after_ttft * 1000,
            "after_restart_evaluated": after["timings"]["prompt_n"],
            "after_restart_prompt": after["cache"]["prompt_tokens"],
            "route": after["cache"]["route"],
            "restore_ms": float(m.group(3)) if m else None,
            "restore_gb_per_s": bw,
            "disk_bytes": disk if persist else 0,
        }
    finally:
        toki.kill(signal.SIGTERM)
        llama.kill()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,8192,32768")
    ap.add_argument("--params", default="4M")
    ap.add_argument("--json")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    ctx = 1 << (max(sizes) + 2048 - 1).bit_length()
    model = th.generated_model("bench-persist", params=a.params, ctx=ctx)
    rows = []
    for n in sizes:
        for persist in (False, True):
            r = run_size(model, n, persist, ctx)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print()
    print("| prefix | persistence | TTFT after restart | evaluated | route | restore | disk |")
    print("|---:|---|---:|---:|---|---:|---:|")
    for r in rows:
        rest = (f"{r['restore_ms']:.0f} ms ({r['restore_gb_per_s']:.2f} GB/s)"
                if r["restore_ms"] else "-")
        disk = f"{r['disk_bytes'] / 2**20:.1f} MiB" if r["persist"] else "-"
        print(f"| {r['prefix_tokens']} | {'on' if r['persist'] else 'off'} | "
              f"{r['after_restart_ttft_ms']:.0f} ms | {r['after_restart_evaluated']} / "
              f"{r['after_restart_prompt']} | {r['route']} | {rest} | {disk} |")
    for i, n in enumerate(sizes):
        off, on = rows[2 * i], rows[2 * i + 1]
        print(f"prefix ~{n}: TTFT after a full restart {off['after_restart_ttft_ms']:.0f} ms "
              f"without persistence, {on['after_restart_ttft_ms']:.0f} ms with: "
              f"{off['after_restart_ttft_ms'] / on['after_restart_ttft_ms']:.1f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
