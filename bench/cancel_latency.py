#!/usr/bin/env python3
"""How fast a cancelled request frees its slot: a client sends a cold,
~3,700-token chat (a long system prompt, a new one each time), closes its
connection 0.3 s after llama-server starts on it, and we time from the close
to the slot's is_processing going false on llama-server's own /slots.
Direct to llama-server, and through toki fast and exact, side by side.

  python3 bench/cancel_latency.py [--reps 3]

24M random-weight model, 1 slot, -ub 512. Standard library only; uses
tests/integration/toki_harness.py (and build/toki, or $TOKI_BIN)."""
import argparse
import json
import os
import random
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
os.environ.setdefault("TOKI_BIN", os.path.join(HERE, "..", "build", "toki"))
import toki_harness as th  # noqa: E402

WORDS = "the cat dog sun moon tree bird river house small big red blue green old new happy".split()


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def busy(llama):
    return any(s["is_processing"] for s in th.request(llama.port, "GET", "/slots", auth=False)[1])


def one(port, llama, auth, rng):
    body = {"messages": [{"role": "system", "content": text(rng, 3000)},
                         {"role": "user", "content": "go"}], "max_tokens": 8, "stream": True}
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port))
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
            (b"Authorization: Bearer " + th.TEST_TOKEN.encode() + b"\r\n" if auth else b"") +
            b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n")
    s.sendall(head + data)
    while not busy(llama):
        time.sleep(0.005)
    time.sleep(0.3)
    s.close()
    t = time.time()
    while busy(llama):
        time.sleep(0.005)
    return time.time() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    model = th.generated_model("cancel", params="24M", ctx=8192)
    rng = random.Random(1)
    print("| path | seconds from the client's close to the slot's end (each run) | median |")
    print("|---|---|---|")
    for path in ("direct", "fast", "exact"):
        llama = th.LlamaServer(model=model, slots=1, ctx=8192, ubatch=512)
        toki = None if path == "direct" else th.Toki([llama], mode=path)
        try:
            runs = [one(toki.port if toki else llama.port, llama, toki is not None, rng)
                    for _ in range(args.reps)]
        finally:
            if toki:
                toki.kill()
            llama.kill()
        name = "llama-server alone" if path == "direct" else "toki " + path
        print(f"| {name} | {', '.join('%.2f' % r for r in runs)} | {statistics.median(runs):.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
