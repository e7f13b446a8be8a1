"""A loopback Hugging Face Hub for kit fetch's tests and benchmark (issue 19).

It serves the endpoints that huggingface_hub (2.x; the HEAD/resolve protocol is the same in
0.2x and 1.x) and kit fetch call, shaped like the real Hub's answers:

- `GET /api/models/{repo}[/revision/{rev}]` (`?blobs=True`: siblings with size, blobId, lfs):
  HfApi.model_info(files_metadata=True), and repo_info in snapshot_download;
- `GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=...`: list_repo_tree (snapshot_download);
- `HEAD|GET /{repo}/resolve/{rev}/{path}`: small files answer 200 with `ETag` (the git blob id),
  `X-Repo-Commit` and Content-Length; LFS files (*.safetensors, *.bin) answer 302 to a signed
  "CDN" URL on another host name (`localhost` when the endpoint is `127.0.0.1`) with
  `X-Linked-Etag` (the sha256), `X-Linked-Size` and `X-Repo-Commit`, as huggingface.co does;
- `GET /cdn/{sha256}?sig=...`: the bytes, with `Range: bytes=N-` answered 206.

Errors carry the Hub's `X-Error-Code` header (RepoNotFound, RevisionNotFound, EntryNotFound,
GatedRepo), which is how huggingface_hub classifies them. A gated repo's metadata is public (as
on the Hub); its files need `Authorization: Bearer <one of tokens>` on /resolve.

The server counts what it sent per file (`served`), logs every request with its Authorization
header and Range (`requests`), can throttle CDN bodies (`throttle_bps`, for kill-and-resume
tests) and can cut a file short while claiming its full size (`truncate`).

Run alone (benchmarks/fetch_vs_hf.py uses it in-process): python tests/infra/hub_server.py
--repo org/name=DIR [--port 0].
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import os
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
_SIGN_KEY = os.urandom(16)


@dataclass(frozen=True)
class HubFile:
    path: str
    source: Path
    size: int
    oid: str  # git blob sha1 (the ETag of a small file, the tree's `oid`)
    sha256: str | None  # set for LFS files: their ETag and blob name in the cache


@dataclass
class HubRepo:
    repo_id: str
    sha: str
    files: dict[str, HubFile]
    gated: bool = False
    branches: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> str | None:
        if revision == self.sha or revision in ("main", *self.branches):
            return self.branches.get(revision, self.sha)
        return None


def git_blob_id(path: Path) -> str:
    digest = hashlib.sha1()
    digest.update(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def make_repo(repo_id: str, directory: Path, *, gated: bool = False, sha: str | None = None) -> HubRepo:
    """A repo of every file under `directory` (relative paths as repo paths)."""
    files: dict[str, HubFile] = {}
    for source in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = source.relative_to(directory).as_posix()
        lfs = rel.endswith(LFS_SUFFIXES)
        files[rel] = HubFile(
            rel, source, source.stat().st_size, git_blob_id(source), sha256_of(source) if lfs else None
        )
    commit = sha or hashlib.sha1(repr(sorted((f.path, f.oid) for f in files.values())).encode()).hexdigest()
    return HubRepo(repo_id, commit, files, gated=gated)


@dataclass
class Logged:
    method: str
    path: str
    authorization: str | None
    range: str | None
    sent: int = 0  # body bytes this request got (`served` also counts a killed client's last writes)


class HubServer:
    """`with HubServer([repo]) as hub:` then HF_ENDPOINT=hub.url."""

    def __init__(
        self,
        repos: list[HubRepo],
        *,
        tokens: frozenset[str] = frozenset(),
        throttle_bps: int | None = None,
        host: str = "127.0.0.1",
        cdn_host: str = "localhost",
        port: int = 0,
    ) -> None:
        self.repos = {r.repo_id: r for r in repos}
        self.tokens = tokens
        self.throttle_bps = throttle_bps
        self.truncate: dict[str, int] = {}  # repo path -> bytes actually sent (the listing still says the full size)
        # Another server's base URL for the LFS files' redirect (tests/hostile_server.py as a
        # misbehaving CDN); None: this server's own /cdn/.
        self.cdn_url: str | None = None
        self._served: Counter[str] = Counter()  # repo path -> body bytes sent
        self._requests: list[Logged] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition()
        self._active = 0
        self._httpd = _Server((host, port), _handler_for(self))
        self._httpd.daemon_threads = True
        self.host = host
        self.cdn_host = cdn_host
        self.port = self._httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread: threading.Thread | None = None
        self._blobs = {f.sha256: f for r in repos for f in r.files.values() if f.sha256}

    def __enter__(self) -> HubServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def served(self) -> Counter[str]:
        """Body bytes sent per repo path, once every body in flight has been counted."""
        self.settle()
        return self._served

    @property
    def requests(self) -> list[Logged]:
        """Every request so far (Authorization, Range, bytes sent), in arrival order."""
        self.settle()
        return self._requests

    def log(self, entry: Logged) -> None:
        with self._lock:
            self._requests.append(entry)

    def count(self, path: str, n: int, entry: Logged) -> None:
        with self._lock:
            self._served[path] += n
            entry.sent += n

    @contextlib.contextmanager
    def sending(self) -> Iterator[None]:
        with self._idle:
            self._active += 1
        try:
            yield
        finally:
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until no body is being sent: a client can read the last byte before the server
        thread has counted it."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._active == 0, timeout):
                raise TimeoutError("the loopback Hub is still sending")

    def reset_counters(self) -> None:
        self.settle()
        with self._lock:
            self._served.clear()
            self._requests.clear()

    def sign(self, sha256: str) -> str:
        return hmac.new(_SIGN_KEY, sha256.encode(), "sha256").hexdigest()[:32]


class _Server(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: eight clients connecting at once (plus their
    # CDN redirects) overflow it, and a dropped SYN costs a 1 s retransmit.
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that went away is not news
            super().handle_error(request, client_address)


def _handler_for(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        server_hub = hub

    return Handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as clients expect from the Hub
    server_hub: HubServer
    entry: Logged

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # -- dispatch

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, *, head: bool) -> None:
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        query = urllib.parse.parse_qs(url.query)
        hub = self.server_hub
        self.entry = Logged(self.command, path, self.headers.get("Authorization"), self.headers.get("Range"))
        hub.log(self.entry)
        if path.startswith("/api/models/"):
            self._api(path[len("/api/models/") :], query)
        elif path.startswith("/cdn/"):
            self._cdn(path[len("/cdn/") :], query, head=head)
        elif "/resolve/" in path:
            self._resolve(path.lstrip("/"), head=head)
        else:
            self._error(404, None, "no such route")

    # -- helpers

    def _error(self, status: int, code: str | None, message: str, extra: dict[str, str] | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, data: Any) -> None:
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _split_repo(self, rest: str) -> tuple[HubRepo | None, str]:
        """'org/name/more' -> (repo, 'more'); also a namespace-less 'name/more'."""
        parts = rest.split("/")
        for n in (2, 1):
            repo = self.server_hub.repos.get("/".join(parts[:n]))
            if repo is not None:
                return repo, "/".join(parts[n:])
        return None, rest

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization") or ""
        return auth.startswith("Bearer ") and auth[len("Bearer ") :] in self.server_hub.tokens

    # -- /api/models

    def _api(self, rest: str, query: dict[str, list[str]]) -> None:
        repo, tail = self._split_repo(rest)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return
        if tail in ("",) or tail.startswith("revision/"):
            revision = tail[len("revision/") :] if tail else "main"
            sha = repo.resolve(revision)
            if sha is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                return
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            self._json(_model_info(repo, sha, blobs=blobs))
        elif tail.startswith("tree/"):
            revision, _, sub = tail[len("tree/") :].partition("/")
            sha = repo.resolve(revision)
            if sha is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                return
            self._json(_tree(repo, sub))
        else:
            self._error(404, None, "no such API route")

    # -- /{repo}/resolve/{rev}/{path}

    def _resolve(self, rest: str, *, head: bool) -> None:
        before, _, after = rest.partition("/resolve/")
        repo = self.server_hub.repos.get(before)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return
        revision, _, name = after.partition("/")
        sha = repo.resolve(revision)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        if repo.gated and not self._authorized():
            status = 403 if self.headers.get("Authorization") else 401
            message = f"Access to model {repo.repo_id} is restricted. You must have access to it and be authenticated."
            self._error(status, "GatedRepo", message)
            return
        entry = repo.files.get(name)
        if entry is None:
            self._error(404, "EntryNotFound", f"Entry not found: {name}", {"X-Repo-Commit": sha})
            return
        if entry.sha256 is not None:
            hub = self.server_hub
            location = f"http://{hub.cdn_host}:{hub.port}/cdn/{entry.sha256}?sig={hub.sign(entry.sha256)}"
            if hub.cdn_url:
                location = f"{hub.cdn_url}/{entry.sha256}"
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("X-Repo-Commit", sha)
            self.send_header("X-Linked-Etag", f'"{entry.sha256}"')
            self.send_header("X-Linked-Size", str(entry.size))
            self.send_header("ETag", f'"{entry.oid}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._send_file(entry, head=head, extra={"X-Repo-Commit": sha, "ETag": f'"{entry.oid}"'})

    # -- /cdn/{sha256}

    def _cdn(self, blob: str, query: dict[str, list[str]], *, head: bool) -> None:
        hub = self.server_hub
        entry = hub._blobs.get(blob)
        if entry is None or not hmac.compare_digest(query.get("sig", [""])[0], hub.sign(blob)):
            self._error(403, None, "bad signature")
            return
        self._send_file(entry, head=head, extra={"ETag": f'"{entry.sha256}"'}, throttle=hub.throttle_bps)

    def _send_file(self, entry: HubFile, *, head: bool, extra: dict[str, str], throttle: int | None = None) -> None:
        start = 0
        wanted = self.headers.get("Range")
        if wanted:
            spec = wanted.removeprefix("bytes=")
            first, _, last = spec.partition("-")
            if not first.isdigit() or (last and not last.isdigit()):
                self._error(416, None, f"unsupported range {wanted}")
                return
            start = int(first)
            if start >= entry.size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{entry.size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        end = entry.size  # exclusive; `bytes=N-M` with M is not used by the clients here
        self.send_response(206 if wanted else 200)
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{entry.size}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Content-Type", "application/octet-stream")
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        cut = self.server_hub.truncate.get(entry.path)
        stop = min(end, cut) if cut is not None else end
        with self.server_hub.sending(), entry.source.open("rb") as fh:
            if throttle:
                self._send_throttled(fh, entry.path, start, stop, throttle)
            else:
                self._sendfile(fh, entry.path, start, stop)
        if stop < end:  # the cut: close so the client sees a short body
            self.close_connection = True
            self.connection.shutdown(2)

    def _sendfile(self, fh: Any, path: str, start: int, stop: int) -> None:
        offset = start
        out = self.connection.fileno()
        try:
            while offset < stop:
                sent = os.sendfile(out, fh.fileno(), offset, min(stop - offset, 1 << 24))
                if sent == 0:
                    break
                offset += sent
                self.server_hub.count(path, sent, self.entry)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send_throttled(self, fh: Any, path: str, start: int, stop: int, bps: int) -> None:
        chunk = max(1, bps // 50)  # 50 writes a second
        fh.seek(start)
        offset = start
        began = time.monotonic()
        try:
            while offset < stop:
                data = fh.read(min(chunk, stop - offset))
                self.wfile.write(data)
                offset += len(data)
                self.server_hub.count(path, len(data), self.entry)
                ahead = (offset - start) / bps - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def _model_info(repo: HubRepo, sha: str, *, blobs: bool) -> dict[str, Any]:
    siblings: list[dict[str, Any]] = []
    for f in repo.files.values():
        item: dict[str, Any] = {"rfilename": f.path}
        if blobs:
            item.update({"size": f.size, "blobId": f.oid})
            if f.sha256:
                item["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
        siblings.append(item)
    return {
        "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "author": repo.repo_id.split("/")[0],
        "sha": sha,
        "private": False,
        "gated": "manual" if repo.gated else False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "library_name": "transformers",
        "lastModified": "2026-11-01T00:00:00.000Z",
        "createdAt": "2026-11-01T00:00:00.000Z",
        "siblings": siblings,
    }


def _tree(repo: HubRepo, sub: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    prefix = f"{sub.rstrip('/')}/" if sub else ""
    for f in repo.files.values():
        if not f.path.startswith(prefix):
            continue
        item: dict[str, Any] = {"type": "file", "oid": f.oid, "size": f.size, "path": f.path}
        if f.sha256:
            item["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
        out.append(item)
    return out


def write_safetensors(path: Path, tensors: dict[str, int], *, seed: int = 0) -> None:
    """A safetensors file written by hand (8-byte little-endian header length, JSON header padded
    to 8 bytes, raw data): one U8 tensor of `n` bytes per name, pseudo-random content."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, n in tensors.items():
        header[name] = {"dtype": "U8", "shape": [n], "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    block = hashlib.sha256(f"{path.name}:{seed}".encode()).digest() * 32768  # 1 MiB, differs per file
    with path.open("wb") as fh:
        fh.write(len(raw).to_bytes(8, "little") + raw)
        left = offset
        while left > 0:
            fh.write(block[: min(left, len(block))])
            left -= min(left, len(block))


def write_model(directory: Path, shard_bytes: list[int], *, extra: dict[str, str] | None = None) -> Path:
    """A tiny Llama-shaped checkpoint as vLLM finds it on the Hub: config, generation config,
    tokenizer files, sharded safetensors and their index, plus files kit fetch must skip
    (README, an `original/` folder, a .bin duplicate, a GGUF)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "generation_config.json").write_text('{"bos_token_id": 1, "eos_token_id": 2}\n')
    (directory / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}))
    (directory / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}\n')
    (directory / "special_tokens_map.json").write_text('{"bos_token": "<s>"}\n')
    (directory / "README.md").write_text("# tiny\n")
    (directory / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (directory / "original").mkdir(exist_ok=True)
    (directory / "original" / "consolidated.00.pth").write_bytes(b"\0" * 4096)
    (directory / "pytorch_model.bin").write_bytes(b"\0" * 2048)
    (directory / "tiny.Q4_K_M.gguf").write_bytes(b"GGUF" + b"\0" * 1020)
    weight_map: dict[str, str] = {}
    total = 0
    count = len(shard_bytes)
    for i, n in enumerate(shard_bytes, start=1):
        name = f"model-{i:05d}-of-{count:05d}.safetensors"
        tensors = {f"model.layers.{i - 1}.weight": n}
        write_safetensors(directory / name, tensors, seed=i)
        weight_map.update(dict.fromkeys(tensors, name))
        total += n
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    for name, text in (extra or {}).items():
        (directory / name).write_text(text)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", action="append", required=True, metavar="ORG/NAME=DIR")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    repos = [make_repo(spec.partition("=")[0], Path(spec.partition("=")[2])) for spec in args.repo]
    server = HubServer(repos, port=args.port)
    print(f"HF_ENDPOINT={server.url}", flush=True)
    server._httpd.serve_forever()


if __name__ == "__main__":
    main()
