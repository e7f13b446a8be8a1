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
`False`, explicitly, so it never reads HF_TOKEN or its stored token; the HTTP session sends it
only to the Hub's own host and never reads ~/.netrc.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kit import __version__
from kit.errors import ConfigError, ExitCode, KitError, ServerError
from kit.models.fetch import SHA_RE, DiskLayout, FetchPlan, RemoteFile, RepoListing
from kit.output import human_bytes

if TYPE_CHECKING:
    import requests

DEFAULT_ENDPOINT = "https://huggingface.co"
CHUNK = 8 << 20  # bytes per read: few syscalls on a fast link, a progress tick per chunk on a slow one
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
    """HF_ENDPOINT (a mirror, or the tests' loopback Hub), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


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

    def __init__(self, endpoint: str, token: str | None, *, timeout: float = 60.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.token = token
        self.timeout = timeout

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
            raise ServerError(f"{self.endpoint} did not resolve {repo}@{revision} to a commit")
        files = []
        for sib in info.siblings or []:
            blob = sib.lfs.sha256 if sib.lfs is not None else sib.blob_id
            size = sib.lfs.size if sib.lfs is not None else sib.size
            # blob ids become file names in the cache: only the Hub's hex digests are accepted
            if not isinstance(blob, str) or not _BLOB_RE.fullmatch(blob) or not isinstance(size, int) or size < 0:
                raise ServerError(f"{self.endpoint} listed {sib.rfilename} of {repo} without a valid size and blob id")
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
            raise ServerError(f"{self.endpoint} served {repo}/{path} from commit {meta.commit_hash}, not {sha}")

    def read_text(self, repo: str, sha: str, path: str, *, max_bytes: int = 64 << 20) -> str:
        """A small file's text (the weights index), without writing it anywhere."""
        import requests
        import urllib3

        try:
            with self._session() as session, self._get(session, repo, sha, path, 0) as resp:
                data = resp.raw.read(max_bytes + 1, decode_content=True)
        except _Transient as err:
            raise self._unreachable(err.cause) from None
        except (requests.RequestException, urllib3.exceptions.HTTPError) as err:
            raise self._unreachable(err) from None
        if len(data) > max_bytes:
            raise ServerError(f"{repo}/{path} is larger than {max_bytes} bytes")
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise ServerError(f"{repo}/{path} from {self.endpoint} is not UTF-8 text") from None

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
                f"model {repo} not found on {self.endpoint}",
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
            raise ServerError(
                f"{self.endpoint} answered {status or 'an error'} for {repo}: {_first_line(err)}"
            ) from None
        except OSError as err:
            raise self._unreachable(err) from None
        except Exception as err:  # httpx/httpx2 transport errors share no base with OSError
            if type(err).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore"):
                raise self._unreachable(err) from None
            raise

    def _gated(self, repo: str, status: int | None) -> ConfigError:
        if self.token:
            return ConfigError(
                f"{self.endpoint} refused the token from hf_token_file for {repo} ({status})",
                key="hf_token_file",
                hint="use a token with read access, and accept the model's licence on its page first",
            )
        return ConfigError(
            f"{repo} is gated or private and kit sent no token ({status})",
            key="hf_token_file",
            hint="put a read token in a file (mode 600) and set hf_token_file to it",
        )

    def _unreachable(self, err: BaseException) -> ServerError:
        return ServerError(
            f"cannot reach {self.endpoint}: {_first_line(err)}",
            hint="check the network/proxy (HTTPS_PROXY) or HF_ENDPOINT; on a compute node without internet, "
            "run kit fetch on a login node into the shared hf_cache",
        )

    # ----------------------------------------------------------------- the bytes

    def _session(self) -> requests.Session:
        import requests

        session = requests.Session()
        # No ~/.netrc credentials: an auth callable that adds nothing stops requests looking them up.
        session.auth = _NoAuth()
        session.headers.update({"User-Agent": f"kit/{__version__}", "Accept-Encoding": "identity"})
        return session

    def _headers(self, url: str) -> dict[str, str]:
        if self.token and urlsplit(url).netloc == urlsplit(self.endpoint).netloc:
            return {"Authorization": f"Bearer {self.token}"}
        return {}

    def _url(self, repo: str, sha: str, path: str) -> str:
        from urllib.parse import quote

        return f"{self.endpoint}/{repo}/resolve/{sha}/{quote(path)}"

    def _get(self, session: requests.Session, repo: str, sha: str, path: str, offset: int) -> requests.Response:
        import requests

        url = self._url(repo, sha, path)
        headers = self._headers(url)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        try:
            # requests drops Authorization when the Hub redirects to its CDN (another host).
            resp = session.get(url, headers=headers, stream=True, timeout=(10, self.timeout), allow_redirects=True)
        except requests.RequestException as err:
            raise _Transient(err) from None
        if resp.status_code in (200, 206):
            return resp
        resp.close()
        code = resp.headers.get("X-Error-Code", "")
        if resp.status_code in (401, 403) or code == "GatedRepo":
            raise self._gated(repo, resp.status_code)
        if resp.status_code == 404:
            raise ServerError(f"{self.endpoint} has no {path} in {repo}@{sha[:12]} although it listed it (404)")
        if resp.status_code == 416 and offset:
            raise _RangeRefused()
        if resp.status_code in (408, 429) or resp.status_code >= 500:
            raise _Transient(RuntimeError(f"{resp.status_code} {resp.reason}"))
        raise ServerError(f"{self.endpoint} answered {resp.status_code} {resp.reason} for {repo}/{path}")

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
            with self._session() as session:
                while not stop.is_set():
                    with lock:
                        if not queue:
                            return
                        f = queue.pop(0)
                    try:
                        self._fetch_file(session, plan, layout, f, progress, stop, done=f.path in done)
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
        session: requests.Session,
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
            with _blob_lock(layout.lock(f), stop):
                # In the cache a blob's name is its content hash: the right size is the right file,
                # also when another process finished it while this one waited for the lock.
                if done or (not layout.local and _size(store) == f.size):
                    progress.add(f.size, network=False)
                else:
                    if _size(store) is not None:  # truncated, corrupted or another revision's: replace
                        store.unlink()
                    self._transfer(session, plan, f, partial, progress, stop)
                    _finish(partial, store)
                if not layout.local:
                    _link(layout.final(f), layout.link_target(f))
        except OSError as err:
            raise write_error(err, partial.parent, f.path) from None
        progress.file_done()

    def _transfer(
        self,
        session: requests.Session,
        plan: FetchPlan,
        f: RemoteFile,
        partial: Path,
        progress: Progress,
        stop: threading.Event,
    ) -> None:
        partial.parent.mkdir(parents=True, exist_ok=True)
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
                offset = self._stream(session, plan, f, partial, offset, progress, stop)
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
            tries = 0 if offset > before else tries + 1
            if tries >= _RETRIES:
                why = _first_line(failure) if failure else f"the server sent {offset} of the {f.size} bytes"
                raise ServerError(
                    f"downloading {f.path} from {self.endpoint} failed {_RETRIES} times: {why}",
                    hint="run kit fetch again to continue; if it repeats, the Hub's copy is broken at this revision",
                )
            if tries:
                time.sleep(min(2.0, _RETRY_WAIT * tries))

    def _stream(
        self,
        session: requests.Session,
        plan: FetchPlan,
        f: RemoteFile,
        partial: Path,
        offset: int,
        progress: Progress,
        stop: threading.Event,
    ) -> int:
        """One GET from `offset` appended to the partial file; returns the new size."""
        import requests
        import urllib3

        with self._get(session, plan.repo, plan.sha, f.path, offset) as resp:
            if offset and resp.status_code == 200:  # the server ignored the Range: start over
                progress.add(-offset, network=False)
                offset = 0
                partial.unlink(missing_ok=True)
            elif offset:
                start = resp.headers.get("Content-Range", "").removeprefix("bytes ").split("-")[0]
                if start != str(offset):
                    raise _RangeRefused()
            try:
                # O_CREAT without O_TRUNC: bytes already there stay (see the module docstring).
                # 0o666 less the umask, the mode huggingface_hub gives its blobs (a shared cache).
                with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT, 0o666), "wb") as fh:
                    fh.seek(offset)
                    while not stop.is_set():
                        chunk = resp.raw.read1(CHUNK)
                        if not chunk:
                            break
                        if offset + len(chunk) > f.size:
                            raise ServerError(f"{self.endpoint} sent more than the {f.size} bytes listed for {f.path}")
                        fh.write(chunk)
                        offset += len(chunk)
                        progress.add(len(chunk))
            except (requests.RequestException, urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as err:
                raise _Transient(err) from None
        if stop.is_set():
            raise _Stopped()
        return offset


def write_error(err: OSError, where: Path, what: str) -> KitError:
    """A failed write as one line: a full disk or quota (NoSpace), else the path and the reason."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoSpace(
            f"{'disk quota exceeded' if err.errno == errno.EDQUOT else 'no space left'} on {where}, writing {what}",
            hint="free space (partial files stay; kit fetch continues them) or choose another hf_cache / --local-dir",
        )
    return ConfigError(
        f"cannot write {what} under {where}: {err.strerror or err}",
        hint="make the folder writable, or choose another hf_cache / --local-dir",
    )


class _NoAuth:
    def __call__(self, request: Any) -> Any:
        return request


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
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


@contextlib.contextmanager
def _blob_lock(path: Path, stop: threading.Event) -> Iterator[None]:
    """flock on huggingface_hub's lock file of the blob (filelock uses flock too), so kit and
    huggingface_hub (or two kit fetches on nodes sharing the cache) never write one blob at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o664)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if stop.wait(0.5):
                    raise _Stopped() from None
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _finish(partial: Path, store: Path) -> None:
    """The complete partial file becomes the blob (or the local file): one rename, so a reader
    sees either nothing or all of it."""
    store.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, store)


def _link(final: Path, target: str) -> None:
    """The snapshot's relative symlink to the blob, replaced atomically if it points elsewhere."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.is_symlink() and os.readlink(final) == target:
        return
    tmp = final.with_name(f".{final.name}.kit-link")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, final)
