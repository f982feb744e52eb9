"""`toki model pull` and `toki model install-llama` against local stand-ins for
the Hugging Face hub and GitHub's release API (fake_hosts.py): real toki
processes, real HTTP, real files; the installed llama-server is started and
must answer /health with the test model."""
import hashlib
import io
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toki_harness as th  # noqa: E402
from fake_hosts import FakeHosts  # noqa: E402

REPO = "tiny-org/stories-GGUF"


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def read(path):
    with open(path, "rb") as f:
        return f.read()


def asset_arch():
    m = platform.machine()
    return {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(m, m)


class FetchCase(unittest.TestCase):
    """Each test: its own fake hosts, state directory and registry."""

    def setUp(self):
        self.hosts = FakeHosts()
        self.tmp = tempfile.mkdtemp(prefix="toki-fetch-")
        self.state = os.path.join(self.tmp, "state")
        self.registry = os.path.join(self.tmp, "config", "models.yaml")
        self.env = dict(os.environ)
        for k in ("HF_TOKEN", "GITHUB_TOKEN", "XDG_STATE_HOME"):
            self.env.pop(k, None)
        self.env.update({"TOKI_STATE_DIR": self.state, "TOKI_MODEL_REGISTRY": self.registry,
                         "HF_ENDPOINT": self.hosts.url,
                         "TOKI_LLAMA_RELEASES_URL": self.hosts.url})

    def tearDown(self):
        self.hosts.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def toki(self, *args, env=None, timeout=120):
        e = dict(self.env)
        e.update(env or {})
        return subprocess.run([th.TOKI_BIN, *args], capture_output=True, text=True, env=e,
                              timeout=timeout)

    def assertFails(self, r, *phrases):
        self.assertNotEqual(r.returncode, 0, f"should have failed:\n{r.stdout}{r.stderr}")
        for p in phrases:
            self.assertIn(p, r.stderr)


class PullTest(FetchCase):
    def setUp(self):
        super().setUp()
        self.model = read(th.test_model())

    def model_dir(self, name):
        return os.path.join(self.state, "models", name)

    def test_pull_by_file_downloads_checks_and_registers(self):
        self.hosts.add_file(REPO, "stories260K.gguf", self.model)
        self.hosts.add_file(REPO, "README.md", b"# tiny\n")
        r = self.toki("model", "pull", REPO, "--file", "stories260K.gguf", "--name", "tiny")
        self.assertEqual(r.returncode, 0, r.stderr)
        dest = os.path.join(self.model_dir("tiny"), "stories260K.gguf")
        self.assertEqual(r.stdout.strip(), dest)
        self.assertEqual(sha256(read(dest)), sha256(self.model))
        self.assertFalse(os.path.exists(dest + ".part"))
        # The hub's API and paths were used: a tree listing, then resolve.
        self.assertTrue(self.hosts.requests_to(f"/api/models/{REPO}/tree/main"))
        self.assertTrue(self.hosts.requests_to(f"/{REPO}/resolve/main/stories260K.gguf"))
        reg = read(self.registry).decode()
        self.assertIn("tiny:", reg)
        self.assertIn(dest, reg)
        self.assertIn(REPO, reg)
        # Pulling again finds the checked file and fetches nothing.
        before = len(self.hosts.requests_to("/cdn/"))
        r = self.toki("model", "pull", REPO, "--file", "stories260K.gguf", "--name", "tiny")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("already downloaded", r.stderr)
        self.assertEqual(len(self.hosts.requests_to("/cdn/")), before)

    def test_pull_retries_a_hub_that_drops_or_fails_a_listing(self):
        """An empty reply, then a 503: the third try lands. Four hubs'
        worth of that (a proxy dropping a request) failed a pull before."""
        self.hosts.add_file(REPO, "stories260K.gguf", self.model)
        self.hosts.listing_failures = ["drop", 503]
        r = self.toki("model", "pull", REPO, "--file", "stories260K.gguf", "--name", "tiny")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(self.hosts.requests_to(f"/api/models/{REPO}/tree/main")), 3)
        # Three failures in a row are an error that names the hub.
        self.hosts.listing_failures = [503, 503, 503]
        r = self.toki("model", "pull", REPO, "--file", "stories260K.gguf", "--name", "tiny2")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("503", r.stderr)

    def test_pull_by_quant_picks_one_and_refuses_ambiguity(self):
        variants = {"stories-Q4_K_M.gguf": self.model, "stories-IQ4_XS.gguf": self.model[:-1],
                    "stories-Q8_0.gguf": self.model + b"\0",
                    "mmproj-stories-Q8_0.gguf": b"GGUF projector"}
        for p, data in variants.items():
            self.hosts.add_file(REPO, p, data)
        r = self.toki("model", "pull", REPO, "--quant", "q8_0")
        self.assertEqual(r.returncode, 0, r.stderr)
        dest = os.path.join(self.model_dir("stories-Q8_0"), "stories-Q8_0.gguf")
        self.assertEqual(r.stdout.strip(), dest)
        self.assertEqual(read(dest), self.model + b"\0")
        # Q4 is in two names: refused, with both listed.
        r = self.toki("model", "pull", REPO, "--quant", "Q4", "--name", "x")
        self.assertFails(r, "matches more than one", "stories-Q4_K_M.gguf", "stories-IQ4_XS.gguf")
        # No such quant: the GGUFs are listed.
        r = self.toki("model", "pull", REPO, "--quant", "Q5_K_M", "--name", "y")
        self.assertFails(r, "no GGUF", "Q5_K_M", "stories-Q8_0.gguf")
        self.assertFalse(os.path.exists(self.model_dir("x")))
        self.assertFalse(os.path.exists(self.model_dir("y")))

    def test_pull_cut_once_resumes_by_itself(self):
        """A connection cut mid-file: the same pull resumes from what arrived
        (a Range request) and lands."""
        self.hosts.add_file(REPO, "stories260K.gguf", self.model)
        cut = len(self.model) // 3
        self.hosts.cut_once(self.model, cut)
        r = self.toki("model", "pull", REPO, "--file", "stories260K.gguf", "--name", "tiny")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("trying again", r.stderr)
        ranges = [h.get("Range") for _, _, h in self.hosts.requests_to("/cdn/")]
        self.assertEqual(ranges[-1], f"bytes={cut}-")
        dest = os.path.join(self.model_dir("tiny"), "stories260K.gguf")
        self.assertEqual(sha256(read(dest)), sha256(self.model))
        self.assertFalse(os.path.exists(dest + ".part"))

    def test_pull_interrupted_then_resumed_with_range(self):
        """Cut three times in a row (every try of one command): the pull
        fails, keeps what arrived, and the next command resumes from it."""
        self.hosts.add_file(REPO, "stories260K.gguf", self.model)
        cut = len(self.model) // 8
        self.hosts.cut_once(self.model, cut, times=3)
        r = self.toki("model", "pull", REPO, "--file", "stories260K.gguf", "--name", "tiny")
        self.assertFails(r, "resume")
        dest = os.path.join(self.model_dir("tiny"), "stories260K.gguf")
        self.assertFalse(os.path.exists(dest))
        self.assertEqual(os.path.getsize(dest + ".part"), 3 * cut)
        self.assertFalse(os.path.exists(self.registry))

        r = self.toki("model", "pull", REPO, "--file", "stories260K.gguf", "--name", "tiny")
        self.assertEqual(r.returncode, 0, r.stderr)
        ranges = [h.get("Range") for _, _, h in self.hosts.requests_to("/cdn/")]
        self.assertEqual(ranges[-1], f"bytes={3 * cut}-")
        self.assertEqual(sha256(read(dest)), sha256(self.model))
        self.assertFalse(os.path.exists(dest + ".part"))

    def test_pull_replaces_a_stale_partial_file(self):
        # A .part left by a pull of another version of the file: the resume
        # does not match, so one fresh download follows.
        self.hosts.add_file(REPO, "stories260K.gguf", self.model)
        d = self.model_dir("tiny")
        os.makedirs(d)
        with open(os.path.join(d, "stories260K.gguf.part"), "wb") as f:
            f.write(b"an older upload" * 100)
        r = self.toki("model", "pull", REPO, "--file", "stories260K.gguf", "--name", "tiny")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("does not match; downloading it again", r.stderr)
        ranges = [h.get("Range") for _, _, h in self.hosts.requests_to("/cdn/")]
        self.assertEqual(ranges, ["bytes=1500-", None])
        self.assertEqual(read(os.path.join(d, "stories260K.gguf")), self.model)

    def test_pull_checksum_mismatch_is_refused(self):
        self.hosts.add_file(REPO, "stories260K.gguf", self.model)
        self.hosts.wrong_sha.add("stories260K.gguf")
        r = self.toki("model", "pull", REPO, "--file", "stories260K.gguf", "--name", "tiny")
        self.assertFails(r, "checksum mismatch", "deleted")
        d = self.model_dir("tiny")
        self.assertEqual(os.listdir(d) if os.path.isdir(d) else [], [])
        self.assertFalse(os.path.exists(self.registry))

    def test_pull_sends_hf_token(self):
        self.hosts.require_token = "hf_test_secret"
        self.hosts.add_file(REPO, "stories260K.gguf", self.model)
        r = self.toki("model", "pull", REPO, "--name", "tiny")
        self.assertFails(r, "HF_TOKEN")
        r = self.toki("model", "pull", REPO, "--name", "tiny",
                      env={"HF_TOKEN": "hf_wrong"})
        self.assertFails(r, "HF_TOKEN", "no access")
        r = self.toki("model", "pull", REPO, "--name", "tiny",
                      env={"HF_TOKEN": "hf_test_secret"})
        self.assertEqual(r.returncode, 0, r.stderr)
        for prefix in (f"/api/models/{REPO}/", f"/{REPO}/resolve/"):
            reqs = self.hosts.requests_to(prefix)
            self.assertTrue(reqs)
            self.assertEqual(reqs[-1][2].get("Authorization"), "Bearer hf_test_secret")
        self.assertEqual(read(r.stdout.strip()), self.model)

    def test_pull_split_gguf_fetches_every_shard(self):
        # Three shards cut from one file, in a subdirectory, listed two
        # entries per page so that the Link paging is followed.
        third = len(self.model) // 3
        parts = [self.model[:third], self.model[third:2 * third], self.model[2 * third:]]
        names = [f"Q4_K_M/stories-Q4_K_M-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
        for n, data in zip(names, parts):
            self.hosts.add_file(REPO, n, data)
        self.hosts.add_file(REPO, "stories-Q8_0.gguf", self.model)
        self.hosts.page_size = 2
        r = self.toki("model", "pull", REPO, "--file", "stories-Q4_K_M-00002-of-00003.gguf",
                      "--name", "split")
        self.assertEqual(r.returncode, 0, r.stderr)
        d = self.model_dir("split")
        first = os.path.join(d, "stories-Q4_K_M-00001-of-00003.gguf")
        self.assertEqual(r.stdout.strip(), first)
        self.assertEqual(sorted(os.listdir(d)), sorted(n.split("/")[1] for n in names))
        joined = b"".join(read(os.path.join(d, n.split("/")[1])) for n in names)
        self.assertEqual(joined, self.model)
        self.assertGreater(len(self.hosts.requests_to(f"/api/models/{REPO}/tree/")), 1)
        self.assertIn(first, read(self.registry).decode())
        # The quant names the split model as one candidate.
        r = self.toki("model", "pull", REPO, "--quant", "Q4_K_M", "--name", "split2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(os.listdir(self.model_dir("split2"))), 3)

    def test_pull_split_with_a_missing_shard_is_refused(self):
        self.hosts.add_file(REPO, "m-00001-of-00002.gguf", self.model[:100])
        r = self.toki("model", "pull", REPO, "--name", "broken")
        self.assertFails(r, "lacks shard", "00002")

    def test_pull_unknown_repository(self):
        r = self.toki("model", "pull", "nobody/nothing-GGUF", "--name", "n")
        self.assertFails(r, "no repository nobody/nothing-GGUF")
        r = self.toki("model", "pull", "../etc", "--name", "n")
        self.assertFails(r, "org/name")
        r = self.toki("model", "pull", REPO, "--name", "../evil")
        self.assertFails(r, "--name")


def wrapper_script():
    """The provisioned llama-server wrapper (a small shell script with
    absolute paths), or a one-line wrapper around another llama-server."""
    server = th.llama_server_path()
    data = read(server)
    if data.startswith(b"#!") and len(data) < 65536:
        return data
    return f"#!/bin/sh\nexec '{server}' \"$@\"\n".encode()


def tar_of(entries):
    """A .tar.gz of (name, data, kind, link) entries; directories and
    libraries get mode 755."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data, kind, link in entries:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            info.mode = 0o755 if kind == tarfile.DIRTYPE or ".so" in name or \
                name.endswith("llama-server") else 0o644
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            t.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return buf.getvalue()


def make_tar(tag, script, extra=(), libs=()):
    """The current llama.cpp layout: llama-<tag>/ holding the binaries and
    libraries, with the libraries' symbolic links."""
    d = f"llama-{tag}"
    entries = [(d, b"", tarfile.DIRTYPE, ""),
               (f"{d}/llama-server", script, tarfile.REGTYPE, ""),
               (f"{d}/libggml.so.0.0.1", b"not really a library", tarfile.REGTYPE, ""),
               (f"{d}/libggml.so.0", b"", tarfile.SYMTYPE, "libggml.so.0.0.1"),
               (f"{d}/LICENSE", b"MIT\n", tarfile.REGTYPE, "")]
    entries += [(f"{d}/{lib}", b"not really a library", tarfile.REGTYPE, "") for lib in libs]
    return tar_of(entries + list(extra))


H100 = "NVIDIA H100 80GB HBM3 (81559 MiB, 80000 MiB free)"


def fake_server(devices, needs=None, log="", list_devices=None):
    """A stand-in for a release build's llama-server: a shell script (shell
    built-ins only: the tests run toki with a PATH of fakes) that answers
    --version and --list-devices as llama-server does, listing devices
    (["CUDA0: ..."]; none: "(none)") after the lines of log. When needs
    names a library it fails as the dynamic loader does unless the library
    is beside it, where llama.cpp's Linux builds find theirs (RPATH
    $ORIGIN): so a test passes only if the CUDA runtime was put there.
    list_devices: shell commands to run for --list-devices instead."""
    listing = "".join(f"  {d}\\n" for d in devices) or "  (none)\\n"
    if list_devices is None:
        list_devices = f'printf "{log}Available devices:\\n{listing}"'
    check = ""
    if needs:
        check = (f'if [ ! -e "${{0%/*}}/{needs}" ]; then\n'
                 f'  printf "%s: error while loading shared libraries: {needs}: cannot open '
                 f'shared object file: No such file or directory\\n" "$0" >&2\n'
                 f'  exit 127\nfi\n')
    return (f'#!/bin/sh\n{check}case "$1" in\n'
            f'--version) printf "version: 11462 (4f1c2d3)\\nbuilt with GNU 13.3.0 for Linux\\n" >&2 ;;\n'
            f'--list-devices) {list_devices} ;;\n'
            f'*) printf "fake llama-server: %s\\n" "$*" >&2; exit 1 ;;\n'
            f'esac\n').encode()


def fake_tools(bindir, cuda_version="13.4", vulkan_gpu=None):
    """nvidia-smi as the NVIDIA driver's (-L lists the GPU; plain output
    starts with the header that states the driver's CUDA version), and,
    with vulkan_gpu, vulkaninfo --summary naming that GPU."""
    os.makedirs(bindir, exist_ok=True)
    smi = ("#!/bin/sh\n"
           'if [ "$1" = "-L" ]; then\n'
           '  printf "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5e2b7c1a-0d1f-4c1e-9a55-3f0e1b2c3d4e)\\n"\n'
           "  exit 0\nfi\n"
           "printf '%s\\n' 'Tue Sep 30 10:12:01 2026' "
           "'+-----------------------------------------------------------------------------------------+' "
           f"'| NVIDIA-SMI 590.48.01             Driver Version: 590.48.01      CUDA Version: {cuda_version}     |' "
           "'|-----------------------------------------+------------------------+----------------------+' "
           "'|   0  NVIDIA H100 80GB HBM3          On  |   00000000:19:00.0 Off |                    0 |'\n")
    tools = {"nvidia-smi": smi}
    if vulkan_gpu:
        tools["vulkaninfo"] = ("#!/bin/sh\nprintf '%s\\n' 'Devices:' 'GPU0:' "
                               "'\tdeviceType = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU' "
                               f"'\tdeviceName = {vulkan_gpu}'\n")
    for name, body in tools.items():
        p = os.path.join(bindir, name)
        with open(p, "w") as f:
            f.write(body)
        os.chmod(p, 0o755)


def make_zip(script):
    """The older layout: build/bin/llama-server in a .zip."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        info = zipfile.ZipInfo("build/bin/llama-server")
        info.external_attr = (0o755 | stat.S_IFREG) << 16
        z.writestr(info, script)
        z.writestr("build/bin/LICENSE", "MIT\n")
    return buf.getvalue()


class InstallLlamaTest(FetchCase):
    def setUp(self):
        super().setUp()
        self.arch = asset_arch()
        self.script = wrapper_script()
        self.tar = make_tar("b7001", self.script)
        self.vulkan_tar = make_tar("b7001", fake_server(["Vulkan0: " + H100]))
        self.zip = make_zip(self.script)
        a = self.arch
        self.hosts.add_release("b7001", [
            (f"llama-b7001-bin-ubuntu-{a}.tar.gz", self.tar, True),
            (f"llama-b7001-bin-ubuntu-vulkan-{a}.tar.gz", self.vulkan_tar, True),
            ("llama-b7001-bin-macos-arm64.tar.gz", b"mac", True),
            ("llama-b7001-bin-win-cpu-x64.zip", b"win", True),
            ("cudart-llama-bin-win-cuda-12.4-x64.zip", b"dlls", True),
            ("llama-b7001-xcframework.zip", b"ios", True),
        ], latest=True)
        # An older release: .zip assets and no digests (as before mid-2025).
        self.hosts.add_release("b6000", [(f"llama-b6000-bin-ubuntu-{a}.zip", self.zip, None)])

    def installed(self, name):
        return os.path.join(self.state, "llama", name)

    def build_json(self, server):
        with open(os.path.join(os.path.dirname(server), "build.json")) as f:
            return json.load(f)

    def test_install_latest_and_serve_the_test_model(self):
        if platform.system() != "Linux":
            self.skipTest("the fake release has Linux builds only")
        r = self.toki("model", "install-llama", "--backend", "cpu")
        self.assertEqual(r.returncode, 0, r.stderr)
        server = r.stdout.strip()
        self.assertEqual(server, os.path.join(self.installed("b7001-cpu"), "llama-b7001",
                                              "llama-server"))
        self.assertIn("matches the release's SHA-256", r.stderr)
        self.assertTrue(self.hosts.requests_to(
            f"/download/b7001/llama-b7001-bin-ubuntu-{self.arch}.tar.gz"))
        self.assertTrue(os.access(server, os.X_OK))
        lib = os.path.join(os.path.dirname(server), "libggml.so.0")
        self.assertEqual(os.readlink(lib), "libggml.so.0.0.1")
        meta = self.build_json(server)
        self.assertEqual(meta["tag"], "b7001")
        self.assertEqual(meta["backend"], "cpu")
        self.assertEqual(meta["sha256"], sha256(self.tar))
        self.assertTrue(meta["sha256_verified"])
        self.assertEqual(meta["llama_server"], server)
        self.assertIsNone(meta["gfx"])
        # No temporary directories or archives are left behind.
        self.assertEqual(sorted(os.listdir(os.path.join(self.state, "llama"))),
                         [".downloads", "b7001-cpu"])
        self.assertEqual(os.listdir(os.path.join(self.state, "llama", ".downloads")), [])

        port = th.free_port()
        proc = th.Process([server, "-m", th.test_model(), "--host", "127.0.0.1", "--port",
                           str(port), "-np", "1", "-t", "2"], f"installed-llama-{port}.log")
        try:
            th.wait_http(port, timeout=120)
            st, body = th.request(port, "POST", "/completion",
                                  {"prompt": "Once upon a time", "n_predict": 4})
            self.assertEqual(st, 200, body)
            self.assertIn("content", body)
        finally:
            proc.kill()
            proc.log.close()

    def test_install_pinned_tag_from_zip_without_digest(self):
        r = self.toki("model", "install-llama", "--backend", "cpu", "--tag", "b6000",
                      "--gfx", "10.3.0", "--name", "old")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(self.hosts.requests_to(
            "/repos/ggml-org/llama.cpp/releases/tags/b6000"))
        self.assertFalse(self.hosts.requests_to("/repos/ggml-org/llama.cpp/releases/latest"))
        server = r.stdout.strip()
        self.assertEqual(server, os.path.join(self.installed("old"), "build", "bin",
                                              "llama-server"))
        self.assertIn("cannot be verified", r.stderr)
        meta = self.build_json(server)
        self.assertEqual((meta["tag"], meta["gfx"]), ("b6000", "10.3.0"))
        self.assertFalse(meta["sha256_verified"])
        self.assertEqual(read(server), self.script)
        self.assertTrue(os.access(server, os.X_OK))
        # A second install under the same name needs --force.
        r = self.toki("model", "install-llama", "--backend", "cpu", "--tag", "b6000",
                      "--name", "old")
        self.assertFails(r, "already installed", "--force")
        r = self.toki("model", "install-llama", "--backend", "cpu", "--tag", "b6000",
                      "--name", "old", "--force")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIsNone(self.build_json(r.stdout.strip())["gfx"])

    def test_install_unknown_tag(self):
        r = self.toki("model", "install-llama", "--backend", "cpu", "--tag", "b1")
        self.assertFails(r, "no release tagged b1")

    def test_install_without_a_build_for_the_backend_is_refused(self):
        r = self.toki("model", "install-llama", "--backend", "rocm")
        self.assertFails(r, "has no rocm build", f"ubuntu-vulkan-{self.arch}",
                         f"llama-b7001-bin-ubuntu-{self.arch}.tar.gz", "macos-arm64")
        self.assertFalse(self.hosts.requests_to("/download/"))
        self.assertFalse(os.path.exists(os.path.join(self.state, "llama")))

    def test_autodetect_falls_back_and_times_out_hung_probes(self):
        # A GPU tool that answers (cuda: no Linux build in the release) and
        # one that hangs (killed after a few seconds).
        fakebin = os.path.join(self.tmp, "bin")
        os.makedirs(fakebin)
        for name, body in (("nvidia-smi", 'echo "GPU 0: Fake GPU (UUID: GPU-1)"'),
                           ("rocminfo", f"exec {shutil.which('sleep')} 60")):
            p = os.path.join(fakebin, name)
            with open(p, "w") as f:
                f.write(f"#!/bin/sh\n{body}\n")
            os.chmod(p, 0o755)
        t0 = time.time()
        r = self.toki("model", "install-llama", env={"PATH": fakebin})
        self.assertLess(time.time() - t0, 30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("cuda cpu", r.stderr)
        self.assertIn("rocminfo did not answer", r.stderr)
        self.assertIn("has no cuda build", r.stderr)
        self.assertEqual(self.build_json(r.stdout.strip())["backend"], "cpu")
        self.assertTrue(os.path.isdir(self.installed("b7001-cpu")))

    def test_wrong_digest_is_refused(self):
        self.hosts.add_release("b7002", [
            (f"llama-b7002-bin-ubuntu-{self.arch}.tar.gz", self.tar, "sha256:" + "0" * 64)])
        r = self.toki("model", "install-llama", "--backend", "cpu", "--tag", "b7002")
        self.assertFails(r, "checksum mismatch")
        self.assertEqual(sorted(os.listdir(os.path.join(self.state, "llama"))), [".downloads"])
        self.assertEqual(os.listdir(os.path.join(self.state, "llama", ".downloads")), [])

    def test_unsafe_archives_are_refused(self):
        outside = os.path.join(self.tmp, "escaped")
        cases = {
            "b7003": [("../../../escaped", b"x", tarfile.REGTYPE, "")],
            "b7004": [("llama-b7004/evil", b"", tarfile.SYMTYPE, outside)],
            "b7005": [("llama-b7005/up", b"", tarfile.SYMTYPE, "../../..")],
        }
        for tag, extra in cases.items():
            data = make_tar(tag, self.script, extra)
            self.hosts.add_release(tag, [(f"llama-{tag}-bin-ubuntu-{self.arch}.tar.gz", data,
                                          True)])
            r = self.toki("model", "install-llama", "--backend", "cpu", "--tag", tag)
            self.assertFails(r, "refusing to unpack")
            self.assertFalse(os.path.lexists(outside))
            self.assertFalse(os.path.exists(self.installed(f"{tag}-cpu")))
        left = [n for n in os.listdir(os.path.join(self.state, "llama")) if n != ".downloads"]
        self.assertEqual(left, [])

    def test_resumed_archive_download(self):
        cut = len(self.vulkan_tar) // 8
        self.hosts.cut_once(self.vulkan_tar, cut, times=3)
        r = self.toki("model", "install-llama", "--backend", "vulkan")
        self.assertFails(r, "resume")
        r = self.toki("model", "install-llama", "--backend", "vulkan")
        self.assertEqual(r.returncode, 0, r.stderr)
        ranges = [h.get("Range") for _, _, h in self.hosts.requests_to("/download/")]
        self.assertEqual(ranges[-1], f"bytes={3 * cut}-")
        self.assertEqual(self.build_json(r.stdout.strip())["backend"], "vulkan")


def cudart_tar(tag, major, extra=()):
    """A CUDA runtime archive as the release's cudart-llama-<tag>-bin-...:
    libcudart and libcublas with their soname links, in a folder of its own
    (install-llama puts them beside llama-server whatever the folders), and
    a LICENSE the build has too."""
    d = f"cudart-llama-{tag}/lib"
    entries = [(f"cudart-llama-{tag}", b"", tarfile.DIRTYPE, ""), (d, b"", tarfile.DIRTYPE, "")]
    for lib, full in ((f"libcudart.so.{major}", f"libcudart.so.{major}.0.96"),
                      (f"libcublas.so.{major}", f"libcublas.so.{major}.1.0.3"),
                      (f"libcublasLt.so.{major}", f"libcublasLt.so.{major}.1.0.3")):
        entries.append((f"{d}/{full}", f"the {lib} runtime".encode(), tarfile.REGTYPE, ""))
        entries.append((f"{d}/{lib}", b"", tarfile.SYMTYPE, full))
    entries.append((f"cudart-llama-{tag}/LICENSE", b"CUDA EULA\n", tarfile.REGTYPE, ""))
    return tar_of(entries + list(extra))


class InstallCudaTest(FetchCase):
    """install-llama on an NVIDIA Linux machine, stood in for by a release
    listing with today's asset names (llama.cpp's release workflow), a fake
    nvidia-smi and fake llama-servers that find their GPU only when the
    CUDA runtime is where the dynamic loader looks."""

    TAG = "b11462"

    def setUp(self):
        super().setUp()
        if platform.system() != "Linux":
            self.skipTest("the release's CUDA builds are Linux (and Windows) builds")
        self.arch = a = asset_arch()
        self.bin = os.path.join(self.tmp, "bin")
        t = self.TAG
        self.cuda13 = make_tar(t, fake_server(["CUDA0: " + H100], needs="libcudart.so.13"),
                               libs=["libggml-cuda.so"])
        self.cuda12 = make_tar(t, fake_server(["CUDA0: " + H100], needs="libcudart.so.12"),
                               libs=["libggml-cuda.so"])
        self.rt13, self.rt12 = cudart_tar(t, 13), cudart_tar(t, 12)
        self.vulkan = make_tar(t, fake_server(["Vulkan0: " + H100]))
        self.cpu = make_tar(t, fake_server([]))
        other = b"not for this machine"
        names = [  # llama.cpp b11462's assets, by name as the API lists them
            (f"cudart-llama-{t}-bin-ubuntu-cuda-12.8-{a}.tar.gz", self.rt12),
            (f"cudart-llama-{t}-bin-ubuntu-cuda-13.4-{a}.tar.gz", self.rt13),
            ("cudart-llama-bin-win-cuda-12.4-x64.zip", other),
            ("cudart-llama-bin-win-cuda-13.4-x64.zip", other),
            (f"llama-{t}-bin-macos-arm64.tar.gz", other),
            (f"llama-{t}-bin-macos-x64.tar.gz", other),
            (f"llama-{t}-bin-ubuntu-{a}.tar.gz", self.cpu),
            (f"llama-{t}-bin-ubuntu-cuda-12.8-{a}.tar.gz", self.cuda12),
            (f"llama-{t}-bin-ubuntu-cuda-13.4-{a}.tar.gz", self.cuda13),
            (f"llama-{t}-bin-ubuntu-openvino-2026.0-x64.tar.gz", other),
            (f"llama-{t}-bin-ubuntu-rocm-10.0-x64.tar.gz", other),
            (f"llama-{t}-bin-ubuntu-s390x.tar.gz", other),
            (f"llama-{t}-bin-ubuntu-sycl-fp16-x64.tar.gz", other),
            (f"llama-{t}-bin-ubuntu-sycl-fp32-x64.tar.gz", other),
            (f"llama-{t}-bin-ubuntu-vulkan-{a}.tar.gz", self.vulkan),
            (f"llama-{t}-bin-win-cpu-x64.zip", other),
            (f"llama-{t}-bin-win-cuda-12.4-x64.zip", other),
            (f"llama-{t}-bin-win-cuda-13.4-x64.zip", other),
            (f"llama-{t}-bin-win-vulkan-x64.zip", other),
            (f"llama-{t}-xcframework.zip", other),
        ]
        self.hosts.add_release(t, [(n, d, True) for n, d in names], latest=True)

    def installed(self, name):
        return os.path.join(self.state, "llama", name)

    def left_in_state(self):
        root = os.path.join(self.state, "llama")
        return sorted(os.listdir(root)), sorted(os.listdir(os.path.join(root, ".downloads")))

    def install(self, *args, cuda_version="13.4", vulkan_gpu=None):
        fake_tools(self.bin, cuda_version, vulkan_gpu)
        return self.toki("model", "install-llama", *args, env={"PATH": self.bin})

    def test_nvidia_linux_gets_the_cuda_build_with_its_runtime(self):
        r = self.install()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("backends this machine can use, best first: cuda cpu", r.stderr)
        self.assertIn("the NVIDIA driver runs CUDA 13.4 at most", r.stderr)
        server = r.stdout.strip()
        d = os.path.join(self.installed(f"{self.TAG}-cuda"), f"llama-{self.TAG}")
        self.assertEqual(server, os.path.join(d, "llama-server"))
        main = f"llama-{self.TAG}-bin-ubuntu-cuda-13.4-{self.arch}.tar.gz"
        rt = f"cudart-{main}"
        for name in (main, rt):
            self.assertTrue(self.hosts.requests_to(f"/download/{self.TAG}/{name}"), name)
            self.assertIn(f"{name} matches the release's SHA-256", r.stderr)
        self.assertEqual(len(self.hosts.requests_to("/download/")), 2)
        # The runtime sits beside llama-server, links and all, so that it
        # starts and sees the GPU as the launcher will run it.
        self.assertEqual(os.readlink(os.path.join(d, "libcudart.so.13")), "libcudart.so.13.0.96")
        self.assertEqual(read(os.path.join(d, "libcublas.so.13")), b"the libcublas.so.13 runtime")
        self.assertEqual(read(os.path.join(d, "LICENSE")), b"MIT\n")  # the build's own
        self.assertIn("LICENSE; the CUDA runtime archive's copy is left out", r.stderr)
        out = subprocess.run([server, "--list-devices"], capture_output=True, text=True)
        self.assertIn("CUDA0: NVIDIA H100 80GB HBM3", out.stdout)
        self.assertIn("it sees CUDA0: NVIDIA H100 80GB HBM3 (81559 MiB)", r.stderr)
        with open(os.path.join(d, "build.json")) as f:
            meta = json.load(f)
        self.assertEqual((meta["backend"], meta["asset"], meta["sha256"]),
                         ("cuda", main, sha256(self.cuda13)))
        self.assertEqual(meta["cudart"]["asset"], rt)
        self.assertEqual(meta["cudart"]["sha256"], sha256(self.rt13))
        self.assertTrue(meta["sha256_verified"] and meta["cudart"]["sha256_verified"])
        self.assertEqual(meta["devices"], ["CUDA0: NVIDIA H100 80GB HBM3"])
        self.assertEqual(meta["version"], "version: 11462 (4f1c2d3)")
        self.assertEqual(self.left_in_state(), ([".downloads", f"{self.TAG}-cuda"], []))

    def test_an_older_driver_gets_the_cuda_12_build(self):
        r = self.install(cuda_version="12.9")
        self.assertEqual(r.returncode, 0, r.stderr)
        d = os.path.dirname(r.stdout.strip())
        self.assertTrue(os.path.exists(os.path.join(d, "libcudart.so.12")))
        with open(os.path.join(d, "build.json")) as f:
            meta = json.load(f)
        self.assertEqual(meta["asset"], f"llama-{self.TAG}-bin-ubuntu-cuda-12.8-{self.arch}.tar.gz")
        self.assertEqual(meta["cudart"]["asset"], "cudart-" + meta["asset"])
        # A driver older than every build: the install says so and moves on.
        r = self.install("--name", "x", cuda_version="11.8")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("runs CUDA 11.8 at most", r.stderr)
        self.assertIn("using the cpu build instead", r.stderr)

    def test_a_cuda_build_that_sees_no_gpu_is_reported_not_registered(self):
        r = self.install("--backend", "cpu", "--name", "main")
        self.assertEqual(r.returncode, 0, r.stderr)
        before = read(os.path.join(self.installed("main"), f"llama-{self.TAG}", "build.json"))
        log = ("ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient "
               "for CUDA runtime version\\n")
        blind = make_tar("b11463", fake_server([], needs="libcudart.so.13", log=log))
        main = f"llama-b11463-bin-ubuntu-cuda-13.4-{self.arch}.tar.gz"
        self.hosts.add_release("b11463", [(main, blind, True),
                                          ("cudart-" + main, cudart_tar("b11463", 13), True)])
        r = self.install("--backend", "cuda", "--tag", "b11463", "--name", "main", "--force")
        self.assertFails(r, "does not work on this machine", "it lists no CUDA device",
                         "CUDA driver version is insufficient for CUDA runtime version",
                         "main was not installed; the next backend to try: "
                         "toki model install-llama --backend vulkan")
        self.assertEqual(r.stdout, "")
        # The working install it would have replaced is untouched, and
        # nothing of the failed one is left.
        self.assertEqual(read(os.path.join(self.installed("main"), f"llama-{self.TAG}",
                                           "build.json")), before)
        self.assertEqual(self.left_in_state(), ([".downloads", "main"], []))

    def test_a_build_that_cannot_start_is_reported_with_what_it_printed(self):
        # A CUDA build the release has no runtime archive for: its
        # llama-server does not even start (as without libcudart).
        main = f"llama-b11464-bin-ubuntu-cuda-13.4-{self.arch}.tar.gz"
        self.hosts.add_release("b11464", [(main, self.cuda13, True)])
        r = self.install("--backend", "cuda", "--tag", "b11464")
        self.assertFails(r, "has no CUDA runtime archive (cudart-...)",
                         "`llama-server --version` failed (exit status 127)",
                         "error while loading shared libraries: libcudart.so.13: cannot open "
                         "shared object file", "--backend vulkan")
        self.assertFalse(os.path.exists(self.installed("b11464-cuda")))
        self.assertEqual(self.left_in_state(), ([".downloads"], []))

    def test_detected_gpu_falls_back_to_the_next_backend_that_sees_it(self):
        # The CUDA build lists no GPU here; the Vulkan build does.
        blind = make_tar("b11465", fake_server([], needs="libcudart.so.13"))
        vk = make_tar("b11465", fake_server(["Vulkan0: " + H100]))
        main = f"llama-b11465-bin-ubuntu-cuda-13.4-{self.arch}.tar.gz"
        self.hosts.add_release("b11465", [
            (main, blind, True), ("cudart-" + main, cudart_tar("b11465", 13), True),
            (f"llama-b11465-bin-ubuntu-vulkan-{self.arch}.tar.gz", vk, True),
            (f"llama-b11465-bin-ubuntu-{self.arch}.tar.gz", self.cpu, True)])
        r = self.install("--tag", "b11465", vulkan_gpu="NVIDIA H100 80GB HBM3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("best first: cuda vulkan cpu", r.stderr)
        self.assertIn("b11465-cuda was not installed; trying the next backend", r.stderr)
        self.assertEqual(r.stdout.strip(), os.path.join(self.installed("b11465-vulkan"),
                                                        "llama-b11465", "llama-server"))
        self.assertEqual(self.left_in_state(), ([".downloads", "b11465-vulkan"], []))

    def test_a_software_vulkan_device_counts_only_when_asked_for(self):
        llvmpipe = "Vulkan0: llvmpipe (LLVM 19.1.7, 256 bits) (24105 MiB, 23767 MiB free)"
        vk = make_tar("b11466", fake_server([llvmpipe]))
        self.hosts.add_release("b11466", [
            (f"llama-b11466-bin-ubuntu-vulkan-{self.arch}.tar.gz", vk, True),
            (f"llama-b11466-bin-ubuntu-{self.arch}.tar.gz", self.cpu, True)])
        # vulkaninfo saw a GPU, the build sees only llvmpipe: not a GPU install.
        r = self.toki("model", "install-llama", "--tag", "b11466",
                      env={"PATH": self.fake_vulkaninfo()})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("it lists no Vulkan device but a software renderer", r.stderr)
        self.assertIn("b11466-vulkan was not installed; trying the next backend", r.stderr)
        self.assertTrue(r.stdout.strip().startswith(self.installed("b11466-cpu")))
        # Asked for by name (to try Vulkan without a GPU), llvmpipe does.
        r = self.install("--backend", "vulkan", "--tag", "b11466")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("it sees Vulkan0: llvmpipe", r.stderr)
        self.assertTrue(r.stdout.strip().startswith(self.installed("b11466-vulkan")))

    def test_a_build_that_hangs_crashes_or_lists_nothing_is_refused(self):
        cases = {  # tag: (backend, what --list-devices does, what the report says)
            "b11470": ("vulkan", "while :; do :; done",
                       "`llama-server --list-devices` did not finish within 1.0 s"),
            "b11471": ("vulkan", "kill -9 $$",
                       "`llama-server --list-devices` could not run or was killed by a signal"),
            "b11472": ("vulkan", 'printf "error: invalid argument: --list-devices\\n"',
                       "`llama-server --list-devices` printed no device listing:\n"
                       "    error: invalid argument: --list-devices"),
            "b11473": ("rocm", 'printf "ggml_cuda_init: no ROCm-capable device is detected\\n'
                               'error: unknown\\n" >&2; exit 1',
                       "`llama-server --list-devices` failed (exit status 1); it printed:\n"
                       "    ggml_cuda_init: no ROCm-capable device is detected\n    error: unknown"),
        }
        for tag, (backend, cmd, says) in cases.items():
            data = make_tar(tag, fake_server([], list_devices=cmd))
            asset = f"llama-{tag}-bin-ubuntu-{backend}{'-7.2' if backend == 'rocm' else ''}-" \
                    f"{self.arch}.tar.gz"
            self.hosts.add_release(tag, [(asset, data, True)])
            t0 = time.time()
            r = self.toki("model", "install-llama", "--backend", backend, "--tag", tag,
                          env={"PATH": self.bin, "TOKI_LIST_DEVICES_TIMEOUT_MS": "1000"})
            self.assertLess(time.time() - t0, 20)
            self.assertFails(r, says, "does not work on this machine", "--backend")
            self.assertFalse(os.path.exists(self.installed(f"{tag}-{backend}")))
        # A CPU build from before --list-devices (early 2025) is installed:
        # --version showed that it starts, and the CPU needs no device.
        old = make_tar("b4000", fake_server([], list_devices='printf "error: invalid argument: '
                                                             '--list-devices\\n" >&2; exit 1'))
        self.hosts.add_release("b4000", [(f"llama-b4000-bin-ubuntu-{self.arch}.tar.gz", old, True)])
        r = self.install("--backend", "cpu", "--tag", "b4000")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(os.path.dirname(r.stdout.strip()), "build.json")) as f:
            self.assertEqual(json.load(f)["devices"], [])
        self.assertEqual(self.left_in_state(), ([".downloads", "b4000-cpu"], []))

    def fake_vulkaninfo(self):
        d = os.path.join(self.tmp, "vkbin")
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "vulkaninfo")
        with open(p, "w") as f:
            f.write("#!/bin/sh\nprintf 'deviceType = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU\\n'\n")
        os.chmod(p, 0o755)
        return d

    def test_a_runtime_archive_with_a_wrong_digest_is_refused(self):
        main = f"llama-b11467-bin-ubuntu-cuda-13.4-{self.arch}.tar.gz"
        self.hosts.add_release("b11467", [(main, self.cuda13, True),
                                          ("cudart-" + main, self.rt13, "sha256:" + "0" * 64)])
        r = self.install("--backend", "cuda", "--tag", "b11467")
        self.assertFails(r, "checksum mismatch")
        self.assertTrue(self.hosts.requests_to(f"/download/b11467/cudart-{main}"))
        self.assertFalse(os.path.exists(self.installed("b11467-cuda")))
        dirs, downloads = self.left_in_state()
        self.assertEqual(dirs, [".downloads"])
        self.assertNotIn(f"cudart-{main}", downloads)
        self.assertFalse([n for n in downloads if n.startswith("cudart-")])

    def test_an_unsafe_runtime_archive_is_refused(self):
        outside = os.path.join(self.tmp, "escaped")
        bad = cudart_tar("b11468", 13, [("cudart-llama-b11468/lib/libevil.so", b"",
                                         tarfile.SYMTYPE, outside)])
        main = f"llama-b11468-bin-ubuntu-cuda-13.4-{self.arch}.tar.gz"
        self.hosts.add_release("b11468", [(main, self.cuda13, True), ("cudart-" + main, bad, True)])
        r = self.install("--backend", "cuda", "--tag", "b11468")
        self.assertFails(r, f"the CUDA runtime archive cudart-{main}", "refusing to unpack")
        self.assertFalse(os.path.lexists(outside))
        self.assertEqual(self.left_in_state(), ([".downloads"], []))


if __name__ == "__main__":
    th.run_tests()
