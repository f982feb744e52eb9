#!/usr/bin/env bash
# One command from a fresh Debian/Ubuntu machine to the cache at work:
# installs what is needed, builds toki, provisions a llama-server if none is
# on PATH, writes a built-in random-weight demo model (no download), starts
# llama-server with `toki serve` in front, and sends the same long prompt
# twice: cold, then hot.
#   scripts/demo.sh           run the demo, then stop everything
#   scripts/demo.sh --keep    leave llama-server and toki running afterwards
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0
[ "${1:-}" = "--keep" ] && keep=1

scripts/install-deps.sh
cmake -S . -B build -DTOKI_WERROR=OFF >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
llama=$(scripts/provision-llama-server.sh)

cache=${XDG_CACHE_HOME:-$HOME/.cache}/tokirecur/demo
mkdir -p "$cache/slots"
model=$cache/demo-24M-16k.gguf
[ -f "$model" ] || build/toki gguf gen -o "$model" --params 24M --ctx 16384 --seed 7

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
lport=$(free_port)
tport=${TOKI_DEMO_PORT:-8787}

"$llama" -m "$model" --host 127.0.0.1 --port "$lport" -np 2 -c 32768 --cache-ram 0 \
	--slot-save-path "$cache/slots" >"$cache/llama-server.log" 2>&1 &
lpid=$!
build/toki serve --backend "http://127.0.0.1:$lport" --port "$tport" --reuse fast \
	--slot-dir "$cache/slots" >"$cache/toki.log" 2>&1 &
tpid=$!
cleanup() { kill "$tpid" "$lpid" 2>/dev/null || true; }
[ "$keep" = 1 ] || trap cleanup EXIT

echo "demo: llama-server on :$lport (log $cache/llama-server.log), toki on :$tport (log $cache/toki.log)"
python3 - "$tport" <<'PY'
import http.client, json, os, sys, time
port = int(sys.argv[1])

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
body = {"messages": [{"role": "system", "content": system},
                     {"role": "user", "content": "When do you open?"}],
        "max_tokens": 24, "temperature": 0, "stream": True}

def run():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.time()
    c.request("POST", "/v1/chat/completions", json.dumps(body),
              {"Content-Type": "application/json", "Authorization": "Bearer " + token()})
    r = c.getresponse()
    ttft = None; text = ""; last = None
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
                d = ch.get("delta", {}).get("content")
                if d:
                    if ttft is None: ttft = time.time() - t0
                    text += d
            if "cache" in j: last = j
    return ttft, time.time() - t0, text, last

rows = []
for label in ("cold", "hot"):
    ttft, total, text, last = run()
    rows.append((label, last["cache"]["prompt_tokens"], last["timings"]["prompt_n"],
                 last["timings"]["cache_n"], ttft, total, text))
print()
print(f"{'':5} {'prompt':>7} {'evaluated':>10} {'cached':>7} {'TTFT':>9} {'total':>9}")
for label, n, ev, ca, ttft, total, _ in rows:
    print(f"{label:5} {n:7d} {ev:10d} {ca:7d} {ttft*1000:7.0f}ms {total*1000:7.0f}ms")
print(f"\nspeed-up of time to first token: {rows[0][4]/rows[1][4]:.1f}x; "
      f"outputs byte-identical: {rows[0][6] == rows[1][6]}")
PY
if [ "$keep" = 1 ]; then
	echo "demo: still running. OpenAI-compatible API at http://127.0.0.1:$tport/v1" \
		"(API key: the token in ~/.local/state/tokirecur/token); stop with: kill $tpid $lpid"
fi
