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


def make_tar(tag, script, extra=()):
    """The current llama.cpp layout: llama-<tag>/ holding the binaries and
    libraries, with the libraries' symbolic links."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        def add(name, data, mode=0o644, kind=tarfile.REGTYPE, link=""):
            info = tarfile.TarInfo(name)
            info.mode, info.type, info.linkname = mode, kind, link
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            t.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
        d = f"llama-{tag}"
        add(d, b"", 0o755, tarfile.DIRTYPE)
        add(f"{d}/llama-server", script, 0o755)
        add(f"{d}/libggml.so.0.0.1", b"not really a library", 0o755)
        add(f"{d}/libggml.so.0", b"", kind=tarfile.SYMTYPE, link="libggml.so.0.0.1")
        add(f"{d}/LICENSE", b"MIT\n")
        for name, data, kind, link in extra:
            add(name, data, 0o644, kind, link)
    return buf.getvalue()


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
        self.zip = make_zip(self.script)
        a = self.arch
        self.hosts.add_release("b7001", [
            (f"llama-b7001-bin-ubuntu-{a}.tar.gz", self.tar, True),
            (f"llama-b7001-bin-ubuntu-vulkan-{a}.tar.gz", self.tar, True),
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
        cut = len(self.tar) // 8
        self.hosts.cut_once(self.tar, cut, times=3)
        r = self.toki("model", "install-llama", "--backend", "vulkan")
        self.assertFails(r, "resume")
        r = self.toki("model", "install-llama", "--backend", "vulkan")
        self.assertEqual(r.returncode, 0, r.stderr)
        ranges = [h.get("Range") for _, _, h in self.hosts.requests_to("/download/")]
        self.assertEqual(ranges[-1], f"bytes={3 * cut}-")
        self.assertEqual(self.build_json(r.stdout.strip())["backend"], "vulkan")


if __name__ == "__main__":
    th.run_tests()
