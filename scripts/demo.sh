#!/usr/bin/env bash
# One command from a fresh Debian/Ubuntu machine (or a Mac with Homebrew:
# install-deps.sh installs Homebrew's llama.cpp, a Metal llama-server) to the
# cache at work:
# installs what is needed, builds toki, provisions a llama-server if none is
# on PATH, writes two built-in random-weight demo models (no download) into a
# registry of its own, starts the endpoint with `toki model use demo` (one
# port for every registry model, in its default mode, exact), and sends the
# same long prompt cold, hot, and uncached (cache_prompt: false, toki's
# reference), comparing the hot answer with the uncached one, text and every
# logprob; then asks the endpoint for the second model, which starts on that
# request; then the hot run again in fast mode, which promises no identity.
#   scripts/demo.sh           run the demo, then stop everything
#   scripts/demo.sh --keep    leave the endpoint running afterwards
#   TOKI_BIN=path             use this toki binary: no install, no build
#                             (tests/integration/test_demo.py runs it so)
#   TOKI_DEMO_PORT=N          the endpoint's port (default 8787)
# toki's state is the demo's own (~/.cache/tokirecur/demo/state), whatever
# TOKI_STATE_DIR says, so that the demo never meets (or stops) a toki you
# already run.
# Exits non-zero when the hot answer differs from the uncached one.
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0
[ "${1:-}" = "--keep" ] && keep=1

if [ -n "${TOKI_BIN:-}" ]; then
	toki=$TOKI_BIN
else
	scripts/install-deps.sh
	# macOS: Homebrew's keg-only formulae on pkg-config's path (docs/platforms.md).
	if [ "$(uname -s)" = Darwin ]; then . scripts/macos-env.sh; fi
	cmake -S . -B build -DTOKI_WERROR=OFF >/dev/null
	cmake --build build -j"$(nproc)" >/dev/null
	toki=build/toki
fi
llama=$(scripts/provision-llama-server.sh)

cache=${XDG_CACHE_HOME:-$HOME/.cache}/tokirecur/demo
mkdir -p "$cache"
export TOKI_STATE_DIR=$cache/state
export TOKI_MODEL_REGISTRY=$cache/models.yaml
export TOKI_LLAMA_SERVER=$llama
# A fresh slot folder: "cold" means cold (the last run's states would be restored).
rm -rf "$TOKI_STATE_DIR/run/demo/slots"
model=$cache/demo-24M-16k.gguf
small=$cache/demo-small-1M.gguf
[ -f "$model" ] || "$toki" gguf gen -o "$model" --params 24M --ctx 16384 --seed 7
[ -f "$small" ] || "$toki" gguf gen -o "$small" --params 1M --ctx 4096 --seed 8
cat >"$TOKI_MODEL_REGISTRY" <<EOF
models:
  demo:
    path: $model
    ctx: 16384
  demo-small:
    path: $small
    ctx: 4096
EOF
tport=${TOKI_DEMO_PORT:-8787}

cleanup() { "$toki" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
start_toki() { # $1: the reuse mode
	"$toki" model use demo --port "$tport" --reuse "$1" >/dev/null
}
start_toki exact

echo "demo: the endpoint on :$tport (state and logs in $TOKI_STATE_DIR), registry $TOKI_MODEL_REGISTRY"
client() { # $1: exact or fast
	python3 - "$tport" "$1" <<'PY'
import http.client, json, os, sys, time
port, mode = int(sys.argv[1]), sys.argv[2]

def token():
    if os.environ.get("TOKI_TOKEN"):
        return os.environ["TOKI_TOKEN"]
    state = os.environ.get("TOKI_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "tokirecur")
    return open(os.path.join(state, "token")).read().strip()

deadline = time.time() + 120
while True:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/health"); r = c.getresponse(); r.read()
        if r.status == 200: break
    except OSError:
        pass
    if time.time() > deadline: sys.exit("demo: toki did not come up")
    time.sleep(0.2)

system = ("You are the on-call assistant for a small bakery. The bakery opens at seven, "
          "sells bread, cakes and coffee, and closes at six. Answer briefly. ") * 24
body = {"model": "demo", "messages": [{"role": "system", "content": system},
                     {"role": "user", "content": "When do you open?"}],
        "max_tokens": 24, "temperature": 0, "stream": True, "logprobs": True}

def get(path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("GET", path, headers={"Authorization": "Bearer " + token()})
    return json.loads(c.getresponse().read())

def models(label):
    print(f"\n/v1/models {label}:")
    for m in get("/v1/models")["data"]:
        print(f"  {m['id']:12} {m['state']:9} context {m['context_length']}")

def run(**extra):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.time()
    c.request("POST", "/v1/chat/completions", json.dumps(dict(body, **extra)),
              {"Content-Type": "application/json", "Authorization": "Bearer " + token()})
    r = c.getresponse()
    ttft = None; text = ""; last = None; probs = []
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk: break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            ev = ev.decode()
            if not ev.startswith("data: ") or ev == "data: [DONE]": continue
            j = json.loads(ev[6:])
            for ch in j.get("choices", []):
                probs += [(p["token"], p["logprob"])
                          for p in (ch.get("logprobs") or {}).get("content") or []]
                d = ch.get("delta", {}).get("content")
                if d:
                    if ttft is None: ttft = time.time() - t0
                    text += d
            if "cache" in j: last = j
    total = time.time() - t0
    return ttft if ttft is not None else total, total, (text, probs), last

def row(label, r):
    ttft, total, _, last = r
    print(f"{label:8} {last['cache']['prompt_tokens']:7d} {last['timings']['prompt_n']:10d} "
          f"{last['timings']['cache_n']:7d} {ttft*1000:7.0f}ms {total*1000:7.0f}ms")

head = f"{'':8} {'prompt':>7} {'evaluated':>10} {'cached':>7} {'TTFT':>9} {'total':>9}"
if mode == "exact":
    cold, hot, raw = run(), run(), run(cache_prompt=False)
    print("\nexact mode (the default): the prompt cold, hot, then uncached (cache_prompt: false)")
    print(head)
    row("cold", cold); row("hot", hot); row("uncached", raw)
    print(f"\nspeed-up of time to first token: {cold[0]/hot[0]:.1f}x; hot answer identical to "
          f"the uncached one (text and every logprob): {hot[2] == raw[2]}")
    print(f"exact: {hot[3]['cache'].get('exact')} (toki's self-test at start)")
    if hot[2] != raw[2]:
        sys.exit("demo: the hot answer differs from the uncached one")
    # One endpoint for every registry model: the second starts on its first
    # request, beside the first.
    models("before asking for demo-small")
    t0 = time.time()
    small = run(model="demo-small", messages=[{"role": "user", "content": "Hello"}],
                max_tokens=8)
    print(f"\ndemo-small answered in {(time.time() - t0) * 1000:.0f} ms, its start included")
    models("after")
else:
    first, hot = run(), run()
    print("\nfast mode (--reuse fast): every matching token reused, no identity promised")
    print(head)
    row("first", first); row("hot", hot)
PY
}
client exact
"$toki" down >/dev/null
start_toki fast
client fast
if [ "$keep" = 1 ]; then
	"$toki" down >/dev/null
	start_toki exact
	trap - EXIT
	echo "demo: still running. OpenAI-compatible API at http://127.0.0.1:$tport/v1" \
		"(models demo and demo-small; API key: the token in $TOKI_STATE_DIR/token);" \
		"stop with: TOKI_STATE_DIR=$TOKI_STATE_DIR $toki down"
fi
