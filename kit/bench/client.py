"""The HTTP/1.1 client under `kit bench` (issue 21): asyncio, the standard library only.

What a load of streamed POSTs needs and nothing more: http and https, a keep-alive pool (as
vLLM's aiohttp connector keeps one), Content-Length, chunked and read-until-close bodies, gzip
and deflate (decoded within the body bound, kit/net/http.py's ResponseParser: the one parser
kit reads every HTTP answer with). Each piece the server sends is stamped with the time the event loop's wait for the
sockets returned with it (StampingSelector), before any task runs: the time a token reached
this process, not the time this client got round to parsing it. That is the point of owning
the client: aiohttp and httpx hand bytes over only after their own buffering and a task
switch, and where that happens is theirs to change.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from kit.net import http
from kit.net.http import ConnectionLost, ProtocolError, ResponseParser, tls_context

__all__ = [
    "LIMITS",
    "Connection",
    "ConnectionLost",
    "Endpoint",
    "Pool",
    "ProtocolError",
    "ResponseParser",
    "new_event_loop",
]

# What one answer may be: kit's HTTP bounds (kit/net/http.py, the same parser) with room for
# a long stream: 64 MiB of events and 1 MiB per line or event; the runner adds a deadline per
# request and a cap on tokens (kit/bench/runner.py).
LIMITS = http.DEFAULT.but(body_bytes=64 * 1024 * 1024, line_bytes=1024 * 1024)


class ReadTimeout(TimeoutError):
    """The answer did not finish within the request's timeout."""


@dataclass(frozen=True)
class Endpoint:
    """Where a base URL points: scheme, host, port and path prefix."""

    host: str
    port: int
    tls: bool
    netloc: str  # the Host header: host[:port] as the URL wrote it
    prefix: str  # the URL's path, no trailing slash ("" for http://host:8000)

    @classmethod
    def parse(cls, base_url: str) -> Endpoint:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base_url!r} is not an http:// or https:// URL")
        tls = parts.scheme == "https"
        netloc = parts.netloc.rpartition("@")[2]  # no userinfo in Host
        return cls(parts.hostname, parts.port or (443 if tls else 80), tls, netloc, parts.path.rstrip("/"))

    def post(self, path: str, headers: Mapping[str, str], body: bytes) -> bytes:
        """The bytes of one POST, head and body, ready for a single write."""
        lines = [
            f"POST {self.prefix}{path} HTTP/1.1",
            f"Host: {self.netloc}",
            "User-Agent: kit-bench",
            "Accept: */*",
            "Accept-Encoding: gzip, deflate",  # what requests and aiohttp send; decoded below
            f"Content-Length: {len(body)}",
        ]
        for name, value in headers.items():
            if any(c in value for c in "\r\n\0") or any(c in name for c in "\r\n\0:"):
                raise ValueError(f"header {name!r} has a line break or NUL in it")
            lines.append(f"{name}: {value}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class StampingSelector(selectors.DefaultSelector):
    """The event loop's selector, noting when each wait for the sockets returned. Every piece
    read in a loop iteration was reported by that wait, so that is when it was here. The read
    callbacks of an iteration run after the tasks woken in the one before (asyncio's ready
    queue), so a stamp taken in data_received would add the parsing of the previous pieces:
    ~50 us a stream, milliseconds at a concurrency of 100 (measured by
    benchmarks/client_overhead.py)."""

    returned = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(timeout)
        self.returned = time.perf_counter()
        return ready


def new_event_loop(stamp_at_select: bool = True) -> tuple[asyncio.AbstractEventLoop, Callable[[], float]]:
    """An event loop and the clock its connections stamp arrivals with."""
    if not stamp_at_select:
        return asyncio.new_event_loop(), time.perf_counter
    selector = StampingSelector()
    return asyncio.SelectorEventLoop(selector), lambda: selector.returned


class Connection(asyncio.Protocol):
    """One connection. What the server sends is queued as (arrival time, bytes) by the event
    loop itself, so the time is right even while the task that reads it is busy."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.transport: asyncio.Transport | None = None
        self.pieces: deque[tuple[float, bytes]] = deque()
        self.closed = False
        self.error: BaseException | None = None
        self.timed_out = False
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timeout = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = self.clock()
        self.pieces.append((now, data))
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc
        self._wake()
        self._cancel_timer()

    # used by the pool and the runner
    def send(self, data: bytes, timeout: float) -> None:
        """Write one request; its whole answer must be in within `timeout` (one timer per
        request, none per token: a stream that never ends or a server that drips one byte at
        a time ends there, as a silent one does)."""
        assert self.transport is not None
        self._timeout = timeout
        self.timed_out = False
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(timeout, self._expire)
        self.transport.write(data)

    async def receive(self) -> tuple[float, bytes] | None:
        """The next piece of the answer with its arrival time; None once the server closed."""
        if self.timed_out:  # before any queued piece: a flood never outruns the deadline
            raise ReadTimeout(f"the answer was not complete within {self._timeout:g} s")
        while not self.pieces:
            if self.timed_out:
                raise ReadTimeout(f"the answer was not complete within {self._timeout:g} s")
            if self.closed:
                if isinstance(self.error, OSError):
                    raise self.error
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.pieces.popleft()

    def settle(self) -> None:
        """The exchange is over: no more deadline."""
        self._cancel_timer()

    def close(self) -> None:
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection now; a task waiting in receive() wakes to a closed connection."""
        self._cancel_timer()
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _expire(self) -> None:
        self.timed_out = True
        self._timer = None
        self._wake()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Pool:
    """Kept-alive connections to one endpoint, most recently used first; one per request in
    flight, so never more than the run's concurrency."""

    def __init__(self, endpoint: Endpoint, clock: Callable[[], float] = time.perf_counter) -> None:
        self.endpoint = endpoint
        self.clock = clock
        self.opened = 0  # connections opened so far (the keep-alive test counts them)
        self._idle: list[Connection] = []
        self._all: set[Connection] = set()
        self._tls = tls_context() if endpoint.tls else None

    async def get(self, timeout: float) -> Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:  # the server may have closed it while it was idle
                return conn
            self._all.discard(conn)
        loop = asyncio.get_running_loop()
        ep = self.endpoint
        hostname = ep.host if self._tls else None
        connect = loop.create_connection(
            lambda: Connection(self.clock), ep.host, ep.port, ssl=self._tls, server_hostname=hostname
        )
        _, conn = await asyncio.wait_for(connect, timeout)
        self._all.add(conn)
        self.opened += 1
        return conn

    def put(self, conn: Connection, reusable: bool) -> None:
        conn.settle()
        if reusable and not conn.closed:
            self._idle.append(conn)
        else:
            self._all.discard(conn)
            conn.close()

    def abort(self) -> None:
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()

    def close(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()
