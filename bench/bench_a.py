"""Benchmark a (the seed's table): one slot, 8,192 context, a ~1,372-token
prompt (a long system prompt and one user line) on a 24M generated model.
Evaluated tokens and streamed time to first token, cold (empty slot) vs hot
(the same prompt again), through toki in both modes and direct."""
import random
import time

import bench_bc
import workload
from common import Client, harness, stream_chat_retrying, log, median, stop, table, tokenize_chat

MODEL = ("bench", "24M", 32768)
TARGET_TOKENS = 1372
USER_LINE = "Please summarise the rules above in one sentence."


def make_prompt(client):
    """A system prompt grown sentence by sentence, then cut word by word, until
    the whole chat prompt is TARGET_TOKENS tokens (or the nearest below)."""
    rng = random.Random(5)
    words = []
    while len(" ".join(words)) < TARGET_TOKENS * workload.CHARS_PER_TOKEN * 1.6:
        words += workload.sentence(rng, 6, 18).split()

    def msgs(n):
        return [{"role": "system", "content": " ".join(words[:n])},
                {"role": "user", "content": USER_LINE}]
    lo, hi = 1, len(words)
    while lo < hi:  # the largest word count whose prompt fits
        mid = (lo + hi + 1) // 2
        if len(tokenize_chat(client, msgs(mid))) <= TARGET_TOKENS:
            lo = mid
        else:
            hi = mid - 1
    m = msgs(lo)
    return m, len(tokenize_chat(client, m))


def bench_a(quick):
    th = harness()
    model = th.generated_model(*MODEL)
    rounds = 1 if quick else 2
    hots = 2
    results = {}
    messages = n_tokens = None
    for target in ("direct", "fast", "exact"):
        cold, hot = [], []
        for _ in range(rounds):
            # Cold: a fresh server (and toki), so the slot is empty. (Slot erase
            # needs --slot-save-path on this llama-server build: 501 without.)
            ls = th.LlamaServer(model=model, slots=1, ctx=8192, ubatch=512, cache_ram=0,
                                name=f"bench-a-{target}")
            toki = None
            try:
                if target != "direct":
                    toki = th.Toki([ls], mode=target, ubatch=512, name=f"toki-bench-a-{target}")
                if messages is None:
                    messages, n_tokens = make_prompt(Client(ls.port))
                    log(f"benchmark a: prompt of {n_tokens} tokens")
                c = Client(toki.port if toki else ls.port)
                body = {"messages": messages, "temperature": 0, "max_tokens": 4}
                cold.append(stream_chat_retrying(c, body))
                for _ in range(hots):
                    time.sleep(bench_bc.THINK_S)
                    hot.append(stream_chat_retrying(c, body))
                c.close()
            finally:
                stop(toki, ls)
        for r in cold + hot:
            if r["status"] != 200 or not r["timings"]:
                raise RuntimeError(f"benchmark a {target}: {r}")
        results[target] = {
            "cold_evaluated": [r["timings"]["prompt_n"] for r in cold],
            "hot_evaluated": [r["timings"]["prompt_n"] for r in hot],
            "cold_ttft_ms": [r["ttft"] * 1000 for r in cold],
            "hot_ttft_ms": [r["ttft"] * 1000 for r in hot],
            "hot_cache": [r["cache"] for r in hot],
            "failed_attempts": sum(len(r["failures"]) for r in cold + hot),
            "identical_cold_hot": all(r["text"] == cold[0]["text"] for r in cold + hot),
        }
        log(f"  a {target}: cold {results[target]['cold_evaluated']} "
            f"hot {results[target]['hot_evaluated']}")
    rows = []
    for target, r in results.items():
        rows.append([{"direct": "llama-server alone"}.get(target, "toki " + target),
                     round(median(r["cold_evaluated"])), round(median(r["hot_evaluated"])),
                     median(r["cold_ttft_ms"]), median(r["hot_ttft_ms"]),
                     median(r["cold_ttft_ms"]) / median(r["hot_ttft_ms"]),
                     "yes" if r["identical_cold_hot"] else "no", r["failed_attempts"]])
    t = table(["path", "evaluated cold", "evaluated hot", "TTFT cold ms", "TTFT hot ms",
               "cold/hot TTFT", "hot text = cold text",
               "failed attempts (retried)"], rows)
    md = (f"### a. One slot, cold vs hot\n\n1 slot, -c 8192, -ub 512, model {MODEL[1]} "
          f"generated, prompt {n_tokens} tokens (system + one user line), max_tokens 4, "
          f"streamed. Medians of {rounds} cold (each on a fresh server) and {rounds * hots} hot requests.\n\n{t}\n")
    return {"prompt_tokens": n_tokens, "results": results, "markdown": md}
