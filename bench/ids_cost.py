#!/usr/bin/env python3
"""What llama-server's token ids cost it: generation speed with a chat
answer's probabilities, which are the only part of the answer that lists
the generated tokens' ids (exact mode's keep after an answer asks for them,
src/serve/answer.h answer_ids_cheap), against none, under several sampling
chains.

  python3 bench/ids_cost.py [--tokens 200] [--reps 3]

A tiny random model with Qwen 3's vocabulary (151,936 tokens: the sort of a
vocabulary is what the probabilities can cost), one slot; each cell is the
server's own predicted_per_token_ms, median of --reps, with ignore_eos.
Standard library only; uses tests/integration/toki_harness.py (and
build/toki, or $TOKI_BIN, to write the model)."""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
os.environ.setdefault("TOKI_BIN", os.path.join(HERE, "..", "build", "toki"))
import toki_harness as th  # noqa: E402

CHAINS = (
    ("server defaults (top_k 40), temperature 0.8", dict(temperature=0.8, seed=1)),
    ("temperature 0", dict(temperature=0)),
    ("top_k 20, top_p 0.95, temperature 0.6", dict(temperature=0.6, top_k=20, top_p=0.95,
                                                   seed=1)),
    ("top_k 0, top_p 1, min_p 0", dict(temperature=0.8, top_k=0, top_p=1.0, min_p=0, seed=1)),
    ("top_k 0, top_p 0.95", dict(temperature=0.8, top_k=0, top_p=0.95, min_p=0.05, seed=1)),
    ("top_k 0, temperature 0", dict(temperature=0, top_k=0)),
)
ASKS = (("plain", {}),
        ("n_probs 1, post_sampling_probs (toki's)", dict(n_probs=1, post_sampling_probs=True)),
        ("logprobs, top_logprobs 1", dict(logprobs=True, top_logprobs=1)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    model = th.tokenizer_model("qwen3", "qwen2")
    srv = th.LlamaServer(model=model, slots=1, ctx=4096, name="ids-cost")
    try:
        msgs = [{"role": "user", "content": "Run the tests."}]
        print("| sampling | " + " | ".join(a for a, _ in ASKS) + " |")
        print("|---|" + "---|" * len(ASKS))
        for label, chain in CHAINS:
            cells = []
            for _, ask in ASKS:
                ms = []
                for _ in range(args.reps):
                    st, r = th.request(srv.port, "POST", "/v1/chat/completions",
                                       dict(messages=msgs, max_tokens=args.tokens,
                                            ignore_eos=True, cache_prompt=False, **chain, **ask))
                    if st != 200:
                        raise RuntimeError(json.dumps(r)[:300])
                    ms.append(r["timings"]["predicted_per_token_ms"])
                cells.append(f"{statistics.median(ms):.2f}")
            print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    finally:
        srv.kill()


if __name__ == "__main__":
    main()
