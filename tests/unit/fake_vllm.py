"""A stand-in vLLM API server for unit tests (stdlib http.server in a thread): /metrics serves
real recorded scrapes (tests/fixtures/metrics/), /health, /v1/completions; misbehaves on demand
(too big, trickling, hanging, erroring). Used by test_observe.py and test_metrics_cli.py."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
SCRAPE = FIXTURES / "vllm-0.32.0-cpu-dp2-after-32-requests.prom"


class FakeServer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    metrics_body: ClassVar[bytes] = SCRAPE.read_bytes()
    metrics_status: ClassVar[int] = 200
    health_status: ClassVar[int] = 200
    trickle_s: ClassVar[float] = 0.0  # > 0: /metrics sends one line every trickle_s seconds
    completion_delay_s: ClassVar[float] = 0.0
    completion_status: ClassVar[int] = 200
    completion_body: ClassVar[dict[str, Any]] = {"choices": [{"text": "C", "finish_reason": "length"}]}
    key: ClassVar[str] = "sk-first"
    seen: ClassVar[list[dict[str, str]]] = []
    pages: ClassVar[list[bytes]] = []  # when set, /metrics answers these in turn (the last repeats)

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client gave up (deadline tests): nothing to tell
            self.wfile.write(body)

    def do_GET(self) -> None:
        cls = type(self)
        if self.path == "/health":
            self._send(cls.health_status, b"")
        elif self.path == "/metrics" and cls.trickle_s:
            self.send_response(200)
            self.send_header("Content-Length", str(len(cls.metrics_body)))
            self.end_headers()
            with contextlib.suppress(OSError):
                for line in cls.metrics_body.splitlines(keepends=True):
                    self.wfile.write(line)
                    self.wfile.flush()
                    time.sleep(cls.trickle_s)
        elif self.path == "/metrics":
            body = (cls.pages.pop(0) if len(cls.pages) > 1 else cls.pages[0]) if cls.pages else cls.metrics_body
            self._send(cls.metrics_status, body)
        else:
            self._send(404, b"not found")

    def do_POST(self) -> None:
        cls = type(self)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls.seen.append({**{k: v for k, v in self.headers.items()}, "body": json.dumps(body)})
        if self.headers.get("Authorization") != f"Bearer {cls.key}":
            self._send(401, b'{"error": "Unauthorized"}', "application/json")
            return
        time.sleep(cls.completion_delay_s)
        self._send(cls.completion_status, json.dumps(cls.completion_body).encode(), "application/json")


DEFAULTS = (
    "metrics_body",
    "metrics_status",
    "health_status",
    "trickle_s",
    "completion_delay_s",
    "completion_status",
    "completion_body",
    "key",
)


@contextlib.contextmanager
def serving(pages: list[bytes] | None = None) -> Iterator[str]:
    """Serve FakeServer on a free loopback port with its defaults restored; `pages`: the /metrics
    answers in order (the last one repeats)."""
    saved = {name: getattr(FakeServer, name) for name in DEFAULTS}
    FakeServer.pages = list(pages or [])
    FakeServer.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        for name, value in saved.items():
            setattr(FakeServer, name, value)
