"""A small real HTTP server that streams chat completions like vLLM (SSE, usage last) for the
bench runner's and client's unit tests (tests/unit/test_bench.py, test_bench_client.py): a fake
because these tests control each token's timing and failure; the real vLLM runs in
tests/integration."""

from __future__ import annotations

import _thread
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class FakeVLLM(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as uvicorn does; else delayed ACKs bundle the chunks
    key = "sk-test"
    token_delay = 0.005
    die_after: int | None = None
    served = 0
    # False: no chunked encoding, the body ends when the connection closes (some proxies and
    # gateways stream SSE like that); the client must still see each event as it arrives.
    chunked = True
    interrupt_at: int | None = None  # Ctrl-C in the test's main thread when this request arrives
    die_mid_stream = False  # with die_after: drop the connection after two tokens, not before answering
    first_delay = 0.0  # headers and an SSE comment at once, the first chunk with choices this much later
    stall: str | None = None  # "before-answer": never answers; "after-headers": headers, then nothing
    length_body = False  # the whole stream as one Content-Length body (a buffering proxy)
    peers: set[tuple[str, int]] = set()  # noqa: RUF012 (the client's connections, by their address)

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, code: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {self.key}":
            self._json(401, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self) -> None:
        if self.path == "/version":
            self._json(200, {"version": "0.32.0-fake"})
        elif self._authorized():
            self._json(200, {"data": [{"id": "tiny"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not self._authorized():
            return
        cls = type(self)
        cls.served += 1
        cls.peers.add(self.client_address)
        if cls.stall:
            if cls.stall == "after-headers":
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
            time.sleep(2)
            self.close_connection = True
            return
        if cls.length_body:
            n = body["max_completion_tokens"]
            events = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}]
            events += [{"choices": [{"delta": {"content": " w"}}]}] * n
            events += [{"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": n}}]
            raw = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return
        if cls.served == cls.interrupt_at:
            _thread.interrupt_main()
        dies = cls.die_after is not None and cls.served > cls.die_after
        if dies and not cls.die_mid_stream:
            self.connection.shutdown(socket.SHUT_RDWR)  # the server is gone: connections drop
            self.close_connection = True
            return
        n = body["max_completion_tokens"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if cls.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()

        def send(data: str) -> None:
            raw = f"data: {data}\n\n".encode()
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n" if cls.chunked else raw)
            self.wfile.flush()

        if cls.first_delay:
            self.wfile.write(b"8\r\n: ping\n\n\r\n" if cls.chunked else b": ping\n\n")
            self.wfile.flush()
            time.sleep(cls.first_delay)
        send(json.dumps({"choices": [{"delta": {"role": "assistant", "content": ""}}]}))
        for i in range(n):
            time.sleep(self.token_delay)
            if dies and i == 2:
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            send(json.dumps({"choices": [{"delta": {"content": " w"}}]}))
        send(json.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": n}}))
        send("[DONE]")
        if cls.chunked:
            self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def fake_server() -> Iterator[str]:
    FakeVLLM.served = 0
    FakeVLLM.die_after = None
    FakeVLLM.chunked = True
    FakeVLLM.token_delay = 0.005
    FakeVLLM.interrupt_at = None
    FakeVLLM.die_mid_stream = False
    FakeVLLM.first_delay = 0.0
    FakeVLLM.stall = None
    FakeVLLM.length_body = False
    FakeVLLM.peers = set()
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVLLM)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens once it is closed
