"""Network namespaces as separate test hosts. Standard library only.

Each host is a network namespace joined to the root namespace by its own veth
pair, with a /30 of the test's own from 10.231.0.0/16: the root end is
10.231.X.(4k+1), the host's end 10.231.X.(4k+2). The namespaces have no
default route and the root namespace does not forward, so a host can reach
only the root namespace over its veth, and the root namespace reaches the host
only through the connected /30 route on that veth: the traffic never leaves
these links. Processes run inside with `ip netns exec NAME ...` (which execs,
so the pid is the process's own).

Names carry this process's pid (`toki-<pid>-<i>`, veths `tk<pid hex>r<i>` /
`tk<pid hex>h<i>`), so runs side by side do not collide; leftovers of a run
that died (a namespace whose pid is gone) are removed when the next one
starts. close() (also at exit) kills what runs in the namespaces and deletes
them and their veths.

Without the privileges for namespaces (`ip netns add` fails), Hosts falls back
to loopback: every host is 127.0.0.1, each process on its own port, and
`fallback` says why. Tests print that.

    with Hosts(3) as hosts:
        h = hosts[0]
        p = h.popen(["llama-server", "--host", h.addr, "--port", "8080", ...])
        ... http://{h.addr}:8080 ...
"""
import atexit
import fcntl
import ipaddress
import os
import random
import re
import signal
import subprocess
import time

NET = ipaddress.ip_network("10.231.0.0/16")
LOCK = "/run/lock/toki-netns.lock"
_live = []


def _ip(*args, check=True, ns=None):
    cmd = ["ip"] + (["netns", "exec", ns, "ip"] if ns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise OSError(f"{' '.join(cmd)}: {r.stderr.strip() or r.returncode}")
    return r


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def netns_pids(ns):
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(x) for x in r.stdout.split()] if r.returncode == 0 else []


def _kill_all_in(ns):
    for _ in range(50):
        pids = netns_pids(ns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def _delete(ns, veth_root):
    _kill_all_in(ns)
    _ip("link", "del", veth_root, check=False)
    _ip("netns", "del", ns, check=False)


def clean_stale():
    """Removes the namespaces (and veths) of runs whose process is gone."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        m = re.match(r"toki-(\d+)-(\d+)\b", line.strip())
        if m and not _pid_alive(int(m.group(1))):
            _delete(m.group(0), f"tk{int(m.group(1)):x}r{m.group(2)}")


def _used_networks():
    """The IPv4 networks on the root namespace's links and routes."""
    used = []
    for args in (("-4", "-o", "addr", "show"), ("-4", "route", "show", "table", "all")):
        out = _ip(*args, check=False).stdout
        for tok in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", out):
            try:
                used.append(ipaddress.ip_network(tok, strict=False))
            except ValueError:
                pass
    return used


class Host:
    """One test host: `addr` is where its processes listen; `peer` is the
    root namespace's address on the same link (what the host sees as its
    client). In the loopback fallback both are 127.0.0.1 and `ns` is None."""

    def __init__(self, index, ns=None, addr="127.0.0.1", peer="127.0.0.1", veth_root=None):
        self.index = index
        self.ns = ns
        self.addr = addr
        self.peer = peer
        self.veth_root = veth_root
        self.procs = []

    def command(self, args):
        return (["ip", "netns", "exec", self.ns] if self.ns else []) + list(args)

    def popen(self, args, **kw):
        """Starts a process on this host (in its own session, so that it can
        be signalled as a group)."""
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self.command(args), **kw)
        self.procs.append(p)
        return p

    def run(self, args, **kw):
        return subprocess.run(self.command(args), **kw)

    def pids(self):
        """Every process in this host's namespace (None in the fallback)."""
        return netns_pids(self.ns) if self.ns else None

    def kill(self, pid, sig=signal.SIGKILL):
        """Signals one process of this host by pid, after checking that it
        runs in this host's namespace."""
        if self.ns and pid not in netns_pids(self.ns):
            raise AssertionError(f"pid {pid} is not in namespace {self.ns}")
        os.kill(pid, sig)

    def __repr__(self):
        return f"Host({self.ns or 'loopback'} {self.addr})"


class Hosts:
    """n hosts, each a network namespace (or, as a fallback, loopback)."""

    def __init__(self, n, force_loopback=False):
        self.hosts = []
        self.fallback = None
        self._closed = False
        if force_loopback or os.environ.get("TOKI_TEST_NO_NETNS"):
            self.fallback = "namespaces not wanted (TOKI_TEST_NO_NETNS)"
        else:
            try:
                self._create(n)
            except OSError as e:
                self.close()
                self.fallback = f"network namespaces unavailable ({e})"
                self.hosts = []
        if self.fallback:
            self.hosts = [Host(i) for i in range(n)]
        _live.append(self)

    @property
    def isolated(self):
        return self.fallback is None

    def describe(self):
        if self.fallback:
            return f"{len(self.hosts)} hosts on loopback ports: {self.fallback}"
        return (f"{len(self.hosts)} hosts in network namespaces: " +
                ", ".join(f"{h.ns} {h.addr} (veth {h.veth_root}, root {h.peer})"
                          for h in self.hosts))

    def _create(self, n):
        clean_stale()
        os.makedirs(os.path.dirname(LOCK), exist_ok=True)
        pid = os.getpid()
        with open(LOCK, "a") as lk:
            # Runs side by side take their subnets one at a time.
            fcntl.flock(lk, fcntl.LOCK_EX)
            used = _used_networks()
            subnets = list(NET.subnets(new_prefix=30))
            start = random.Random(pid ^ int(time.time())).randrange(len(subnets))
            free = []
            for k in range(len(subnets)):
                s = subnets[(start + k) % len(subnets)]
                if not any(s.overlaps(u) for u in used if u.prefixlen > 0):
                    free.append(s)
                    if len(free) == n:
                        break
            if len(free) < n:
                raise OSError("no free /30 left in " + str(NET))
            for i, net in enumerate(free):
                ns = f"toki-{pid}-{i}"
                vr, vh = f"tk{pid:x}r{i}", f"tk{pid:x}h{i}"
                root_a, host_a = str(net[1]), str(net[2])
                _delete(ns, vr)  # a leftover of the same name
                _ip("netns", "add", ns)
                h = Host(i, ns, host_a, root_a, vr)
                self.hosts.append(h)
                _ip("link", "add", vr, "type", "veth", "peer", "name", vh)
                _ip("link", "set", vh, "netns", ns)
                _ip("addr", "add", f"{root_a}/30", "dev", vr)
                _ip("link", "set", vr, "up")
                _ip("addr", "add", f"{host_a}/30", "dev", vh, ns=ns)
                _ip("link", "set", "lo", "up", ns=ns)
                _ip("link", "set", vh, "up", ns=ns)
        # The links are up once the host answers a ping-free check: its
        # address is assigned and the root side has the connected route.
        for h in self.hosts:
            r = _ip("-4", "route", "get", h.addr, check=False).stdout
            if h.veth_root not in r:
                raise OSError(f"no route to {h.addr} over {h.veth_root}: {r.strip()}")

    def __getitem__(self, i):
        return self.hosts[i]

    def __len__(self):
        return len(self.hosts)

    def __iter__(self):
        return iter(self.hosts)

    def close(self):
        if self._closed:
            return
        self._closed = True
        for h in self.hosts:
            for p in h.procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    try:
                        p.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        pass
            if h.ns:
                _delete(h.ns, h.veth_root)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@atexit.register
def _close_all():
    for hs in _live:
        hs.close()
