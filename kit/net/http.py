"""kit's one HTTP/1.1 client (issue 27), standard library only: `kit query`, the status and
liveness probes, `kit metrics`, the Hub's bytes in `kit fetch` and the supervisor's watch inside
the head container go through `request`/`open_url`; `kit bench` keeps its own event loop
(kit/bench/client.py, for its time stamps) on the same ResponseParser, Limits and SSE reader
(kit/net/wire.py, the parsing half of this layer).

Whatever a server sends, an exchange is bounded (Limits, each overridable per call):

- connect_s: reaching the server (TCP and TLS, through a proxy when the environment names one);
- total_s: the whole exchange, counted from its start and applied to every read: headers
  dripped a byte a second, a body or a stream that never ends, all end at the deadline (a
  per-read timeout would let them run forever);
- head_bytes, header_count: the status line and headers; line_bytes: a chunk-size or trailer
  line, and one line (one event) of an event stream;
- body_bytes: the body after decoding. A Content-Length over it is refused before a byte of the
  body is read. kit asks for `Accept-Encoding: identity`; a gzip or deflate body is still read,
  decompressed within body_bytes (a gzip bomb stops there); any other encoding, and any
  transfer coding but chunked, is refused.

JSON answers are read by `decode_json`: UTF-8, at most MAX_JSON_DEPTH levels, no NaN/Infinity.
Any violation is an HttpError (a ServerError, exit 8): one line naming the URL, its credentials
redacted, and what was wrong. With the default bounds kit's memory stays far below 256 MB.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import SplitResult, unquote, urljoin, urlsplit
from urllib.request import getproxies_environment, proxy_bypass

from kit import __version__, safeload
from kit.errors import ServerError
from kit.net.wire import DEFAULT, ConnectionLost, Limits, ProtocolError, ResponseParser, SSEReader
from kit.safe import text as safetext

__all__ = [
    "DEFAULT",
    "ConnectionLost",
    "Exchange",
    "HttpError",
    "Limits",
    "ProtocolError",
    "Response",
    "ResponseParser",
    "SSEReader",
    "decode_json",
    "open_url",
    "request",
    "tls_context",
]

MAX_JSON_DEPTH = 64
REDIRECTS = (301, 302, 303, 307, 308)
_RECV = 256 * 1024


class HttpError(ServerError):
    """One exchange failed or broke a bound: the message names the URL and what was wrong.
    `transient`: the server could not be reached, broke off or ran out of time (worth another
    try); False when what it sent breaks a bound or is not HTTP (it would do it again)."""

    def __init__(
        self, message: str, *, hint: str | None = None, status: int | None = None, transient: bool = False
    ) -> None:
        super().__init__(safetext.clean(message, newlines=False), hint=hint)
        self.status = status
        self.transient = transient

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "type": "ServerError"}  # what --json consumers match on


# ------------------------------------------------------------------------------ JSON


def decode_json(body: bytes, url: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON document of an answer, or one HttpError naming the URL: not UTF-8, HTML, not
    JSON, nested deeper than max_depth, NaN or Infinity."""
    where = safetext.redact_url(url)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HttpError(f"{where} answered a body that is not UTF-8 text, so not JSON") from None
    if text.lstrip()[:1] == "<":
        raise HttpError(
            f"{where} answered HTML, not JSON: {safetext.one_line(text, 80)}",
            hint="is this the OpenAI-style API of a vLLM server? check the URL (and any proxy in front of it)",
        )
    if not safeload.json_depth_ok(text, max_depth):
        raise HttpError(f"{where} answered JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise HttpError(f"{where} answered with text that is not JSON ({why}): {safetext.one_line(text, 60)}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# ------------------------------------------------------------------------------ connections


@lru_cache(maxsize=1)
def tls_context() -> ssl.SSLContext:
    """Verify as requests does (its CA bundle variables, else certifi's bundle when installed,
    else the system's), so an https URL kit reached before still verifies."""
    import os

    cafile = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or None
    if not cafile:
        try:
            import certifi

            cafile = certifi.where()
        except ImportError:
            cafile = None
    return ssl.create_default_context(cafile=cafile)


def _port(parts: SplitResult) -> int:
    try:
        port = parts.port
    except ValueError:
        raise HttpError(f"{safetext.redact_url(parts.geturl())} has an invalid port") from None
    return port or (443 if parts.scheme == "https" else 80)


def _proxy(parts: SplitResult, use_env: bool) -> SplitResult | None:
    if not use_env:
        return None
    proxies = getproxies_environment()
    chosen = proxies.get(parts.scheme)
    if not chosen or proxy_bypass(parts.hostname or ""):
        return None
    safetext.register_url(chosen)
    return urlsplit(chosen if "://" in chosen else f"http://{chosen}")


def _basic(parts: SplitResult) -> str | None:
    if parts.username is None:
        return None
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode("ascii")


class Exchange:
    """One request on a connection of its own, within one deadline (`deadline`, monotonic)."""

    def __init__(self, url: str, limits: Limits, deadline: float, *, proxies: bool, hint: str | None) -> None:
        self.url = url
        self.where = safetext.redact_url(url)
        self.parts = urlsplit(url)
        if self.parts.scheme not in ("http", "https") or not self.parts.hostname:
            raise HttpError(f"{self.where} is not an http:// or https:// URL")
        self.limits = limits
        self.deadline = deadline
        self.hint = hint
        self.proxy = _proxy(self.parts, proxies)
        self.sock: socket.socket | None = None
        self.parser = ResponseParser(limits)
        self._space = bytearray(_RECV)
        self._early: list[bytes] = []

    # ---- what the caller sees
    @property
    def status(self) -> int:
        assert self.parser.status is not None
        return self.parser.status

    @property
    def headers(self) -> dict[str, str]:
        return self.parser.headers

    def pieces(self) -> Iterator[bytes]:
        """The body, piece by piece, until it ends (HttpError on any bound or failure)."""
        for early in self._early:
            if early:
                yield early
        self._early = []
        while not self.parser.done or self.parser.pending:
            with self._errors():
                if self.parser.pending:  # a compressed body, inflated a step at a time
                    piece = self.parser.drain()
                else:
                    data = self._recv()
                    piece = self.parser.feed(data) if data else self.parser.end()
            if piece:
                yield piece

    def read(self) -> bytes:
        return b"".join(self.pieces())

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    # ---- how
    def send(self, method: str, headers: Mapping[str, str], body: bytes | None, *, head_only: bool) -> None:
        self.parser = ResponseParser(self.limits, head_only=head_only)
        with self._errors():
            self.sock = self._connect()
            self._send(self._request_bytes(method, headers, body))
            while self.parser.status is None:
                data = self._recv()
                self._early.append(self.parser.feed(data) if data else self.parser.end())

    def _request_bytes(self, method: str, headers: Mapping[str, str], body: bytes | None) -> bytes:
        parts = self.parts
        host = parts.netloc.rpartition("@")[2]
        path = parts.path or "/"
        target = path + (f"?{parts.query}" if parts.query else "")
        if self.proxy is not None and parts.scheme == "http":
            target = f"http://{host}{target}"
        lines = {
            "Host": host,
            "User-Agent": f"kit/{__version__}",
            "Accept-Encoding": "identity",
            "Connection": "close",
        }
        if self.proxy is not None and parts.scheme == "http" and _basic(self.proxy):
            lines["Proxy-Authorization"] = str(_basic(self.proxy))
        lines.update(headers)
        if body is not None:
            lines["Content-Length"] = str(len(body))
        out = [f"{method} {target} HTTP/1.1"]
        for name, value in lines.items():
            if any(c in f"{name}{value}" for c in "\r\n\0") or ":" in name:
                raise HttpError(f"{self.where}: the header {name!r} has a line break or NUL in it")
            out.append(f"{name}: {value}")
        return ("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + (body or b"")

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return left

    def _connect(self) -> socket.socket:
        parts, proxy = self.parts, self.proxy
        via = proxy or parts
        timeout = min(self.limits.connect_s, self._left())
        sock = socket.create_connection((via.hostname or "", _port(via)), timeout=timeout)
        try:
            if proxy is not None and parts.scheme == "https":
                self._tunnel(sock)
            if parts.scheme == "https":
                sock.settimeout(min(self.limits.connect_s, self._left()))
                sock = tls_context().wrap_socket(sock, server_hostname=parts.hostname)
        except BaseException:
            sock.close()
            raise
        return sock

    def _tunnel(self, sock: socket.socket) -> None:
        assert self.proxy is not None
        target = f"{self.parts.hostname}:{_port(self.parts)}"
        lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        if _basic(self.proxy):
            lines.append(f"Proxy-Authorization: {_basic(self.proxy)}")
        sock.settimeout(self._left())
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        answer = ResponseParser(self.limits, head_only=True)
        while answer.status is None:
            sock.settimeout(self._left())
            data = sock.recv(4096)
            if not data:
                answer.end()
            answer.feed(data)
        if answer.status != 200:
            raise HttpError(
                f"the proxy {safetext.redact_url(self.proxy.geturl())} refused to reach {self.where} ({answer.status})",
                hint="check HTTPS_PROXY / NO_PROXY",
            )

    def _send(self, data: bytes) -> None:
        assert self.sock is not None
        self.sock.settimeout(self._left())
        self.sock.sendall(data)

    def _recv(self) -> bytes:
        assert self.sock is not None
        self.sock.settimeout(self._left())
        n = self.sock.recv_into(self._space)
        return bytes(memoryview(self._space)[:n])

    def _errors(self) -> _Errors:
        return _Errors(self)


class _Errors:
    """Every low-level failure of an exchange as one HttpError line naming its URL."""

    def __init__(self, exchange: Exchange) -> None:
        self.x = exchange

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or isinstance(exc, HttpError):
            return
        x = self.x
        answered = x.parser.status is not None
        where, total = x.where, x.limits.total_s
        if isinstance(exc, (TimeoutError, socket.timeout)):
            if x.sock is None:
                message = f"cannot reach {where}: no connection within {min(x.limits.connect_s, total):g} s"
            elif answered:
                message = f"{where} did not finish answering within {total:g} s"
            else:
                message = f"{where} did not answer within {total:g} s"
            raise HttpError(message, hint=x.hint, transient=True) from None
        if isinstance(exc, ProtocolError):
            raise HttpError(f"{where} {exc}", hint="is this the server kit expects?") from None
        if isinstance(exc, ConnectionLost):
            why = "broke off its answer" if answered or x.parser.received else "closed the connection without answering"
            raise HttpError(f"{where} {why}", hint=x.hint, transient=True) from None
        if isinstance(exc, ssl.SSLError):
            reason = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or type(exc).__name__
            raise HttpError(f"cannot reach {where}: TLS failed ({reason})", hint=x.hint, transient=True) from None
        if isinstance(exc, OSError):
            why = _why(exc)
            if answered or x.parser.received:
                raise HttpError(f"{where} broke off its answer: {why}", hint=x.hint, transient=True) from None
            raise HttpError(f"cannot reach {where}: {why}", hint=x.hint, transient=True) from None
        return


def _why(exc: OSError) -> str:
    """The reason of a failed connection, never the exception's text (which may carry more)."""
    if isinstance(exc, socket.gaierror):
        return "name or service not known"
    text = exc.strerror or type(exc).__name__
    return str(text).lower() if exc.strerror else text


# ------------------------------------------------------------------------------ requests


def open_url(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    json_body: Any = None,
    limits: Limits = DEFAULT,
    redirects: int = 0,
    proxies: bool = True,
    hint: str | None = None,
    deadline: float | None = None,
) -> Exchange:
    """Send one request and read the answer's head (following up to `redirects` redirects, all
    within the one deadline); the caller reads the body with .pieces() or .read() and closes it.
    URL credentials are sent as Basic auth to that host only, and redacted from every message."""
    safetext.register_url(url)
    if json_body is not None:
        body = json.dumps(json_body, allow_nan=False).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
    end = deadline if deadline is not None else time.monotonic() + limits.total_s
    current, sent = url, dict(headers or {})
    origin = urlsplit(url)
    if "Authorization" not in sent and _basic(origin):
        sent["Authorization"] = str(_basic(origin))
    for _ in range(redirects + 1):
        exchange = Exchange(current, limits, end, proxies=proxies, hint=hint)
        exchange.send(method, sent, body, head_only=method == "HEAD")
        location = exchange.headers.get("location")
        if exchange.status not in REDIRECTS or redirects == 0 or not location:
            return exchange
        exchange.close()
        nxt = urljoin(current, location)
        parts = urlsplit(nxt)
        if parts.scheme not in ("http", "https") or (origin.scheme == "https" and parts.scheme == "http"):
            raise HttpError(f"{exchange.where} redirected to {safetext.redact_url(nxt)}, which kit does not follow")
        if (parts.hostname, _port(parts)) != (origin.hostname, _port(origin)):
            sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}  # another host: no credentials
        if exchange.status == 303 or (exchange.status in (301, 302) and method == "POST"):
            method, body = "GET", None
            sent = {k: v for k, v in sent.items() if k.lower() not in ("content-type",)}
        current = nxt
    raise HttpError(f"{safetext.redact_url(url)} redirected more than {redirects} times")


@dataclass(frozen=True)
class Response:
    url: str
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return decode_json(self.body, self.url)

    def snippet(self, limit: int = 200) -> str:
        """The body as one short, safe line (for an error message)."""
        return safetext.one_line(self.body[: limit * 4].decode("utf-8", errors="replace"), limit)


def request(method: str, url: str, **kwargs: Any) -> Response:
    """One whole exchange (open_url's arguments): status, headers and the body, bounded."""
    exchange = open_url(method, url, **kwargs)
    try:
        body = exchange.read()
    finally:
        exchange.close()
    return Response(url=exchange.url, status=exchange.status, headers=exchange.headers, body=body)


def status_and_body(
    url: str,
    *,
    deadline_s: float,
    max_bytes: int,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    body: Any = None,
    **kwargs: Any,
) -> tuple[int, bytes]:
    """Status and body of one exchange within deadline_s (connecting within 10 s of it), the body
    within max_bytes: the look kit/health/observe.py and the bundle's watch.py take at a server."""
    limits = DEFAULT.but(total_s=deadline_s, connect_s=min(deadline_s, 10.0), body_bytes=max_bytes)
    answer = request(method, url, headers=headers, json_body=body, limits=limits, **kwargs)
    return answer.status, answer.body
