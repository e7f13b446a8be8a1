"""kit's one door to the Hugging Face Hub (`kit fetch`, issue 19).

The repo listing (branch or tag resolved to a commit, every file with its size and blob id) and
the access check come from huggingface_hub (HfApi.model_info(files_metadata=True),
get_hf_file_metadata), so its error classes say what is wrong: unknown repo, revision, gated.

The bytes are moved here, by plain HTTP GETs of the same `/{repo}/resolve/{sha}/{path}` URLs
(following the Hub's redirect to its CDN, which drops the Authorization header), into the
layout of kit/models/fetch.py. Why not hf_hub_download: since huggingface_hub 1.18 (PR 4228; issue
4196 is open) a download goes to a per-process `<etag>.<uuid>.incomplete`, opened "wb" and
deleted on failure, so a killed or Ctrl-C'd fetch of a 5 GB shard starts again from zero. kit
keeps `blobs/<etag>.incomplete` (the name huggingface_hub used up to 1.17) and continues it with
a `Range: bytes=N-` request, under the same `.locks/` file huggingface_hub takes for that blob.
It never truncates a partial it continues: where flock is silently a no-op (some Lustre/GPFS/NFS
mounts, the reason for PR 4228) two writers then write the same bytes at the same offsets.

The token is only ever the one passed in (from hf_token_file): huggingface_hub gets it, or
`False`, explicitly, so it never reads HF_TOKEN or its stored token; kit's own requests send it
only to the Hub's own host and never read ~/.netrc.

The bytes go through kit's bounded HTTP layer (kit/net/http.py, issue 27): each request ends
within `transfer_s` (a longer transfer continues with the next request, from where the partial
file ends), reads at most the size the Hub listed, and five requests in a row that each bring
less than MIN_PROGRESS give the file up. Partial files and locks are opened without following
links (kit/safe/files.py): a link planted at a blob's `.incomplete` or `.lock` name in a shared
cache is refused, never written through.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kit import __version__
from kit.errors import ConfigError, ExitCode, KitError, ServerError
from kit.models.fetch import SHA_RE, DiskLayout, FetchPlan, RemoteFile, RepoListing
from kit.net import http
from kit.output import human_bytes
from kit.safe import files as safefile
from kit.safe import text as safetext

DEFAULT_ENDPOINT = "https://huggingface.co"
TRANSFER_S = 600.0  # one request for a file's bytes; a longer transfer continues with the next
MIN_PROGRESS = 1 << 20  # a request that brings less (and does not finish the file) counts as failed
_RETRIES = 5  # attempts without progress before a broken transfer is given up (huggingface_hub: 5)
_RETRY_WAIT = 0.5  # seconds, times the attempt number (at most 2 s)
_AMBIENT_TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
_BLOB_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # git blob sha1, LFS sha256


class NoSpace(ConfigError):
    """The target file system is (or would be) full."""


class FetchInterrupted(KitError):
    """Ctrl-C during a transfer: partial files stay and a later `kit fetch` continues them."""

    exit_code = ExitCode.INTERRUPTED


def endpoint_from_env() -> str:
    """HF_ENDPOINT (a mirror, or the tests' loopback Hub), else huggingface.co. A password in
    it is registered as a secret: redacted from every line kit prints."""
    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    safetext.register_url(endpoint)
    return endpoint


def _hf() -> Any:
    """huggingface_hub, imported on first use (kit --help stays light) with its telemetry off
    unless the user chose otherwise: since 2.x building a User-Agent fetches an "agent harness"
    registry from the endpoint and caches it under HF_HOME, a request kit fetch does not need."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import huggingface_hub

    return huggingface_hub


@contextlib.contextmanager
def _no_ambient_token() -> Iterator[None]:
    """HF_TOKEN and HUGGING_FACE_HUB_TOKEN out of the environment while huggingface_hub runs: kit
    passes the token explicitly, and this makes sure no code path falls back to them."""
    saved = {k: os.environ.pop(k) for k in _AMBIENT_TOKEN_VARS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@dataclass
class Progress:
    """Bytes moved so far, shared by the transfer threads and the progress line."""

    total: int = 0
    done: int = 0  # bytes in place (already there, resumed or fetched)
    fetched: int = 0  # bytes that came over the network in this run
    files_done: int = 0
    files: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, n: int, *, network: bool = True) -> None:
        with self._lock:
            self.done += n
            if network:
                self.fetched += n

    def file_done(self) -> None:
        with self._lock:
            self.files_done += 1


class Hub:
    """The Hub at `endpoint`, with `token` (None: anonymous)."""

    def __init__(
        self, endpoint: str, token: str | None, *, timeout: float = 60.0, transfer_s: float = TRANSFER_S
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.shown = safetext.redact_url(self.endpoint)  # what messages say: no credentials
        self.token = token
        self.timeout = timeout
        self.transfer_s = transfer_s
        safetext.register_url(self.endpoint)
        safetext.register_secret(token)

    # ----------------------------------------------------------------- through huggingface_hub

    def listing(self, repo: str, revision: str) -> RepoListing:
        """repo@revision resolved to its commit, with every file's size and blob id."""
        api = _hf().HfApi(
            endpoint=self.endpoint, token=self.token or False, library_name="kit", library_version=__version__
        )
        with self._errors(repo, revision), _no_ambient_token():
            info = api.model_info(repo, revision=revision, files_metadata=True, token=self.token or False)
        sha = info.sha or ""
        if not SHA_RE.fullmatch(sha):
            raise ServerError(f"{self.shown} did not resolve {repo}@{revision} to a commit")
        files = []
        for sib in info.siblings or []:
            blob = sib.lfs.sha256 if sib.lfs is not None else sib.blob_id
            size = sib.lfs.size if sib.lfs is not None else sib.size
            # blob ids become file names in the cache: only the Hub's hex digests are accepted
            if not isinstance(blob, str) or not _BLOB_RE.fullmatch(blob) or not isinstance(size, int) or size < 0:
                raise ServerError(
                    f"{self.shown} listed {safetext.one_line(str(sib.rfilename), 120)} of {repo} "
                    "without a valid size and blob id"
                )
            files.append(RemoteFile(sib.rfilename, size, blob))
        return RepoListing(repo=repo, revision=revision, sha=sha, files=tuple(files))

    def check_access(self, repo: str, sha: str, path: str) -> None:
        """A HEAD of one file: a gated repo without (or with the wrong) token fails here, before
        anything is written."""
        hf = _hf()
        url = hf.hf_hub_url(repo, path, revision=sha, endpoint=self.endpoint)
        with self._errors(repo, sha), _no_ambient_token():
            meta = hf.get_hf_file_metadata(url, token=self.token or False)
        if meta.commit_hash not in (None, sha):
            raise ServerError(f"{self.shown} served {repo}/{path} from commit {meta.commit_hash}, not {sha}")

    def read_text(self, repo: str, sha: str, path: str, *, max_bytes: int = 64 << 20) -> str:
        """A small file's text (the weights index), without writing it anywhere."""
        try:
            answer = self._open(repo, sha, path, 0, limit=max_bytes, total_s=self.timeout)
            try:
                data = answer.read()
            finally:
                answer.close()
        except _Transient as err:
            raise self._unreachable(err.cause) from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ServerError(f"{repo}/{path} from {self.shown} is not UTF-8 text") from None

    @contextlib.contextmanager
    def _errors(self, repo: str, revision: str) -> Iterator[None]:
        """huggingface_hub's exceptions as one kit error line each."""
        import importlib

        # huggingface_hub.utils exports these from 0.2x to 2.x (huggingface_hub.errors lacks some before 0.25)
        hf = importlib.import_module("huggingface_hub.utils")
        try:
            yield
        except hf.GatedRepoError as err:
            raise self._gated(repo, _status(err)) from None
        except hf.RepositoryNotFoundError as err:
            if _status(err) == 401 and self.token:
                raise self._gated(repo, 401) from None
            raise ConfigError(
                f"model {repo} not found on {self.shown}",
                source="argument MODEL",
                hint="check the id (ORG/NAME as on the model page); a private repo also needs hf_token_file",
            ) from None
        except hf.RevisionNotFoundError:
            raise ConfigError(
                f"{repo} has no revision {revision!r}",
                source="flag --revision",
                hint="pass a branch, tag or commit the repo has (default: main)",
            ) from None
        except hf.OfflineModeIsEnabled:
            raise ConfigError(
                "HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set in the environment",
                hint="kit fetch needs the Hub: unset it, on a node that reaches the Hub",
            ) from None
        except hf.HfHubHTTPError as err:
            status = _status(err)
            if status in (401, 403):
                raise self._gated(repo, status) from None
            raise ServerError(f"{self.shown} answered {status or 'an error'} for {repo}: {_first_line(err)}") from None
        except OSError as err:
            raise self._unreachable(err) from None
        except Exception as err:  # httpx/httpx2 transport errors share no base with OSError
            if type(err).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore"):
                raise self._unreachable(err) from None
            raise

    def _gated(self, repo: str, status: int | None) -> ConfigError:
        if self.token:
            return ConfigError(
                f"{self.shown} refused the token from hf_token_file for {repo} ({status})",
                key="hf_token_file",
                hint="use a token with read access, and accept the model's licence on its page first",
            )
        return ConfigError(
            f"{repo} is gated or private and kit sent no token ({status})",
            key="hf_token_file",
            hint="put a read token in a file (mode 600) and set hf_token_file to it",
        )

    def _unreachable(self, err: BaseException) -> ServerError:
        why = _first_line(err)
        return ServerError(
            why if isinstance(err, http.HttpError) else f"cannot reach {self.shown}: {why}",
            hint="check the network/proxy (HTTPS_PROXY) or HF_ENDPOINT; on a compute node without internet, "
            "run kit fetch on a login node into the shared hf_cache",
        )

    # ----------------------------------------------------------------- the bytes

    def _headers(self, url: str) -> dict[str, str]:
        if self.token and urlsplit(url).netloc == urlsplit(self.endpoint).netloc:
            return {"Authorization": f"Bearer {self.token}"}
        return {}

    def _url(self, repo: str, sha: str, path: str) -> str:
        from urllib.parse import quote

        return f"{self.endpoint}/{repo}/resolve/{sha}/{quote(path)}"

    def _open(self, repo: str, sha: str, path: str, offset: int, *, limit: int, total_s: float) -> http.Exchange:
        """GET one file from `offset` (following the Hub's redirect to its CDN, which gets no
        Authorization: another host), its head read; the body is the caller's to read."""
        url = self._url(repo, sha, path)
        headers = {**self._headers(url), "Accept-Encoding": "identity"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        limits = http.DEFAULT.but(connect_s=min(10.0, total_s), total_s=total_s, body_bytes=max(limit, 1))
        try:
            answer = http.open_url("GET", url, headers=headers, limits=limits, redirects=5)
        except http.HttpError as err:
            if err.transient:
                raise _Transient(err) from None
            raise
        if answer.status in (200, 206):
            return answer
        answer.close()
        status, code = answer.status, answer.headers.get("x-error-code", "")
        if status in (401, 403) or code == "GatedRepo":
            raise self._gated(repo, status)
        if status == 404:
            raise ServerError(f"{self.shown} has no {path} in {repo}@{sha[:12]} although it listed it (404)")
        if status == 416 and offset:
            raise _RangeRefused()
        if status in (408, 429) or status >= 500:
            raise _Transient(RuntimeError(f"{status} {answer.parser.reason}"))
        raise ServerError(f"{self.shown} answered {status} {answer.parser.reason} for {repo}/{path}")

    def fetch(
        self,
        plan: FetchPlan,
        layout: DiskLayout,
        progress: Progress,
        *,
        done: frozenset[str] = frozenset(),
        workers: int = 8,
        on_tick: Callable[[], None] = lambda: None,
    ) -> None:
        """Every file of the plan into the layout, `workers` files at a time, the biggest first;
        files in `done` (kit.models.fetch.survey) are only linked. Partial files are continued. Ctrl-C
        raises FetchInterrupted: the threads stop at their next chunk and what they wrote stays
        for the next run."""
        stop = threading.Event()
        queue = sorted(plan.files, key=lambda f: f.size, reverse=True)
        lock = threading.Lock()
        errors: list[BaseException] = []

        def work() -> None:
            while not stop.is_set():
                with lock:
                    if not queue:
                        return
                    f = queue.pop(0)
                try:
                    self._fetch_file(plan, layout, f, progress, stop, done=f.path in done)
                except BaseException as err:  # handed to the main thread, which raises it
                    with lock:
                        errors.append(err)
                    stop.set()
                    return

        # Daemon threads: on Ctrl-C the process exits without waiting for a blocked read.
        threads = [threading.Thread(target=work, daemon=True, name=f"kit-fetch-{i}") for i in range(max(1, workers))]
        for t in threads:
            t.start()
        try:
            while alive := [t for t in threads if t.is_alive()]:
                alive[0].join(0.1)
                on_tick()
        except KeyboardInterrupt:
            stop.set()
            raise FetchInterrupted(
                f"interrupted: {human_bytes(progress.fetched)} fetched, "
                f"{human_bytes(progress.done)} of {human_bytes(progress.total)} in place",
                hint="run the same kit fetch again: it continues the partial files",
            ) from None
        on_tick()
        if errors:
            first = next((e for e in errors if not isinstance(e, _Stopped)), errors[0])
            raise first

    def _fetch_file(
        self,
        plan: FetchPlan,
        layout: DiskLayout,
        f: RemoteFile,
        progress: Progress,
        stop: threading.Event,
        *,
        done: bool,
    ) -> None:
        store, partial = layout.store(f), layout.partial(f)
        try:
            with _blob_lock(layout.lock(f), stop, layout.root):
                # In the cache a blob's name is its content hash: the right size is the right file,
                # also when another process finished it while this one waited for the lock.
                if done or (not layout.local and _size(store) == f.size):
                    progress.add(f.size, network=False)
                else:
                    if _size(store) is not None:  # truncated, corrupted or another revision's: replace
                        store.unlink()
                    self._transfer(plan, f, partial, progress, stop, root=layout.root)
                    _finish(partial, store, layout.root)
                if not layout.local:
                    _link(layout.final(f), layout.link_target(f), layout.root)
        except OSError as err:
            raise write_error(err, partial.parent, f.path) from None
        progress.file_done()

    def _transfer(
        self,
        plan: FetchPlan,
        f: RemoteFile,
        partial: Path,
        progress: Progress,
        stop: threading.Event,
        *,
        root: Path,
    ) -> None:
        safefile.make_dirs(partial.parent, root)
        offset = _size(partial) or 0
        if offset > f.size:  # not a prefix of this blob: start over
            partial.unlink()
            offset = 0
        progress.add(offset, network=False)
        tries = 0
        while offset < f.size:
            before = offset
            failure: BaseException | None = None
            try:
                offset = self._stream(plan, f, partial, offset, progress, stop)
            except _RangeRefused:
                progress.add(-offset, network=False)
                offset = 0
                partial.unlink(missing_ok=True)
                continue
            except _Transient as err:  # what was written before the error stays
                failure = err.cause
                offset = min(_size(partial) or 0, f.size)
            if offset >= f.size:
                break
            # Progress resets the count, a trickle does not: a server that drips a few bytes per
            # request cannot keep a fetch going for ever.
            tries = 0 if offset >= before + MIN_PROGRESS else tries + 1
            if tries >= _RETRIES:
                why = _first_line(failure) if failure else f"the server sent {offset} of the {f.size} bytes"
                raise ServerError(
                    f"downloading {f.path} from {self.shown} failed {_RETRIES} times in a row: {why}",
                    hint="run kit fetch again to continue; if it repeats, the Hub's copy is broken at this revision",
                )
            if tries:
                time.sleep(min(2.0, _RETRY_WAIT * tries))

    def _stream(
        self,
        plan: FetchPlan,
        f: RemoteFile,
        partial: Path,
        offset: int,
        progress: Progress,
        stop: threading.Event,
    ) -> int:
        """One GET from `offset` appended to the partial file; returns the new size."""
        answer = self._open(plan.repo, plan.sha, f.path, offset, limit=f.size, total_s=self.transfer_s)
        try:
            if offset and answer.status == 200:  # the server ignored the Range: start over
                progress.add(-offset, network=False)
                offset = 0
                partial.unlink(missing_ok=True)
            elif offset:
                start = answer.headers.get("content-range", "").removeprefix("bytes ").split("-")[0]
                if start != str(offset):
                    raise _RangeRefused()
            # O_CREAT without O_TRUNC: bytes already there stay (see the module docstring); no
            # link followed, no file with other hard links written. 0o666 less the umask, the
            # mode huggingface_hub gives its blobs (a shared cache).
            with os.fdopen(safefile.open_private(partial, os.O_WRONLY | os.O_CREAT, 0o666), "wb") as fh:
                fh.seek(offset)
                try:
                    for chunk in answer.pieces():
                        if offset + len(chunk) > f.size:
                            raise ServerError(f"{self.shown} sent more than the {f.size} bytes listed for {f.path}")
                        fh.write(chunk)
                        offset += len(chunk)
                        progress.add(len(chunk))
                        if stop.is_set():
                            break
                except http.HttpError as err:
                    if err.transient:  # what came stays in the partial file; the next request continues
                        raise _Transient(err) from None
                    raise  # a body that breaks a bound would break it again: no retry
        finally:
            answer.close()
        if stop.is_set():
            raise _Stopped()
        return offset


def write_error(err: OSError, where: Path, what: str) -> KitError:
    """A failed write as one line: a full disk or quota (NoSpace), a link or special file in
    kit's way in a shared folder, else the path and the reason."""
    if isinstance(err, safefile.UnsafeFile):
        return ConfigError(
            f"cannot write {what}: {err.filename} {err.strerror}",
            hint="remove it (and find out who put it there), then run kit fetch again",
        )
    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        why = {errno.EDQUOT: "disk quota exceeded", errno.EFBIG: "file size limit (ulimit -f) reached"}
        return NoSpace(
            f"{why.get(err.errno or 0, 'no space left')} on {where}, writing {what}",
            hint="free space (partial files stay; kit fetch continues them) or choose another hf_cache / --local-dir",
        )
    return ConfigError(
        f"cannot write {what} under {where}: {err.strerror or err}",
        hint="make the folder writable, or choose another hf_cache / --local-dir",
    )


class _Transient(Exception):
    """A connection error or 5xx: retried from where the partial file ends."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _RangeRefused(Exception):
    """The server would not continue at our offset: start the file again."""


class _Stopped(Exception):
    """Another thread failed or Ctrl-C: stop quietly."""


def _status(err: Any) -> int | None:
    response = getattr(err, "response", None)
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


def _first_line(err: BaseException) -> str:
    if isinstance(err, KitError):
        return err.message
    text = str(err).strip().splitlines()
    return safetext.one_line(text[0], 200) if text else type(err).__name__


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


@contextlib.contextmanager
def _blob_lock(path: Path, stop: threading.Event, root: Path) -> Iterator[None]:
    """flock on huggingface_hub's lock file of the blob (filelock uses flock too), so kit and
    huggingface_hub (or two kit fetches on nodes sharing the cache) never write one blob at once.
    Waits as long as the other writer takes; a link planted at the lock's name is refused."""
    safefile.make_dirs(path.parent, root)
    try:
        with safefile.locked(path, wait_s=float("inf"), stop=lambda s: stop.wait(s)):
            yield
    except InterruptedError:
        raise _Stopped() from None


def _finish(partial: Path, store: Path, root: Path) -> None:
    """The complete partial file becomes the blob (or the local file): one rename, so a reader
    sees either nothing or all of it."""
    safefile.make_dirs(store.parent, root)
    os.replace(partial, store)


def _link(final: Path, target: str, root: Path) -> None:
    """The snapshot's relative symlink to the blob, replaced atomically if it points elsewhere."""
    safefile.make_dirs(final.parent, root)
    if final.is_symlink() and os.readlink(final) == target:
        return
    tmp = final.with_name(f".{final.name}.kit-link")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, final)
