"""The HTTP/1.1 client under `kit bench` (issue 21): asyncio, the standard library only.

What a load of streamed POSTs needs and nothing more: http and https, a keep-alive pool (as
vLLM's aiohttp connector keeps one), Content-Length, chunked and read-until-close bodies, gzip
and deflate. Each piece the server sends is stamped with the time the event loop's wait for the
sockets returned with it (StampingSelector), before any task runs: the time a token reached
this process, not the time this client got round to parsing it. That is the point of owning
the client: aiohttp and httpx hand bytes over only after their own buffering and a task
switch, and where that happens is theirs to change.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import ssl
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024  # a response head larger than this is not an OpenAI server's
# A chunk-size line, a trailer line: what one line may hold before the answer is refused.
MAX_LINE = 8 * 1024


class ConnectionLost(ConnectionError):
    """The connection closed or broke before the response was complete."""


class ReadTimeout(TimeoutError):
    """Nothing arrived for the request's timeout."""


class ProtocolError(ValueError):
    """The answer is not HTTP/1.1 as this client reads it."""


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


class ResponseParser:
    """One HTTP/1.1 response, fed as it arrives: `feed` returns the body bytes (de-chunked,
    decompressed) each piece completes; `status` and `headers` are set once the head is in,
    `done` once the body is."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.done = False
        self.keep_alive = False  # the connection may carry the next request (when done)
        self.received = 0  # bytes of the answer so far
        self._buf = bytearray()
        self._mode = "head"  # head, size, data, crlf, trailer, length, close
        self._left = 0
        self._decoder: zlib._Decompress | None = None

    def feed(self, data: bytes) -> bytes:
        self.received += len(data)
        if self.done:
            self.keep_alive = False  # bytes after the end: the connection is out of step
            return b""
        self._buf += data
        out: list[bytes] = []
        buf = self._buf
        while buf and not self.done:
            mode = self._mode
            if mode in ("data", "length", "close"):
                take = bytes(buf) if mode == "close" else bytes(buf[: self._left])
                del buf[: len(take)]
                out.append(take)
                if mode != "close":
                    self._left -= len(take)
                    if self._left == 0:
                        if mode == "data":
                            self._mode = "crlf"
                        else:
                            self._finish()
            elif mode == "crlf":
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise ProtocolError("a chunk does not end in CRLF")
                del buf[:2]
                self._mode = "size"
            else:
                line = self._line(MAX_HEAD if mode == "head" else MAX_LINE, b"\r\n\r\n" if mode == "head" else b"\r\n")
                if line is None:
                    break
                if mode == "head":
                    self._head(line)
                elif mode == "size":
                    self._size(line)
                elif not line:  # trailer: an empty line ends the body
                    self._finish()
        return self._decode(b"".join(out))

    def end(self) -> bytes:
        """The connection closed: the rest of a body that ends there; raises ConnectionLost
        when the answer was cut short."""
        if self._mode == "close" and not self.done:
            self.done = True
            tail = self._decode(b"", flush=True)
            return tail
        if self.done:
            return b""
        if self.received == 0:
            raise ConnectionLost("connection closed before the response")
        raise ConnectionLost("connection broken mid-response")

    def _line(self, limit: int, end: bytes) -> bytes | None:
        at = self._buf.find(end)
        if at < 0:
            if len(self._buf) > limit:
                raise ProtocolError("a line of the answer is too long")
            return None
        line = bytes(self._buf[:at])
        del self._buf[: at + len(end)]
        return line

    def _head(self, head: bytes) -> None:
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:60]!r}")
        headers: dict[str, str] = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError(f"not a header line: {line[:60]!r}")
            key = name.strip().lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        status = int(code)
        if 100 <= status < 200:  # 100 Continue and friends: the real answer follows
            return
        self.status, self.headers = status, headers
        connection = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        self.keep_alive = version == "HTTP/1.1" and "close" not in connection
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("gzip", "x-gzip"):
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._decoder = zlib.decompressobj()
        elif encoding not in ("identity", ""):
            raise ProtocolError(f"Content-Encoding {encoding} (kit asks for gzip or deflate only)")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._mode = "size"
        elif "content-length" in headers:
            try:
                self._left = int(headers["content-length"])
            except ValueError:
                raise ProtocolError(f"Content-Length {headers['content-length'][:20]!r}") from None
            self._mode = "length"
            if self._left == 0:
                self._finish()
        elif status in (204, 304):
            self._finish()
        else:
            self._mode = "close"
            self.keep_alive = False

    def _size(self, line: bytes) -> None:
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise ProtocolError(f"not a chunk size: {line[:20]!r}") from None
        if size < 0:
            raise ProtocolError("a negative chunk size")
        self._left, self._mode = size, ("data" if size else "trailer")

    def _finish(self) -> None:
        self.done = True
        if self._buf:
            self.keep_alive = False

    def _decode(self, data: bytes, flush: bool = False) -> bytes:
        if self._decoder is None:
            return data
        try:
            out = self._decoder.decompress(data)
            return out + self._decoder.flush() if flush or self.done else out
        except zlib.error as exc:
            raise ProtocolError(f"the compressed body does not decode: {exc}") from None


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
        self._last = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = self.clock()
        self._last = now
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
        """Write one request; from now on the answer must keep coming, no gap over `timeout`."""
        assert self.transport is not None
        self._timeout = timeout
        self._last = time.perf_counter()
        self.timed_out = False
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(timeout, self._check_idle)
        self.transport.write(data)

    async def receive(self) -> tuple[float, bytes] | None:
        """The next piece of the answer with its arrival time; None once the server closed."""
        while not self.pieces:
            if self.timed_out:
                raise ReadTimeout(f"nothing arrived for {self._timeout:g} s")
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
        """The exchange is over: no more idle timeout."""
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

    def _check_idle(self) -> None:
        # One timer per request, re-armed only when it fires: none per token.
        idle = time.perf_counter() - self._last
        if idle >= self._timeout * 0.999:
            self.timed_out = True
            self._timer = None
            self._wake()
        else:
            self._timer = asyncio.get_running_loop().call_later(self._timeout - idle, self._check_idle)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def tls_context() -> ssl.SSLContext:
    """Verify as requests did (its CA bundle variables, else certifi's bundle), so an https URL
    that `kit bench` reached before still verifies."""
    cafile = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if not cafile:
        try:
            import certifi

            cafile = certifi.where()
        except ImportError:
            cafile = None
    return ssl.create_default_context(cafile=cafile)


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
