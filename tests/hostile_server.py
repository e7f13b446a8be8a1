"""A scripted hostile HTTP server on loopback (issue 27): one misbehaviour per URL prefix, for
the tests that drive kit's clients (query, bench, metrics, the status probes, fetch) against it.

`http://127.0.0.1:PORT/<behaviour>/...`: the first path segment picks what the server does to
the request; the rest of the path is the API route kit asks for. Behaviours act on the route
they are about (the chat completion, /v1/models, /metrics, a Hub file); the other routes of the
same prefix answer as a normal vLLM would, so kit reaches the one under test. Every endless
behaviour also stops on its own after `max_s` seconds (a test that fails does not leave it
running) and as soon as kit closes the connection.

A raw socket server, not http.server: a hostile server writes what no well-behaved library
would (a byte a second of headers, a body longer than it says, a gzip bomb).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

MODEL = "tiny"
# What a well-behaved vLLM answers, for the routes a behaviour leaves alone.
MODELS = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
CHAT = {
    "id": "c1",
    "object": "chat.completion",
    "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}
COMPLETION = {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;cHduZWQ=\x07\u202eevil\x9b31m"


def _head(status: str, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def answer(doc: Any, status: str = "200 OK", content_type: str = "application/json") -> bytes:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return _head(status, {"Content-Type": content_type, "Content-Length": str(len(body))}) + body


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(doc: Any) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


class Request:
    def __init__(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        self.method, self.path, self.headers, self.body = method, path, headers, body


Behaviour = Callable[["HostileServer", Request], Iterator[bytes]]


class HostileServer:
    """`with HostileServer() as server:` ... `server.url("gzip-bomb")` is the base URL of one
    behaviour. `seen` keeps the requests (method, path, headers) in arrival order."""

    def __init__(self, max_s: float = 30.0) -> None:
        self.max_s = max_s
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen: list[Request] = []
        self.closing = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        # A gzip stream that inflates to about 1 GiB of zeros, made once (~1 MB).
        self._bomb: bytes | None = None

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.sock.close()

    def url(self, behaviour: str) -> str:
        return f"http://127.0.0.1:{self.port}/{behaviour}"

    # ---- the server
    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                request = self._read(conn)
                if request is None:
                    return
                self.seen.append(request)
                end = time.monotonic() + self.max_s
                for piece in self._respond(request):
                    if self.closing.is_set() or time.monotonic() > end:
                        return
                    if piece:
                        conn.sendall(piece)
            except OSError:
                return  # kit closed the connection: what a bounded client does

    def _read(self, conn: socket.socket) -> Request | None:
        data = b""
        while b"\r\n\r\n" not in data:
            piece = conn.recv(65536)
            if not piece:
                return None
            data += piece
        head, _, rest = data.partition(b"\r\n\r\n")
        line, *lines = head.decode("latin-1").split("\r\n")
        method, path, _ = line.split(" ", 2)
        headers = {}
        for item in lines:
            name, _, value = item.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            piece = conn.recv(65536)
            if not piece:
                break
            rest += piece
        return Request(method, path, headers, rest[:length])

    def _respond(self, request: Request) -> Iterator[bytes]:
        _, behaviour, route = (request.path.split("?")[0] + "/").split("/", 2)
        route = "/" + route.rstrip("/")
        handler = BEHAVIOURS.get(behaviour)
        if handler is None:
            yield answer({"error": "no such behaviour"}, "404 Not Found")
            return
        targets = TARGETS.get(behaviour, ("/v1/chat/completions",))
        if any(route.startswith(t) for t in targets):
            yield from handler(self, request)
        else:
            yield from normal(request, route)

    def bomb(self) -> bytes:
        """A gzip stream that inflates to 1 GiB of zeros (~1 MB): the header, then one MiB of
        zeros compressed and fully flushed (which resets the window, so the same bytes follow
        each other) 1024 times. No trailer: nobody should read that far."""
        if self._bomb is None:
            packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
            first = packer.compress(bytes(1 << 20)) + packer.flush(zlib.Z_FULL_FLUSH)
            again = packer.compress(bytes(1 << 20)) + packer.flush(zlib.Z_FULL_FLUSH)
            self._bomb = first + again * 1023
        return self._bomb


def normal(request: Request, route: str) -> Iterator[bytes]:
    """A well-behaved vLLM's answer to the routes a behaviour leaves alone."""
    if route.startswith("/v1/models"):
        yield answer(MODELS)
    elif route.startswith("/v1/chat/completions"):
        yield answer(CHAT)
    elif route.startswith("/v1/completions"):
        yield answer(COMPLETION)
    elif route.startswith("/health"):
        yield answer(b"", content_type="text/plain")
    elif route.startswith("/metrics"):
        yield answer(b'vllm:num_requests_running{engine="0"} 0\n', content_type="text/plain")
    else:
        yield answer({"error": "not found"}, "404 Not Found")


def zeros_forever(size: int = 1 << 20) -> Iterator[bytes]:
    block = bytes(size)
    while True:
        yield block


# ---- the behaviours ---------------------------------------------------------------------------


def html(server: HostileServer, request: Request) -> Iterator[bytes]:
    yield answer(b"<!doctype html><html><body>Bad Gateway</body></html>", content_type="text/html")


def json_list(server: HostileServer, request: Request) -> Iterator[bytes]:
    yield answer([1, 2, 3])


def empty_choices(server: HostileServer, request: Request) -> Iterator[bytes]:
    yield answer({**CHAT, "choices": []})


def wrong_types(server: HostileServer, request: Request) -> Iterator[bytes]:
    yield answer({**CHAT, "choices": ["not an object"]})


def usage_string(server: HostileServer, request: Request) -> Iterator[bytes]:
    yield answer({**CHAT, "usage": {"prompt_tokens": 3, "completion_tokens": "many"}})


def not_utf8(server: HostileServer, request: Request) -> Iterator[bytes]:
    yield answer(b'{"choices": "\xff\xfe\xfd"}')


def deep_json(server: HostileServer, request: Request) -> Iterator[bytes]:
    yield answer(b"[" * 100_000 + b"]" * 100_000)


def gib_body(server: HostileServer, request: Request) -> Iterator[bytes]:
    """Says 1 GiB with Content-Length and sends it, as fast as kit reads."""
    yield _head("200 OK", {"Content-Type": "application/json", "Content-Length": str(1 << 30)})
    yield from zeros_forever()


def gib_unannounced(server: HostileServer, request: Request) -> Iterator[bytes]:
    """1 GiB and more with no length: the body ends when the connection does."""
    yield _head("200 OK", {"Content-Type": "application/json", "Connection": "close"})
    yield from zeros_forever()


def endless_chunked(server: HostileServer, request: Request) -> Iterator[bytes]:
    yield _head("200 OK", {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    block = _chunk(b" " * 65536)
    while True:
        yield block


def gzip_bomb(server: HostileServer, request: Request) -> Iterator[bytes]:
    bomb = server.bomb()
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip", "Content-Length": str(len(bomb))}
    yield _head("200 OK", headers) + bomb


def endless_sse(server: HostileServer, request: Request) -> Iterator[bytes]:
    """Valid deltas, one token each, for ever: past any max_tokens."""
    yield _head("200 OK", {"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked"})
    delta = _chunk(_event({"choices": [{"index": 0, "delta": {"content": " w"}, "finish_reason": None}]}))
    while True:
        yield delta * 64


def endless_sse_line(server: HostileServer, request: Request) -> Iterator[bytes]:
    """One `data:` line that never ends."""
    yield _head("200 OK", {"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked"})
    yield _chunk(b'data: {"choices": [{"delta": {"content": "')
    block = _chunk(b"a" * 65536)
    while True:
        yield block


def drip_headers(server: HostileServer, request: Request) -> Iterator[bytes]:
    """Headers a byte a second (every read gets a byte: a per-read timeout never fires)."""
    yield b"H"
    for byte in b"TTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100_000:
        time.sleep(1.0)
        yield bytes([byte])


def echo_auth_500(server: HostileServer, request: Request) -> Iterator[bytes]:
    """A 500 whose body echoes what kit sent: its Authorization header (the API key)."""
    echoed = {"error": f"upstream failed for Authorization: {request.headers.get('authorization')}"}
    yield answer(echoed, "500 Internal Server Error")


def escapes(server: HostileServer, request: Request) -> Iterator[bytes]:
    """Terminal escape sequences in the answer and in the model id."""
    yield answer({**CHAT, "model": ESCAPES, "choices": [{**CHAT["choices"][0], "message": {"content": ESCAPES}}]})


def escapes_models(server: HostileServer, request: Request) -> Iterator[bytes]:
    yield answer({"data": [{"id": ESCAPES}]})


FLOOD = b"".join(f'x{{a="{i}",b="{i}",c="{i}"}} 1\n'.encode() for i in range(400_000))


def metrics_flood(server: HostileServer, request: Request) -> Iterator[bytes]:
    """A metrics page of 400,000 tiny distinct series (12 MB, under the byte cap): every one
    a parser keeps costs it hundreds of bytes."""
    yield answer(FLOOD, content_type="text/plain")


def metrics_nan(server: HostileServer, request: Request) -> Iterator[bytes]:
    """A well-formed page whose gauges are NaN and +Inf (Prometheus allows them)."""
    page = (
        'vllm:num_requests_running{engine="0"} NaN\n'
        'vllm:num_requests_waiting{engine="0"} +Inf\n'
        'vllm:kv_cache_usage_perc{engine="0"} NaN\n'
        'vllm:generation_tokens_total{engine="0"} 1\n'
    )
    yield answer(page.encode(), content_type="text/plain")


def probe_hang(server: HostileServer, request: Request) -> Iterator[bytes]:
    time.sleep(server.max_s)
    yield b""


BEHAVIOURS: dict[str, Behaviour] = {
    "html": html,
    "json-list": json_list,
    "empty-choices": empty_choices,
    "wrong-types": wrong_types,
    "usage-string": usage_string,
    "not-utf8": not_utf8,
    "deep-json": deep_json,
    "gib-body": gib_body,
    "gib-unannounced": gib_unannounced,
    "endless-chunked": endless_chunked,
    "gzip-bomb": gzip_bomb,
    "endless-sse": endless_sse,
    "endless-sse-line": endless_sse_line,
    "drip-headers": drip_headers,
    "echo-auth-500": echo_auth_500,
    "escapes": escapes,
    "models-html": html,
    "models-escapes": escapes_models,
    "models-drip": drip_headers,
    "metrics-flood": metrics_flood,
    "metrics-bomb": gzip_bomb,
    "metrics-drip": drip_headers,
    "metrics-gib": gib_unannounced,
    "metrics-nan": metrics_nan,
    "probe-hang": probe_hang,
    "probe-html": html,
}
# Which route each behaviour is about (the chat completion when not listed).
TARGETS: dict[str, tuple[str, ...]] = {
    **{name: ("/v1/models",) for name in BEHAVIOURS if name.startswith("models-")},
    **{name: ("/metrics",) for name in BEHAVIOURS if name.startswith("metrics-")},
    **{name: ("/v1/completions",) for name in BEHAVIOURS if name.startswith("probe-")},
}
# The CDN half of a Hub: any file path under these prefixes gets the behaviour.
for _name in ("gib-body", "gib-unannounced", "endless-chunked", "gzip-bomb", "drip-headers"):
    TARGETS[f"cdn-{_name}"] = ("/",)
    BEHAVIOURS[f"cdn-{_name}"] = BEHAVIOURS[_name]
