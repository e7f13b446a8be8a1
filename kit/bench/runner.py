"""Send the load: one asyncio event loop streaming chat completions over kept-alive HTTP/1.1
connections (kit/bench/client.py); no thread per request.

Timing follows vLLM's openai-chat client (vllm/benchmarks/lib/endpoint_request_func.py) with
the client's own work kept out of the numbers (issue 21): a request's clock starts when its
bytes are written to the connection (its JSON built and a connection taken from the pool
before that), and each SSE message is stamped with the time the event loop read its last bytes
off the socket, before any parsing; the first message with `choices` is the first token.
A connection refused / reset (server gone), a 401 or the deadline stops sending further
requests; what was measured so far is returned with the reason. The deadline (kit tune's
budget) bounds every wait: no request starts after it, none waits for an answer past it, and
streams still open then are cut.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kit import safeload
from kit.bench.client import (
    LIMITS,
    Connection,
    ConnectionLost,
    Endpoint,
    Pool,
    ProtocolError,
    ResponseParser,
    new_event_loop,
)
from kit.bench.dataset import Prompt
from kit.bench.metrics import RequestRecord
from kit.bench.schedule import LoadPoint, arrivals
from kit.safe import text as safetext

# Requests in flight at once, one connection each (a file descriptor at both ends): kit bench
# refuses loads that would need more (build_load) rather than cap them silently and record a
# concurrency that was not the one run.
MAX_IN_FLIGHT = 256
BUDGET_STOP = "the time budget ran out"
ERROR_TEXT = 4096  # what is kept of an error answer's body
# A stream carries one chunk with choices per token, and the role chunk: these many more are let
# through before a stream counts as endless (it is cut there and the request fails).
EXTRA_CHUNKS = 16
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
    """Split a byte stream into SSE messages (blank-line separated), as vLLM's client does; a
    message longer than `max_event` bytes (one line that never ends) is a ProtocolError, so the
    buffer never grows past it."""

    def __init__(self, max_event: int = LIMITS.line_bytes) -> None:
        self.max_event = max_event
        self._buf = b""

    def add(self, chunk: bytes) -> list[str]:
        buf = self._buf + chunk if self._buf else chunk
        out: list[str] = []
        start = 0
        while (at := buf.find(b"\n\n", start)) >= 0:
            message = buf[start:at].strip()
            if message:
                out.append(message.decode("utf-8"))  # not UTF-8: a ValueError, the request fails
            start = at + 2
        self._buf = buf[start:]
        if len(self._buf) > self.max_event:
            raise ProtocolError(f"sent an event over {self.max_event} bytes")
        return out

    def rest(self) -> list[str]:
        tail = self._buf.strip()
        self._buf = b""
        return [tail.decode("utf-8")] if tail else []


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
    event = _event(data)
    if event.get("choices"):
        if record.chunks >= record.expected_output_tokens + EXTRA_CHUNKS:
            raise ProtocolError(
                f"sent more than {record.expected_output_tokens} tokens (the request asked for that many)"
            )
        if record.chunks == 0:
            record.ttft = now - record.start
        else:
            record.itl.append(now - last)
        record.chunks += 1
        return now
    usage = event.get("usage")
    if usage:
        if not isinstance(usage, dict):
            raise ProtocolError("sent a usage field that is not an object")
        record.output_tokens = _count(usage.get("completion_tokens"), "completion_tokens")
        record.prompt_tokens = _count(usage.get("prompt_tokens"), "prompt_tokens")
    return last


def _event(data: str) -> dict[str, Any]:
    """One event's JSON: an object, at most safeload.MAX_DEPTH deep, no NaN (ValueError else)."""
    if not safeload.json_depth_ok(data):
        raise ProtocolError(f"sent an event nested deeper than {safeload.MAX_DEPTH} levels")
    try:
        event = json.loads(data)
    except RecursionError:
        raise ProtocolError("sent an event nested too deep") from None
    if not isinstance(event, dict):
        raise ProtocolError("sent an event that is not a JSON object")
    return event


def _count(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"sent usage.{name} that is not a token count")
    return value


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def describe(exc: BaseException, phase: str) -> str:
    """One short line for a failed request (saved in the results, shown in the error line)."""
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return f"timed out {phase}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, ConnectionLost):
        return str(exc)
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    if isinstance(exc, ProtocolError):
        return f"the server {safetext.one_line(text, 160)}"
    return f"{type(exc).__name__}: {safetext.one_line(text, 160)}"


def server_gone(exc: BaseException, phase: str) -> bool:
    """A failure that says the server is gone: stop sending. A slow first answer is one
    request's failure; a connection that cannot be made or breaks is the server's end."""
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return phase != "waiting for the answer"
    return isinstance(exc, OSError)


class Runner:
    """One load point at a time; `stop()` (any thread) ends it early, Ctrl-C too. `deadline`
    (time.monotonic()) ends every run and request at that time."""

    stamp_at_select = True  # False: when the read callback runs (benchmarks/client_overhead.py compares)

    def __init__(self, target: Target, on_progress: Progress | None = None, deadline: float | None = None) -> None:
        self.target = target
        self.on_progress = on_progress or (lambda *_: None)
        self.deadline = deadline
        self.endpoint = Endpoint.parse(target.base_url)
        self.connections_opened = 0  # over every run so far (keep-alive shows as fewer than requests)
        self._headers = target.headers()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0
        self._pool: Pool | None = None
        self._abort = False
        self._reason: str | None = None
        self._wake: asyncio.Future[None] | None = None
        self._records: list[RequestRecord] = []
        self._in_flight: dict[int, RequestRecord] = {}
        self._failed = 0
        self._total = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._clock: Callable[[], float] = time.perf_counter

    def stop(self, reason: str) -> None:
        """End the run: no request starts after this and open streams are cut (any thread)."""
        loop = self._loop
        if loop is not None and loop.is_running() and threading.get_ident() != self._thread:
            loop.call_soon_threadsafe(self._stop, reason)
        else:
            self._stop(reason)

    def left(self) -> float | None:
        """Seconds until the deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def run(
        self,
        prompts: Sequence[Prompt],
        point: LoadPoint,
        *,
        seed: int = 0,
        burstiness: float = 1.0,
    ) -> PointRun:
        """Send every prompt at its arrival time with at most `point.concurrency` in flight."""
        self._abort, self._reason = False, None
        self._records, self._in_flight = [], {}
        self._failed, self._total = 0, len(prompts)
        offsets = arrivals(len(prompts), point.rate, burstiness, seed=seed)
        workers = min(point.concurrency or len(prompts), len(prompts)) or 1
        loop, self._clock = new_event_loop(self.stamp_at_select)
        self._loop, self._thread = loop, threading.get_ident()
        # No cyclic garbage collection during the run (timeit does the same): its passes over
        # the young objects took 1-1.5 ms a few times per run at 128 streams, a pause every
        # stream then showed as ITL. What a run leaves in cycles is collected after it.
        gc.collect()
        collecting = gc.isenabled()
        gc.disable()
        start = time.perf_counter()
        main = loop.create_task(self._send_all(prompts, offsets, workers))
        try:
            loop.run_until_complete(main)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM: keep what was measured; the caller saves it and re-raises
            self._stop("interrupted")
            self._drain(loop)
        except BaseException:
            self._stop("interrupted")
            raise
        finally:
            duration = time.perf_counter() - start
            self._close(loop)
            self._loop = None
            if collecting:
                gc.enable()
        if main.done() and not main.cancelled() and main.exception() is None:
            duration = main.result()
        records = self._records
        for record in self._in_flight.values():  # cut where an interrupt left them
            record.error = "stopped"
            records.append(record)
        records.sort(key=lambda r: r.index)
        return PointRun(records=records, duration=duration, not_sent=len(prompts) - len(records), stopped=self._reason)

    # ------------------------------------------------------------ inside the event loop

    def _stop(self, reason: str) -> None:
        if self._reason is None:
            self._reason = reason
        self._abort = True
        if self._wake is not None:
            _resolve(self._wake)
        if self._pool is not None:
            self._pool.abort()

    async def _sleep(self, delay: float) -> None:
        """Sleep until the next arrival; stop() wakes it."""
        loop = asyncio.get_running_loop()
        self._wake = loop.create_future()
        timer = loop.call_later(delay, _resolve, self._wake)
        try:
            await self._wake
        finally:
            timer.cancel()
            self._wake = None

    async def _send_all(self, prompts: Sequence[Prompt], offsets: list[float], workers: int) -> float:
        loop = asyncio.get_running_loop()
        self._pool = Pool(self.endpoint, self._clock)
        limit = asyncio.Semaphore(workers)
        left = self.left()
        budget = None if left is None else loop.call_later(max(left, 0.0), self._stop, BUDGET_STOP)
        tasks = self._tasks = []
        start = time.perf_counter()
        try:
            for i, (prompt, offset) in enumerate(zip(prompts, offsets, strict=True)):
                delay = start + offset - time.perf_counter()
                if delay > 0 and not self._abort:
                    await self._sleep(delay)
                left = self.left()
                if left is not None and left <= 0:
                    self._stop(BUDGET_STOP)  # cuts the streams still open
                if self._abort:
                    break
                tasks.append(loop.create_task(self._request(i, prompt, time.perf_counter(), limit)))
            if tasks:
                await asyncio.wait(tasks)
        finally:
            if budget is not None:
                budget.cancel()
            self.connections_opened += self._pool.opened
        return time.perf_counter() - start

    async def _request(self, index: int, prompt: Prompt, arrival: float, limit: asyncio.Semaphore) -> None:
        async with limit:
            left = self.left()
            if left is not None and left <= 0:
                self._stop(BUDGET_STOP)
            if self._abort:
                return  # not sent
            record = RequestRecord(index=index, expected_output_tokens=prompt.output_len)
            self._in_flight[index] = record
            try:
                await self._exchange(record, prompt, arrival)
            finally:
                del self._in_flight[index]
                self._records.append(record)
                self._failed += 0 if record.success else 1
                self.on_progress(len(self._records), self._failed, self._total)

    async def _exchange(self, record: RequestRecord, prompt: Prompt, arrival: float) -> None:
        """Send one request and time it into `record`."""
        assert self._pool is not None
        left = self.left()
        # Waiting for the answer ends at the deadline too (the stream itself is cut by stop()).
        timeout = self.target.timeout_s if left is None else max(min(self.target.timeout_s, left), 0.001)
        phase = "connecting"
        parser = ResponseParser(LIMITS)
        conn = None
        record.start = time.perf_counter()
        try:
            payload = json.dumps(request_body(self.target, prompt)).encode()
            data = self.endpoint.post("/v1/chat/completions", self._headers, payload)
            conn = await self._pool.get(min(10.0, timeout))
            phase = "waiting for the answer"
            record.start = time.perf_counter()  # the request leaves now
            record.queue_time = record.start - arrival
            conn.send(data, timeout)
            await self._read(conn, parser, record)
        except asyncio.CancelledError:
            record.error = "stopped"
            raise
        except (OSError, asyncio.TimeoutError, ValueError, AttributeError, TypeError) as exc:
            record.success = False
            if parser.status is not None:
                phase = "mid-stream"
            record.error = "stopped" if self._abort and self._reason else describe(exc, phase)
            left = self.left()
            if left is not None and left <= 0:
                self._stop(BUDGET_STOP)  # timed out at the deadline: the budget's doing, not the server's
            elif not self._abort and server_gone(exc, phase):
                self._stop(f"the server stopped answering ({record.error})")
        finally:
            if conn is not None:
                self._pool.put(conn, reusable=parser.done and parser.keep_alive and not self._abort)

    async def _read(self, conn: Connection, parser: ResponseParser, record: RequestRecord) -> None:
        sse = SSEBuffer()
        error_body = bytearray()
        last = now = record.start
        finished = False  # saw [DONE]: a stream that ended by itself, not one stop() cut
        while not parser.done or parser.pending:
            if parser.pending:  # a compressed body, inflated a step at a time (kit/net/wire.py)
                body = parser.drain()
            else:
                piece = await conn.receive()
                if piece is None:
                    body = parser.end()  # raises when the answer was cut short
                else:
                    now, raw = piece
                    body = parser.feed(raw)
            if parser.status is None:
                continue
            if parser.status != 200:
                error_body += body[: ERROR_TEXT - len(error_body)]
                continue
            for message in sse.add(body):
                last = apply_message(record, message, now, last)
                finished = finished or is_done(message)
        record.status = parser.status
        if parser.status != 200:
            text = safetext.one_line(bytes(error_body).decode("utf-8", "replace"), 160)
            record.error = f"HTTP {parser.status}" + (f": {text}" if text else "")
            if parser.status == 401:
                self._stop("the server answered 401 Unauthorized")
            return
        for message in sse.rest():
            last = apply_message(record, message, now, last)
            finished = finished or is_done(message)
        if not finished and self._abort and self._reason:  # stop() cut it short
            record.error = "stopped"
        elif record.chunks:
            record.success = True
            record.latency = last - record.start
        else:
            record.error = "no token arrived before the stream ended"

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """After an interrupt: let the requests that were cut record themselves (a few ms)."""
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=5))

    def _close(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            if self._pool is not None:
                self._pool.close()
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending))
            loop.run_until_complete(asyncio.sleep(0))  # closed transports let go of their sockets
            loop.run_until_complete(loop.shutdown_asyncgens())
            for task in self._tasks:  # one an interrupt ended has KeyboardInterrupt in it: seen, not logged
                if task.done() and not task.cancelled():
                    task.exception()
        finally:
            self._pool = None
            loop.close()
