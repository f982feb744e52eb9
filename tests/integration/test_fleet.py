"""A fleet: one `toki serve` in front of several llama-servers, each on its
own test host (a network namespace joined to this one by a veth pair, see
netns_hosts.py; loopback ports when namespaces cannot be made, which the
output says).

FleetTest, on three hosts serving one generated model with -np 2 each (and a
fourth serving another model):
  1. the interleaved agent workload of bench/workload.py, six sessions run
     concurrently (bench/bench_fleet.py replays it): evaluated prompt tokens
     over the prefix limit through toki must be <= 1.10, and below a
     round-robin baseline (requests sent straight to the servers in turn,
     no id_slot), which is measured and printed;
  2. one server is SIGKILLed while requests stream from it and others are in
     its prefill or queued: every request that had received no data yet gets
     a 200 from another server, the ones streaming from it end with an error
     event and the end of the stream, nothing hangs; restarted, it is up
     again in /toki/stats with one more discovery, and gets requests;
  3. requests that name a model go only to the servers serving it.

RpcTest: two ggml-rpc-server workers on two hosts, `toki up ... -- --rpc
A,B`: a chat completion through toki, and llama-server's log shows the
model's buffers on the RPC devices.

Environment: TOKI_TEST_NO_NETNS=1 forces the loopback fallback."""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toki_harness as th  # noqa: E402
import netns_hosts  # noqa: E402

sys.path.insert(0, os.path.join(th.SOURCE_DIR, "bench"))
import bench_fleet as bf  # noqa: E402
import workload  # noqa: E402

CTX = bf.FLEET["per_slot_ctx"]
SLOTS = 2
REQUEST_TIMEOUT = 120  # seconds of silence before a request counts as hung
MAX_EVAL_OVER_LIMIT = 1.10


def say(msg):
    print(f"[fleet {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def http_json(addr, port, method, path, body=None, timeout=30, auth=True):
    c = http.client.HTTPConnection(addr, port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    if auth:
        h["Authorization"] = "Bearer " + th.TEST_TOKEN
    c.request(method, path, body=None if body is None else json.dumps(body), headers=h)
    r = c.getresponse()
    text = r.read().decode("utf-8", "replace")
    c.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text


class HostLlamaServer:
    """A real llama-server on a test host, listening on the host's address."""

    def __init__(self, host, model, name, slots=SLOTS, ctx=CTX, extra=()):
        self.host = host
        self.model = model
        self.port = th.free_port()
        self.name = name
        self.args = [th.llama_server_path(), "-m", model, "--host", host.addr, "--port",
                     str(self.port), "-np", str(slots), "-t", "1", "--cache-ram", "0",
                     "-c", str(ctx * slots), "--override-kv",
                     f"llama.context_length=int:{max(ctx, 2048)}", "-ub", "512", "-b", "2048"]
        self.args += list(extra)
        self.log_path = os.path.join(th.WORK_DIR, f"{name}-{os.getpid()}.log")
        self.proc = None
        self.start(wait=False)

    @property
    def url(self):
        return f"http://{self.host.addr}:{self.port}"

    def start(self, wait=True):
        os.makedirs(th.WORK_DIR, exist_ok=True)
        with open(self.log_path, "a") as log:
            self.proc = self.host.popen(self.args, stdout=subprocess.DEVNULL, stderr=log)
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout=120):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}); see "
                                   f"{self.log_path}")
            try:
                st, _ = http_json(self.host.addr, self.port, "GET", "/health", timeout=2,
                                  auth=False)
                if st == 200:
                    return
                last = st
            except OSError as e:
                last = e
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} at {self.url} not ready: {last}")

    def ensure_running(self):
        if self.proc is None or self.proc.poll() is not None:
            self.start()

    def kill(self):
        """SIGKILL by pid, inside its namespace."""
        if self.proc and self.proc.poll() is None:
            self.host.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def slots(self):
        return http_json(self.host.addr, self.port, "GET", "/slots", auth=False)[1]

    def erase_slots(self):
        for s in self.slots():
            st, body = http_json(self.host.addr, self.port, "POST",
                                 f"/slots/{s['id']}?action=erase", {}, auth=False)
            if st != 200:
                raise RuntimeError(f"erasing slot {s['id']} of {self.url}: {st} {body}")

    def model_id(self):
        st, body = http_json(self.host.addr, self.port, "GET", "/v1/models", auth=False)
        return body["data"][0]["id"]


def stream_raw(port, body, timeout=REQUEST_TIMEOUT):
    """A streamed chat through toki, recorded event by event: status, the
    time of the first `data:` event from the backend (toki's own comments
    and error event do not count), whether [DONE] came, the error event if
    one came (and whether anything followed it), the cache block."""
    rec = {"status": 0, "t_first_data": None, "done": False, "error": None,
           "after_error": 0, "cache": None, "text": "", "exception": None, "t_end": None}
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/v1/chat/completions", body=json.dumps(dict(body, stream=True)),
                  headers={"Content-Type": "application/json",
                           "Authorization": "Bearer " + th.TEST_TOKEN})
        r = c.getresponse()
        rec["status"] = r.status
        if r.status != 200:
            rec["body"] = r.read().decode("utf-8", "replace")
        else:
            parts = []
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.decode("utf-8", "replace").rstrip("\r\n")
                if not line.startswith("data:"):
                    continue
                if rec["error"] is not None:
                    rec["after_error"] += 1
                d = line[5:].strip()
                if d == "[DONE]":
                    rec["done"] = True
                    continue
                j = json.loads(d)
                if "error" in j:
                    rec["error"] = j["error"]
                elif rec["t_first_data"] is None:  # the backend's first chunk
                    rec["t_first_data"] = time.monotonic()
                for ch in j.get("choices", []):
                    parts.append((ch.get("delta") or {}).get("content") or "")
                if "cache" in j:
                    rec["cache"] = j["cache"]
            rec["text"] = "".join(parts)
        c.close()
    except Exception as e:  # a hang shows up here as a socket timeout
        rec["exception"] = repr(e)
    rec["t_end"] = time.monotonic()
    return rec


def prompt_text(seed, tokens):
    import random
    return workload.text_of_tokens(random.Random(seed), tokens)


def decoded(slot):
    """Tokens a busy slot of llama-server's /slots has generated so far."""
    nt = slot.get("next_token")
    if isinstance(nt, list):
        nt = nt[0] if nt else {}
    return (nt or {}).get("n_decoded", 0) or 0


def toki_backend(stats, url):
    return next(b for b in stats["backends"] if b["url"] == url)


class FleetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.hosts = netns_hosts.Hosts(4)
        cls.addClassCleanup(cls.hosts.close)
        say(cls.hosts.describe())
        print(f"fleet hosts: {cls.hosts.describe()}", flush=True)
        cls.model = bf.model_path(seed=1)
        cls.other_model = bf.model_path(seed=2)
        cls.slot_dir = tempfile.mkdtemp(prefix="toki-fleet-slots-")
        cls.addClassCleanup(shutil.rmtree, cls.slot_dir, True)
        # The three fleet servers share one slot-save path (the hosts share
        # this machine's file system), which is toki's --slot-dir.
        cls.servers = [HostLlamaServer(cls.hosts[i], cls.model, f"fleet-{i}",
                                       extra=("--slot-save-path", cls.slot_dir))
                       for i in range(3)]
        for s in cls.servers:
            cls.addClassCleanup(s.kill)
        for s in cls.servers:
            s.wait_ready()
        say("servers: " + ", ".join(s.url for s in cls.servers))

    def fresh_servers(self):
        for s in self.servers:
            s.ensure_running()
            s.erase_slots()
        for f in os.listdir(self.slot_dir):
            os.unlink(os.path.join(self.slot_dir, f))

    # ---- 1. the workload: toki vs round-robin ----

    def test_1_workload_evaluated_over_limit(self):
        reqs, tokens, limit, ref_s = bf.reference(self.model)
        say(f"workload: {len(reqs)} requests in {len(bf.steps_of(reqs))} steps, "
            f"{sum(map(len, tokens))} prompt tokens, limit {limit} (uncached run {ref_s:.0f} s)")

        self.fresh_servers()
        rr, rr_wall = bf.replay(reqs, bf.round_robin_sender(
            [(s.host.addr, s.port) for s in self.servers], timeout=REQUEST_TIMEOUT),
            stop_on_error=True)
        rr_sum = bf.summarize(rr, limit, rr_wall)
        self.assertEqual(rr_sum["ok"], len(reqs), f"round-robin requests failed: "
                                                  f"{rr_sum['errors']}")

        self.fresh_servers()
        toki = th.Toki(self.servers, mode="fast", ubatch=512, name="toki-fleet",
                       extra=("--slot-dir", self.slot_dir))
        try:
            res, wall = bf.replay(reqs, bf.toki_sender(toki.port, timeout=REQUEST_TIMEOUT),
                                  stop_on_error=True)
            stats = toki.stats()
            log_lines = [l for l in toki.log_text().splitlines() if " warn" in l]
        finally:
            toki.kill(signal.SIGTERM)
        t_sum = bf.summarize(res, limit, wall)
        for name, s in (("toki fast + slot files", t_sum), ("round-robin", rr_sum)):
            line = (f"{name}: evaluated {s['evaluated']} / limit {limit} = "
                    f"{s['eval_over_limit']:.3f}; {s['ok']}/{s['n']} ok, wall {s['wall_s']:.1f} s, "
                    f"TTFT p50 {s['ttft_p50_ms']:.0f} ms p95 {s['ttft_p95_ms']:.0f} ms, "
                    f"per backend {sorted(s['per_backend'].values(), reverse=True)}")
            print(line, flush=True)
            say(line)
        say(f"toki: restores {stats.get('restores')}, saves {stats.get('saves')}, "
            f"{len(log_lines)} warnings" + "".join("\n  " + l for l in log_lines[:10]))
        hung = [r for r in res if r is not None and r["status"] != 200]
        self.assertFalse(hung, f"requests through toki failed or hung (no answer within "
                               f"{REQUEST_TIMEOUT} s): {[r.get('error') for r in hung][:3]}")
        self.assertEqual(t_sum["ok"], len(reqs))
        self.assertLessEqual(t_sum["eval_over_limit"], MAX_EVAL_OVER_LIMIT)
        self.assertLess(t_sum["evaluated"], rr_sum["evaluated"])

    # ---- 2. a backend killed mid-run, then restarted ----

    def test_2_backend_killed_and_restarted(self):
        self.fresh_servers()
        toki = th.Toki(self.servers, mode="fast", ubatch=512, name="toki-fleet-kill")
        try:
            self._kill_and_restart(toki)
        finally:
            toki.kill(signal.SIGTERM)

    def _kill_and_restart(self, toki):
        recs = {}
        threads = []

        def launch(key, body):
            def run():
                recs[key] = stream_raw(toki.port, body)
            t = threading.Thread(target=run, daemon=True)
            t.start()
            threads.append(t)

        # Wave A: long streams, one a backend or so (the load term spreads them).
        for k in range(3):
            launch(f"A{k}", {"messages": [{"role": "user", "content": prompt_text(100 + k, 150)}],
                             "max_tokens": 300, "ignore_eos": True, "temperature": 0})
        # Wait until tokens flowed on some backend: a stream of wave A done
        # (its record is written as it ends). Not also a slot seen
        # processing at the same poll: where the streams all ended between
        # two polls the two never showed together, and the clean-clone CI
        # run waited out the whole minute, in both of its passes. A wave
        # that is over by the kill is dealt with below (A3).
        deadline = time.time() + 60
        while time.time() < deadline and not any(r["t_first_data"] for r in recs.values()):
            time.sleep(0.05)
        # Wave B: long prompts, so that some are in a server's prefill.
        for k in range(3):
            launch(f"B{k}", {"messages": [{"role": "user", "content": prompt_text(200 + k, 2500)}],
                             "max_tokens": 64, "temperature": 0})
        # The victim: a server with a slot streaming and, if it comes to that
        # within a few seconds, a slot in prefill (nothing decoded yet).
        victim = None
        deadline = time.time() + 10
        while victim is None and time.time() < deadline:
            for s in self.servers:
                sl = s.slots()
                decoding = any(x["is_processing"] and decoded(x) > 0 for x in sl)
                prefill = any(x["is_processing"] and not decoded(x) for x in sl)
                if decoding and prefill:
                    victim = s
                    break
            time.sleep(0.05)
        # Never both at once: the first server seen streaming, killed then
        # and there. (A server seen streaming during the wait above may be
        # done by its end: on a loaded machine every stream had ended, and
        # the kill cut nothing.)
        if victim is None and not any(t.is_alive() for t in threads):
            launch("A3", {"messages": [{"role": "user", "content": prompt_text(103, 150)}],
                          "max_tokens": 300, "ignore_eos": True, "temperature": 0})
        deadline = time.time() + 60
        while victim is None and time.time() < deadline:
            for s in self.servers:
                if any(x["is_processing"] and decoded(x) > 0 for x in s.slots()):
                    victim = s
                    break
            else:
                time.sleep(0.02)
        self.assertIsNotNone(victim, "no server was streaming")
        before = toki_backend(toki.stats(), victim.url)
        state = [(x["id"], x["is_processing"], decoded(x)) for x in victim.slots()]
        t_kill = time.monotonic()
        victim.kill()
        say(f"killed {victim.url} (pid in {victim.host.ns or 'loopback'}); its slots were "
            f"(id, processing, decoded) {state}")
        # Wave C: right after the kill, before a health check can notice.
        for k in range(3):
            launch(f"C{k}", {"messages": [{"role": "user", "content": prompt_text(300 + k, 60)}],
                             "max_tokens": 16, "temperature": 0})
        for t in threads:
            t.join(REQUEST_TIMEOUT + 30)
        self.assertFalse(any(t.is_alive() for t in threads), "a request hung")

        grace = 0.5  # bytes the victim wrote just before it died may arrive just after
        started, not_started, ambiguous = [], [], []
        for key, r in sorted(recs.items()):
            t0 = r["t_first_data"]
            if t0 is not None and t0 < t_kill:
                started.append(key)
            elif t0 is not None and t0 < t_kill + grace and r["error"]:
                ambiguous.append(key)
            else:
                not_started.append(key)
            backend = (r["cache"] or {}).get("backend")
            say(f"  {key}: status {r['status']}, first data "
                f"{'-' if t0 is None else f'{t0 - t_kill:+.2f} s'} vs kill, "
                f"{'error ' + json.dumps(r['error'])[:100] if r['error'] else 'done' if r['done'] else 'no end'}"
                f", backend {backend}{', ' + r['exception'] if r['exception'] else ''}")
        errors = [k for k in recs if recs[k]["error"]]
        print(f"kill: {len(recs)} requests; streaming at the kill {started}, ended with an "
              f"error event {errors}; not started {not_started}", flush=True)
        # Every problem is listed, then the test fails with all of them.
        problems = []
        for key in not_started:
            r = recs[key]
            if r["exception"]:
                problems.append(f"{key} (no data yet at the kill) got no answer: {r['exception']}"
                                f" (hung {REQUEST_TIMEOUT} s?)")
            elif r["status"] != 200:
                problems.append(f"{key} (no data yet at the kill) got {r['status']}: "
                                f"{r.get('body', '')[:200]}")
            elif r["error"]:
                problems.append(f"{key} had received no data when {victim.url} died, yet it "
                                f"was lost instead of retried: {json.dumps(r['error'])}")
            elif not (r["done"] and r["cache"]):
                problems.append(f"{key} did not end normally: {r}")
            elif r["cache"]["backend"] == victim.url:
                problems.append(f"{key} answered by the dead {victim.url}?")
        for key in errors:
            r = recs[key]
            if key not in started + ambiguous:
                continue  # listed above
            if "message" not in r["error"] or r["after_error"] or r["done"]:
                problems.append(f"{key}: not a clean error event then the end: {r}")
        for key in started:
            r = recs[key]
            # Either it was on another server and finished, or it was on the
            # victim and ended with the error event.
            if r["done"] and r["t_end"] is not None and r["t_end"] < t_kill and r["cache"]:
                continue  # it had ended before the kill: nothing of it was cut
            if r["exception"]:
                problems.append(f"{key} (streaming at the kill) hung: {r['exception']}")
            elif not (r["error"] or (r["done"] and r["cache"] and
                                     r["cache"]["backend"] != victim.url)):
                problems.append(f"{key} (streaming at the kill) ended neither way: {r}")
        if not any(recs[k]["error"] for k in started + ambiguous):
            problems.append("no stream was cut by the kill: the test did not exercise it")
        text = toki.log_text()
        say(f"toki log: {text.count('failed before streaming')} request(s) retried on another "
            f"backend after the forward failed, {text.count('is down')} 'is down' line(s)")

        # Restart: it rejoins (one more discovery) and gets requests again.
        victim.start()
        deadline = time.time() + 30
        after = None
        while time.time() < deadline:
            after = toki_backend(toki.stats(), victim.url)
            if after["up"] and after["discoveries"] > before["discoveries"]:
                break
            time.sleep(0.2)
        if not after["up"] or after["discoveries"] != before["discoveries"] + 1:
            problems.append(f"after the restart /toki/stats shows {after} (discoveries before: "
                            f"{before['discoveries']})")
        landed = []
        for rnd in range(4):
            out = {}

            def one(k):
                try:
                    out[k] = http_json("127.0.0.1", toki.port, "POST", "/v1/chat/completions",
                                       {"messages": [{"role": "user", "content":
                                                      prompt_text(400 + 10 * rnd + k, 80)}],
                                        "max_tokens": 8, "temperature": 0},
                                       timeout=REQUEST_TIMEOUT)
                except Exception as e:
                    out[k] = (0, repr(e))
            ts = [threading.Thread(target=one, args=(k,)) for k in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(REQUEST_TIMEOUT + 10)
            for k, (st, body) in sorted(out.items()):
                if st == 200:
                    landed.append(body["cache"]["backend"])
                else:
                    problems.append(f"after the restart, a request got {st}: {str(body)[:200]}")
            if victim.url in landed or len(landed) < len(out):
                break
        say(f"after the restart: {landed.count(victim.url)}/{len(landed)} requests on "
            f"{victim.url}; discoveries {before['discoveries']} -> {after['discoveries']}")
        print(f"recovered: {victim.url} up {after['up']}, discoveries {before['discoveries']} -> "
              f"{after['discoveries']}, got {landed.count(victim.url)} of {len(landed)} "
              f"requests", flush=True)
        if victim.url not in landed:
            problems.append(f"no request reached the restarted {victim.url}: {landed}")
        self.assertFalse(problems, "\n" + "\n".join(problems))

    # ---- 3. routing by model ----

    def test_3_only_backends_serving_the_model(self):
        other = HostLlamaServer(self.hosts[3], self.other_model, "fleet-other")
        self.addCleanup(other.kill)
        other.wait_ready()
        fleet = self.servers[:2]
        for s in fleet:
            s.ensure_running()
        other_id, fleet_id = other.model_id(), fleet[0].model_id()
        self.assertNotEqual(other_id, fleet_id)
        toki = th.Toki(fleet + [other], mode="fast", ubatch=512, name="toki-fleet-models")
        try:
            deadline = time.time() + 30
            while time.time() < deadline and not all(b["up"] for b in toki.stats()["backends"]):
                time.sleep(0.1)
            landed = {other_id: [], fleet_id: []}

            def one(model, k):
                try:
                    st, body = http_json("127.0.0.1", toki.port, "POST", "/v1/chat/completions",
                                         {"model": model, "temperature": 0, "max_tokens": 8,
                                          "messages": [{"role": "user",
                                                        "content": prompt_text(500 + k, 100)}]},
                                         timeout=REQUEST_TIMEOUT)
                except Exception as e:  # a hang: no answer within REQUEST_TIMEOUT
                    st, body = 0, repr(e)
                landed[model].append((st, body.get("cache", {}).get("backend")
                                      if isinstance(body, dict) else body))
            ts = [threading.Thread(target=one, args=(model, k))
                  for model in (other_id, fleet_id) for k in range(6)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(REQUEST_TIMEOUT + 10)
            say(f"model {other_id}: {landed[other_id]}")
            say(f"model {fleet_id}: {landed[fleet_id]}")
        finally:
            toki.kill(signal.SIGTERM)
        for st, b in landed[other_id] + landed[fleet_id]:
            self.assertEqual(st, 200, f"{b} (no answer within {REQUEST_TIMEOUT} s: hung)")
        for st, b in landed[other_id]:
            self.assertEqual((st, b), (200, other.url))
        for st, b in landed[fleet_id]:
            self.assertEqual(st, 200, b)
            self.assertIn(b, [s.url for s in fleet])
        print(f"models: 6/6 requests for {os.path.basename(other_id)} on {other.url}; "
              f"6/6 for {os.path.basename(fleet_id)} on the others", flush=True)


class RpcTest(unittest.TestCase):
    """llama.cpp's RPC backend: a model spread over two workers' memory."""

    def test_rpc_workers_behind_toki_up(self):
        ls = th.llama_server_path()
        rpc_bin = os.path.join(os.path.dirname(ls), "ggml-rpc-server")
        if not os.access(rpc_bin, os.X_OK):
            self.skipTest(f"no ggml-rpc-server beside {ls}")
        hosts = netns_hosts.Hosts(2)
        self.addCleanup(hosts.close)
        print(f"rpc hosts: {hosts.describe()}", flush=True)
        tmp = tempfile.mkdtemp(prefix="toki-rpc-")
        self.addCleanup(shutil.rmtree, tmp, True)
        workers = []
        for i, h in enumerate(hosts):
            port = th.free_port()
            log = open(os.path.join(tmp, f"rpc-{i}.log"), "w")
            self.addCleanup(log.close)
            p = h.popen([rpc_bin, "-H", h.addr, "-p", str(port)], stdout=log,
                        stderr=subprocess.STDOUT)
            workers.append((h, port, p, log.name))
        for h, port, p, _ in workers:
            deadline = time.time() + 30
            while True:
                try:
                    socket.create_connection((h.addr, port), timeout=1).close()
                    break
                except OSError:
                    if p.poll() is not None or time.time() > deadline:
                        raise
                    time.sleep(0.1)
        rpc = ",".join(f"{h.addr}:{port}" for h, port, _, _ in workers)
        env = dict(os.environ, TOKI_STATE_DIR=os.path.join(tmp, "state"),
                   TOKI_MODEL_REGISTRY=os.path.join(tmp, "models.yaml"),
                   TOKI_LLAMA_SERVER=ls)
        port = th.free_port()
        model = bf.model_path(seed=1)
        up = subprocess.run([th.TOKI_BIN, "up", "--model", model, "--name", "rpc", "--port",
                             str(port), "--ctx", "2048", "--slots", "1", "--wait", "120", "--",
                             "--rpc", rpc, "-lv", "4"],
                            env=env, capture_output=True, text=True, timeout=180)

        def down():
            subprocess.run([th.TOKI_BIN, "down", "rpc"], env=env, capture_output=True,
                           timeout=60)
        self.addCleanup(down)
        say(f"toki up: rc {up.returncode}: {(up.stdout + up.stderr).strip()[-300:]}")
        self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
        st, body = http_json("127.0.0.1", port, "POST", "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "Hello over RPC"}],
                              "max_tokens": 8, "temperature": 0}, timeout=120)
        self.assertEqual(st, 200, body)
        self.assertTrue(body["choices"][0]["message"]["content"] is not None)
        self.assertIn("cache", body)
        with open(os.path.join(tmp, "state", "run", "rpc", "llama-server.log"),
                  errors="replace") as f:
            log = f.read()
        used = [l.strip() for l in log.splitlines()
                if "RPC" in l and ("model buffer size" in l or "using device" in l)]
        say("llama-server log:\n  " + "\n  ".join(used))
        for h, port, _, _ in workers:
            self.assertTrue(any(f"{h.addr}:{port}" in l and "model buffer size" in l
                                for l in used), f"no model buffer on {h.addr}:{port}: {used}")
        print(f"rpc: a chat completion through toki with the model on {rpc}", flush=True)


if __name__ == "__main__":
    # A SIGTERM (a timeout) unwinds, so that the namespaces are deleted at exit.
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    th.run_tests()
