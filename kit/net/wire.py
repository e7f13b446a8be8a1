"""HTTP/1.1 as it comes over the wire (issue 27), standard library only: the bounds of one
exchange (Limits), the incremental response parser and the event-stream reader. Fed bytes by
kit/net/http.py (blocking sockets, a deadline per exchange) and by kit bench's event loop
(kit/bench/client.py): both read every answer the same way, within the same bounds.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kit.safe import text as safetext

_CONTENT_LENGTH = re.compile(r"[0-9]{1,19}\Z")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}\Z")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_MAX_INTERIM = 8  # 100 Continue and friends before the real answer
DECODE_STEP = 1 << 20  # inflated bytes one feed() or drain() returns at most


@dataclass(frozen=True)
class Limits:
    """The bounds of one exchange (see the module docstring)."""

    connect_s: float = 10.0
    total_s: float = 60.0
    head_bytes: int = 64 * 1024
    header_count: int = 100
    line_bytes: int = 64 * 1024
    body_bytes: int = 4 * 1024 * 1024

    def but(self, **changes: Any) -> Limits:
        return replace(self, **changes)


DEFAULT = Limits()


class ProtocolError(ValueError):
    """The answer is not HTTP/1.1 as kit reads it, or it breaks a bound. The text completes a
    sentence that starts with the URL ("http://x/v1/models sent more than ...")."""


class ConnectionLost(ConnectionError):
    """The connection closed or broke before the response was complete."""


# ------------------------------------------------------------------------------ the parser


class ResponseParser:
    """One HTTP/1.1 response, fed as it arrives: `feed` returns the body bytes (de-chunked,
    decoded) each piece completes; `status` and `headers` are set once the head is in, `done`
    once the body is. Every bound of `limits` but the deadlines is checked here."""

    def __init__(self, limits: Limits = DEFAULT, *, head_only: bool = False) -> None:
        self.limits = limits
        self.head_only = head_only  # the answer to HEAD or CONNECT: no body follows its head
        self.status: int | None = None
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.done = False
        self.keep_alive = False  # the connection may carry the next request (when done)
        self.received = 0  # bytes of the answer so far, as sent
        self.decoded = 0  # bytes of the body so far, as returned
        self._buf = bytearray()
        self._mode = "head"  # head, size, data, crlf, trailer, length, close
        self._left = 0
        self._decoder: Any = None
        self._tail = b""  # compressed input not inflated yet (drain)
        self._flush_due = False
        self._interim = 0
        self._trailers = 0

    def feed(self, data: bytes) -> bytes:
        self.received += len(data)
        if self.done:
            self.keep_alive = False  # bytes after the end: the connection is out of step
            return b""
        if not self._buf and self._mode in ("length", "close"):
            return self._direct(data)  # the common large body: no copy through the buffer
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
                    raise ProtocolError("sent a chunk that does not end in CRLF")
                del buf[:2]
                self._mode = "size"
            else:
                line = self._line(mode)
                if line is None:
                    break
                if mode == "head":
                    self._head(line)
                elif mode == "size":
                    self._size(line)
                elif not line:  # trailer: an empty line ends the body
                    self._finish()
                else:
                    self._trailers += 1
                    if self._trailers > self.limits.header_count:
                        raise ProtocolError(f"sent more than {self.limits.header_count} trailer lines")
        return self._decode(b"".join(out))

    def end(self) -> bytes:
        """The connection closed: the rest of a body that ends there; raises ConnectionLost
        when the answer was cut short."""
        if self._mode == "close" and not self.done:
            self.done = True
            return self._decode(b"", flush=True)
        if self.done:
            return b""
        if self.received == 0:
            raise ConnectionLost("connection closed before the response")
        raise ConnectionLost("connection broken mid-response")

    def _direct(self, data: bytes) -> bytes:
        if self._mode == "close":
            return self._decode(data)
        take = data[: self._left]
        self._left -= len(take)
        if self._left == 0:
            self._finish()
            if len(take) < len(data):
                self._buf += data[len(take) :]
                self.keep_alive = False
        return self._decode(take)

    def _line(self, mode: str) -> bytes | None:
        head = mode == "head"
        end = b"\r\n\r\n" if head else b"\r\n"
        at = self._buf.find(end)
        limit = self.limits.head_bytes if head else self.limits.line_bytes
        if at < 0:
            if len(self._buf) > limit:
                raise ProtocolError(
                    f"sent a header section over {limit} bytes" if head else f"sent a line over {limit} bytes"
                )
            return None
        if at > limit:
            raise ProtocolError(
                f"sent a header section over {limit} bytes" if head else f"sent a line over {limit} bytes"
            )
        line = bytes(self._buf[:at])
        del self._buf[: at + len(end)]
        return line

    def _head(self, head: bytes) -> None:
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not (len(code) == 3 and code.isascii() and code.isdigit()):
            raise ProtocolError(f"is not an HTTP server (it answered {safetext.one_line(status_line, 40)!r})")
        if len(lines) > self.limits.header_count:
            raise ProtocolError(f"sent more than {self.limits.header_count} headers")
        headers: dict[str, str] = {}
        for line in lines:
            name, sep, value = line.partition(":")
            key = name.strip().lower()
            if not sep or not _TOKEN.match(key):
                raise ProtocolError(f"sent a malformed header line {safetext.one_line(line, 40)!r}")
            value = value.strip()
            if key == "content-length" and key in headers and headers[key] != value:
                raise ProtocolError("sent two different Content-Length headers")
            headers[key] = f"{headers[key]}, {value}" if key in headers and key != "content-length" else value
        status = int(code)
        if 100 <= status < 200:  # 100 Continue and friends: the real answer follows
            self._interim += 1
            if self._interim > _MAX_INTERIM:
                raise ProtocolError(f"sent more than {_MAX_INTERIM} interim (1xx) answers")
            return
        self.status, self.reason, self.headers = status, safetext.one_line(reason, 80), headers
        connection = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        self.keep_alive = version == "HTTP/1.1" and "close" not in connection
        self._body_framing(status, headers)

    def _body_framing(self, status: int, headers: Mapping[str, str]) -> None:
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("gzip", "x-gzip"):
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._decoder = zlib.decompressobj()
        elif encoding not in ("identity", ""):
            raise ProtocolError(
                f"sent a body encoded as {safetext.one_line(encoding, 20)!r} "
                "(kit asks for identity and reads only gzip and deflate besides)"
            )
        coding = [t.strip().lower() for t in headers.get("transfer-encoding", "").split(",") if t.strip()]
        if self.head_only or status in (204, 304):
            self._finish()
        elif coding:
            if coding != ["chunked"]:
                raise ProtocolError(f"sent Transfer-Encoding {safetext.one_line(', '.join(coding), 30)!r}")
            self._mode = "size"
        elif "content-length" in headers:
            text = headers["content-length"]
            if not _CONTENT_LENGTH.match(text):
                raise ProtocolError(f"sent Content-Length {safetext.one_line(text, 20)!r}, not a byte count")
            self._left = int(text)
            if self._decoder is None and self._left > self.limits.body_bytes:
                raise ProtocolError(f"announced {self._left} bytes, more than the {self.limits.body_bytes} kit reads")
            self._mode = "length"
            if self._left == 0:
                self._finish()
        else:
            self._mode = "close"
            self.keep_alive = False

    def _size(self, line: bytes) -> None:
        text = line.split(b";", 1)[0].strip()
        if not _CHUNK_SIZE.match(text):
            raise ProtocolError(f"sent a malformed chunk size {safetext.one_line(text[:20].decode('latin-1'))!r}")
        size = int(text, 16)
        self._left, self._mode = size, ("data" if size else "trailer")

    def _finish(self) -> None:
        self.done = True
        if self._buf:
            self.keep_alive = False

    @property
    def pending(self) -> bool:
        """Compressed bytes wait to be inflated: call drain() (feed returns at most DECODE_STEP
        bytes of inflated body per call, so a bomb never lands in memory at once)."""
        return bool(self._tail)

    def drain(self) -> bytes:
        """The next DECODE_STEP (at most) of a compressed body already received."""
        return self._decode(b"", flush=self._flush_due) if self._tail else b""

    def _decode(self, data: bytes, flush: bool = False) -> bytes:
        room = self.limits.body_bytes - self.decoded
        if self._decoder is None:
            out = data
        else:
            self._flush_due = self._flush_due or flush or self.done
            try:
                # max_length: at most one step at a time, and a bomb inflates at most one byte
                # past the bound before it is seen
                src = self._tail + data if self._tail else data
                out = self._decoder.decompress(src, min(room + 1, DECODE_STEP)) if src else b""
                self._tail = self._decoder.unconsumed_tail
                if self._flush_due and not self._tail:
                    out += self._decoder.flush()
            except zlib.error:
                raise ProtocolError("sent a compressed body that does not decode") from None
            if len(out) > room:
                raise ProtocolError(f"sent more than {self.limits.body_bytes} bytes once decompressed")
        if len(out) > room:
            raise ProtocolError(f"sent more than {self.limits.body_bytes} bytes")
        self.decoded += len(out)
        return out


# ------------------------------------------------------------------------------ event streams


class SSEReader:
    """Server-sent events from body bytes: `feed` returns the `data:` payload of each event
    complete so far (comments and other fields skipped), as vLLM's client reads them. A line
    longer than `max_line` bytes is a ProtocolError: the buffer never grows past it."""

    def __init__(self, max_line: int = DEFAULT.line_bytes) -> None:
        self.max_line = max_line
        self._buf = b""
        self._data: list[str] = []

    def feed(self, body: bytes) -> list[str]:
        buf = self._buf + body if self._buf else body
        out: list[str] = []
        start = 0
        while True:
            at = buf.find(b"\n", start)
            if at < 0:
                break
            self._line(buf[start:at], out)
            start = at + 1
        self._buf = buf[start:]
        if len(self._buf) > self.max_line:
            raise ProtocolError(f"sent an event-stream line over {self.max_line} bytes")
        return out

    def end(self) -> list[str]:
        out: list[str] = []
        if self._buf:
            self._line(self._buf, out)
            self._buf = b""
        self._line(b"", out)
        return out

    def _line(self, raw: bytes, out: list[str]) -> None:
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if not line:
            if self._data:
                out.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(b"data:"):
            try:
                text = line[5:].decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError("sent an event that is not UTF-8 text") from None
            self._data.append(text[1:] if text.startswith(" ") else text)
            if sum(len(d) for d in self._data) > self.max_line:
                raise ProtocolError(f"sent an event over {self.max_line} bytes")
