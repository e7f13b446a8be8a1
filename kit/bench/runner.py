"""Send the load: threads, each with its own `requests` session, streaming chat completions.

Timing follows vLLM's openai-chat client: the clock starts before the POST, each SSE message
is stamped when it is parsed, the first message with `choices` is the first token.
A connection refused / reset (server gone), a 401 or the deadline stops sending further
requests; what was measured so far is returned with the reason. The deadline (kit tune's
budget) bounds every wait: no request starts after it, none waits for an answer past it, and
streams still open then are cut.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

# Imported once here, not in each worker thread: the first `import requests` takes ~0.3 s and
# holds the import lock, which delayed the first requests of a paced run (kit's CLI imports
# verb modules lazily, so only `kit bench`/`kit tune` pay for it).
import requests
import urllib3

from kit.bench.dataset import Prompt
from kit.bench.metrics import RequestRecord
from kit.bench.schedule import LoadPoint, arrivals

# One thread per request in flight; kit bench refuses loads that would need more (build_load)
# rather than cap them silently and record a concurrency that was not the one run.
MAX_IN_FLIGHT = 256
BUDGET_STOP = "the time budget ran out"
# The connection dropped under a request: the server is gone, stop sending (raw urllib3 errors
# come from read1; requests wraps the ones raised before the body).
CONNECTION_LOST = (
    requests.exceptions.ConnectionError,
    requests.exceptions.ChunkedEncodingError,
    urllib3.exceptions.ProtocolError,
    urllib3.exceptions.ReadTimeoutError,
)
Progress = Callable[[int, int, int], None]  # (finished, failed, total)


@dataclass(frozen=True)
class Target:
    base_url: str
    model: str
    api_key: str | None = None
    ignore_eos: bool = True
    timeout_s: float = 600.0

    def headers(self) -> dict[str, str]:
        out = {"Content-Type": "application/json"}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out


@dataclass
class PointRun:
    records: list[RequestRecord]
    duration: float
    not_sent: int
    stopped: str | None  # why sending stopped early, or None


class SSEBuffer:
    """Split a byte stream into SSE messages (blank-line separated), as vLLM's client does."""

    def __init__(self) -> None:
        self.buffer = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def add(self, chunk: bytes) -> list[str]:
        self.buffer += self._decoder.decode(chunk)
        out: list[str] = []
        while "\n\n" in self.buffer:
            message, self.buffer = self.buffer.split("\n\n", 1)
            if message.strip():
                out.append(message.strip())
        return out

    def rest(self) -> list[str]:
        tail = self.buffer.strip()
        self.buffer = ""
        return [tail] if tail else []


def request_body(target: Target, prompt: Prompt) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": target.model,
        "messages": list(prompt.messages),
        "max_completion_tokens": prompt.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if target.ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension: exactly output_len tokens per request
    return body


def is_done(message: str) -> bool:
    return message.removeprefix("data:").strip() == "[DONE]"


def apply_message(record: RequestRecord, message: str, now: float, last: float) -> float:
    """Fold one SSE message into the record; returns the new time of the last token chunk."""
    if message.startswith(":"):
        return last
    data = message.removeprefix("data:").strip()
    if data == "[DONE]":
        return last
    event = json.loads(data)
    if event.get("choices"):
        if record.chunks == 0:
            record.ttft = now - record.start
        else:
            record.itl.append(now - last)
        record.chunks += 1
        return now
    usage = event.get("usage")
    if usage:
        record.output_tokens = usage.get("completion_tokens")
        record.prompt_tokens = usage.get("prompt_tokens")
    return last


def arriving(resp: requests.Response) -> Iterator[bytes]:
    """The response body piece by piece, each as soon as it arrives. read1 returns what is there
    (at most one socket read), for a chunked body and for one that ends when the connection
    closes alike; `iter_content(chunk_size=None)` waits for the whole body in the second case
    (urllib3 reads to EOF), which made TTFT == E2E behind some proxies."""
    while piece := resp.raw.read1(65536, decode_content=True):  # gzip decoded as iter_content did
        yield piece


def _short(exc: BaseException) -> str:
    text = str(exc).replace("\n", " ")
    markers = ("Connection refused", "Connection reset", "Connection broken", "Remote end closed", "timed out")
    for marker in markers:
        if marker in text:
            return f"{type(exc).__name__}: {marker}"
    return f"{type(exc).__name__}: {text[:160]}"


class Runner:
    """One load point at a time; `stop()` (another thread, Ctrl-C) ends it early. `deadline`
    (time.monotonic()) ends every run and request at that time."""

    def __init__(self, target: Target, on_progress: Progress | None = None, deadline: float | None = None) -> None:
        self.target = target
        self.on_progress = on_progress or (lambda *_: None)
        self.deadline = deadline
        self._local = threading.local()
        self._abort = threading.Event()
        self._reason: str | None = None
        self._lock = threading.Lock()
        self._open: set[Any] = set()

    def stop(self, reason: str) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = reason
        self._abort.set()
        with self._lock:
            responses = list(self._open)
        for resp in responses:
            # shutdown() wakes a thread blocked reading this socket (close() alone does not: the
            # socket stays open while urllib3's reader holds it); needs urllib3 >= 2.3.
            with contextlib.suppress(Exception):
                resp.raw.shutdown()
            with contextlib.suppress(Exception):
                resp.close()

    def left(self) -> float | None:
        """Seconds until the deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def _session(self) -> Any:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            self._local.session = session
        return session

    def one(self, index: int, prompt: Prompt, arrival: float | None = None) -> RequestRecord | None:
        """Send one request and time it; None when the run was stopped before it was sent."""
        left = self.left()
        if left is not None and left <= 0:
            self.stop(BUDGET_STOP)
        if self._abort.is_set():
            return None
        # Waiting for the answer's headers ends at the deadline too (the stream itself is cut by stop()).
        read_timeout = self.target.timeout_s if left is None else min(self.target.timeout_s, left)
        record = RequestRecord(index=index, expected_output_tokens=prompt.output_len)
        url = f"{self.target.base_url}/v1/chat/completions"
        body = request_body(self.target, prompt)
        record.start = time.perf_counter()
        record.queue_time = record.start - arrival if arrival is not None else 0.0
        last = record.start
        resp = None
        try:
            resp = self._session().post(
                url,
                json=body,
                headers=self.target.headers(),
                stream=True,
                timeout=(min(10, read_timeout), read_timeout),
            )
            with self._lock:
                self._open.add(resp)
            record.status = resp.status_code
            if resp.status_code != 200:
                text = resp.text.strip().replace("\n", " ")[:160]
                record.error = f"HTTP {resp.status_code}" + (f": {text}" if text else "")
                if resp.status_code == 401:
                    self.stop("the server answered 401 Unauthorized")
                return record
            sse = SSEBuffer()
            finished = False  # saw [DONE]: a stream that ended by itself, not one stop() cut
            for chunk in arriving(resp):
                now = time.perf_counter()
                for message in sse.add(chunk):
                    last = apply_message(record, message, now, last)
                    finished = finished or is_done(message)
            for message in sse.rest():
                last = apply_message(record, message, time.perf_counter(), last)
                finished = finished or is_done(message)
            if not finished and self._abort.is_set() and self._reason:  # stop() cut it short
                record.error = "stopped"
            elif record.chunks:
                record.success = True
                record.latency = last - record.start
            else:
                record.error = "no token arrived before the stream ended"
        except (
            requests.exceptions.RequestException,
            urllib3.exceptions.HTTPError,
            OSError,
            ValueError,
            AttributeError,
        ) as exc:
            record.success = False
            record.error = "stopped" if self._abort.is_set() and self._reason else _short(exc)
            left = self.left()
            if left is not None and left <= 0:
                self.stop(BUDGET_STOP)  # timed out at the deadline: the budget's doing, not the server's
            elif isinstance(exc, CONNECTION_LOST):
                self.stop(f"the server stopped answering ({record.error})")
        finally:
            if resp is not None:
                with self._lock:
                    self._open.discard(resp)
                resp.close()
        return record

    def run(
        self,
        prompts: Sequence[Prompt],
        point: LoadPoint,
        *,
        seed: int = 0,
        burstiness: float = 1.0,
    ) -> PointRun:
        """Send every prompt at its arrival time with at most `point.concurrency` in flight."""
        self._abort.clear()
        self._reason = None
        offsets = arrivals(len(prompts), point.rate, burstiness, seed=seed)
        workers = min(point.concurrency or len(prompts), len(prompts)) or 1
        records: list[RequestRecord] = []
        counts = [0, 0]
        lock = threading.Lock()

        def task(i: int, prompt: Prompt, arrival: float) -> None:
            rec = self.one(i, prompt, arrival)
            if rec is None:
                return
            with lock:
                records.append(rec)
                counts[0] += 1
                counts[1] += 0 if rec.success else 1
                done, failed = counts
            self.on_progress(done, failed, len(prompts))

        start = time.perf_counter()
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kit-bench")
        futures: list[Future[None]] = []
        try:
            for i, (prompt, offset) in enumerate(zip(prompts, offsets, strict=True)):
                while not self._abort.is_set():
                    left = self.left()
                    if left is not None and left <= 0:
                        self.stop(BUDGET_STOP)  # cuts the streams still open
                        break
                    delay = start + offset - time.perf_counter()
                    if delay <= 0:
                        break
                    self._abort.wait(min(delay, 0.2) if left is None else min(delay, 0.2, left))
                if self._abort.is_set():
                    break
                futures.append(pool.submit(task, i, prompt, time.perf_counter()))
            # Queued requests return at once after a stop; in-flight ones are closed by stop().
            pending = set(futures)
            while pending:
                left = self.left()
                if left is not None and left <= 0:
                    self.stop(BUDGET_STOP)  # cuts the streams still open
                _, pending = wait(pending, timeout=0.2 if left is None or left <= 0 else min(left, 0.2))
        except KeyboardInterrupt:  # Ctrl-C: keep what was measured; the caller saves it and re-raises
            self.stop("interrupted")
        except BaseException:
            self.stop("interrupted")
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            duration = time.perf_counter() - start
        records.sort(key=lambda r: r.index)
        return PointRun(records=records, duration=duration, not_sent=len(prompts) - len(records), stopped=self._reason)
