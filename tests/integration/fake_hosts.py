"""A local stand-in for the Hugging Face hub and GitHub's release API, for
tests of `toki model pull` and `toki model install-llama`. Standard library
only; one threaded HTTP server plays both hosts (their paths do not overlap).

Hugging Face hub (the real API's paths and shapes):
  GET /api/models/{org}/{name}/tree/{revision}[?recursive=true]
      [{"type": "file", "path", "size", "oid", "lfs": {"oid": <sha256>, "size"}}, ...]
      paged `page_size` entries at a time with a Link: <...>; rel="next" header
  GET /{org}/{name}/resolve/{revision}/{path}
      302 to /cdn/{sha256} (as the hub redirects to its CDN), which serves the bytes

GitHub releases (api.github.com's shapes):
  GET /repos/ggml-org/llama.cpp/releases/latest
  GET /repos/ggml-org/llama.cpp/releases/tags/{tag}
      {"tag_name", "assets": [{"name", "size", "digest", "browser_download_url"}]}
  GET /download/{tag}/{asset}

Every file answers Range requests (206, or 416 past the end). Knobs for
failure tests: drop_after[url_path] = n (send n body bytes, then cut the
connection, once), listing_failures (what the next tree listings do instead
of answering: a status such as 503, or "drop" for an empty reply), wrong_sha (advertise a wrong SHA-256 for these repo paths),
require_token (401 without "Authorization: Bearer <token>"). Every request is
logged in `requests` as (method, path, headers).
"""
import hashlib
import http.server
import json
import socket
import threading
import time
import urllib.parse

RELEASE_API = "/repos/ggml-org/llama.cpp/releases/"


class FakeHosts:
    def __init__(self):
        self.repos = {}  # "org/name" -> {revision: {path: bytes}}
        self.releases = {}  # tag -> [asset dict: name, data, digest (None: omit)]
        self.latest = None
        self.drop_after = {}  # url path -> bytes to send before cutting the connection
        self.cuts_left = {}  # url path -> how many more answers drop_after cuts
        self.wrong_sha = set()  # repo paths advertised with a wrong SHA-256
        self.require_token = None
        self.redirect = True
        self.page_size = 1000
        self.throttle = None  # bytes per second for file bodies (None: as fast as possible)
        self.listing_failures = []  # what the next tree listings do instead: 503, or "drop"

        self.requests = []
        self._blobs = {}  # sha256 -> bytes
        self._lock = threading.Lock()
        hosts = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                with hosts._lock:
                    hosts.requests.append(("GET", self.path, dict(self.headers.items())))
                try:
                    hosts._route(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    # --- set-up -------------------------------------------------------------

    def add_file(self, repo, path, data, revision="main"):
        self.repos.setdefault(repo, {}).setdefault(revision, {})[path] = data
        self._blobs[hashlib.sha256(data).hexdigest()] = data

    def add_release(self, tag, assets, latest=False):
        """assets: list of (name, bytes, digest) where digest is True (the
        right one), None (absent, as on releases before mid-2025) or a
        string (sent as is)."""
        out = []
        for name, data, digest in assets:
            if digest is True:
                digest = "sha256:" + hashlib.sha256(data).hexdigest()
            out.append({"name": name, "data": data, "digest": digest})
        self.releases[tag] = out
        if latest:
            self.latest = tag

    def cut_once(self, data, n, times=1):
        """The next download of these bytes (via the hub's CDN path or a
        release asset) stops after n bytes of its body; so do the `times`-1
        after it (a resumed request's body starts where the last one
        stopped)."""
        keys = [f"/cdn/{hashlib.sha256(data).hexdigest()}"]
        for tag, assets in self.releases.items():
            for a in assets:
                if a["data"] == data:
                    keys.append(f"/download/{tag}/{a['name']}")
        for k in keys:
            self.drop_after[k] = n
            self.cuts_left[k] = times

    def requests_to(self, prefix):
        with self._lock:
            return [r for r in self.requests if r[1].startswith(prefix)]

    # --- serving ------------------------------------------------------------

    def _json(self, h, status, obj, extra=None):
        body = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    def _authorised(self, h):
        if not self.require_token:
            return True
        if h.headers.get("Authorization") == f"Bearer {self.require_token}":
            return True
        self._json(h, 401, {"error": "Invalid credentials in Authorization header"})
        return False

    def _route(self, h):
        url = urllib.parse.urlsplit(h.path)
        path = urllib.parse.unquote(url.path)
        query = urllib.parse.parse_qs(url.query)
        if url.path.startswith(RELEASE_API):
            return self._release(h, url.path[len(RELEASE_API):])
        if path.startswith("/download/"):
            _, _, tag, name = path.split("/", 3)
            for a in self.releases.get(tag, []):
                if a["name"] == name:
                    return self._serve_bytes(h, a["data"], url.path)
            return self._json(h, 404, {"message": "Not Found"})
        if path.startswith("/cdn/"):
            data = self._blobs.get(path[5:])
            if data is None:
                return self._json(h, 404, {"error": "no such blob"})
            return self._serve_bytes(h, data, url.path)
        if path.startswith("/api/models/"):
            with self._lock:
                fail = self.listing_failures.pop(0) if self.listing_failures else None
            if fail == "drop":
                h.close_connection = True
                return  # an empty reply
            if fail:
                return self._json(h, fail, {"error": "Service Unavailable"})
            if not self._authorised(h):
                return
            rest = url.path[len("/api/models/"):]
            parts = rest.split("/")
            if len(parts) < 4 or parts[2] != "tree":
                return self._json(h, 404, {"error": "Not Found"})
            repo = parts[0] + "/" + parts[1]
            revision = urllib.parse.unquote("/".join(parts[3:]))
            return self._tree(h, repo, revision, query)
        # /{org}/{name}/resolve/{revision}/{path}
        parts = url.path.split("/", 5)
        if len(parts) == 6 and parts[3] == "resolve":
            if not self._authorised(h):
                return
            repo = parts[1] + "/" + parts[2]
            revision = urllib.parse.unquote(parts[4])
            fpath = urllib.parse.unquote(parts[5])
            files = self.repos.get(repo, {}).get(revision)
            if files is None or fpath not in files:
                return self._json(h, 404, {"error": "Entry not found"})
            data = files[fpath]
            if self.redirect:
                sha = hashlib.sha256(data).hexdigest()
                h.send_response(302)
                h.send_header("Location", f"/cdn/{sha}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            return self._serve_bytes(h, data, url.path)
        return self._json(h, 404, {"error": "Not Found"})

    def _tree(self, h, repo, revision, query):
        files = self.repos.get(repo, {}).get(revision)
        if files is None:
            return self._json(h, 404, {"error": "Repository not found"})
        entries, dirs = [], set()
        for p, data in sorted(files.items()):
            d = p.rsplit("/", 1)[0] if "/" in p else None
            while d and d not in dirs:
                dirs.add(d)
                entries.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": d})
                d = d.rsplit("/", 1)[0] if "/" in d else None
            sha = hashlib.sha256(data).hexdigest()
            if p in self.wrong_sha:
                sha = hashlib.sha256(b"not the file").hexdigest()
            e = {"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data),
                 "path": p}
            if p.endswith(".gguf"):
                e["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
            entries.append(e)
        if query.get("recursive", ["false"])[0] not in ("true", "1", "True"):
            entries = [e for e in entries if "/" not in e["path"]]
        start = int(query.get("cursor", ["0"])[0])
        page = entries[start:start + self.page_size]
        extra = {}
        if start + self.page_size < len(entries):
            q = dict((k, v[0]) for k, v in query.items())
            q["cursor"] = str(start + self.page_size)
            nxt = f"{self.url}{urllib.parse.urlsplit(h.path).path}?{urllib.parse.urlencode(q)}"
            extra["Link"] = f'<{nxt}>; rel="next"'
        self._json(h, 200, page, extra)

    def _release(self, h, rest):
        tag = self.latest if rest == "latest" else (
            rest[len("tags/"):] if rest.startswith("tags/") else None)
        if tag is None or tag not in self.releases:
            return self._json(h, 404, {"message": "Not Found",
                                       "documentation_url": "https://docs.github.com/rest"})
        assets = []
        for i, a in enumerate(self.releases[tag]):
            x = {"id": i + 1, "name": a["name"], "size": len(a["data"]),
                 "content_type": "application/octet-stream", "state": "uploaded",
                 "browser_download_url": f"{self.url}/download/{tag}/{a['name']}"}
            if a["digest"] is not None:
                x["digest"] = a["digest"]
            assets.append(x)
        self._json(h, 200, {"tag_name": tag, "name": tag, "draft": False,
                            "prerelease": False, "assets": assets})

    def _serve_bytes(self, h, data, key):
        size = len(data)
        start, end = 0, size - 1
        status = 200
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start = int(a) if a else 0
            end = int(b) if b else size - 1
            if start >= size:
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{size}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            end = min(end, size - 1)
            status = 206
        body = data[start:end + 1]
        h.send_response(status)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Accept-Ranges", "bytes")
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        h.end_headers()
        with self._lock:
            cut = self.drop_after.get(key)
            if cut is not None:
                self.cuts_left[key] = self.cuts_left.get(key, 1) - 1
                if self.cuts_left[key] <= 0:
                    del self.drop_after[key]
        if cut is not None and cut < len(body):
            h.wfile.write(body[:cut])
            h.wfile.flush()
            # An abrupt end mid-body, as a dropped connection looks.
            h.close_connection = True
            try:
                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if not self.throttle:
            h.wfile.write(body)
            return
        step = max(1, self.throttle // 20)
        for i in range(0, len(body), step):
            h.wfile.write(body[i:i + step])
            h.wfile.flush()
            time.sleep(step / self.throttle)


if __name__ == "__main__":
    import sys
    hosts = FakeHosts()
    hosts.throttle = 2 << 20
    for arg in sys.argv[1:]:
        with open(arg, "rb") as f:
            hosts.add_file("test/model-GGUF", arg.rsplit("/", 1)[-1], f.read())
    print(f"HF_ENDPOINT={hosts.url} TOKI_LLAMA_RELEASES_URL={hosts.url}", flush=True)
    while True:
        time.sleep(3600)
