"""The coordinator's HTTP server (standard library only, in the supervise bundle), hardened for
the cluster network it listens on (issue 27): at most MAX_CONNECTIONS connections at once (more
are closed as they arrive, before a thread is spent on them), and each connection closed
REQUEST_S seconds after it was accepted, whatever it sent: an idle client, a request sent a
byte at a time or one that never ends holds a slot for seconds, never the coordinator.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_CONNECTIONS = 32  # agents hold one at a time each; kit's host side and the launcher a few more
REQUEST_S = 5.0  # one connection's whole life: request line, headers, body and the answer


class ControlServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a cap on connections and a deadline for each (see the module
    docstring): what a client on the cluster network can hold is MAX_CONNECTIONS connections
    for REQUEST_S seconds, never the coordinator."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        max_connections: int = MAX_CONNECTIONS,
        request_s: float = REQUEST_S,
    ) -> None:
        super().__init__(address, handler)
        self.max_connections, self.request_s = max_connections, request_s
        self.refused = 0  # connections closed at once, over the cap
        self.expired = 0  # connections cut at their deadline
        self._open: dict[socket.socket, float] = {}
        self._open_lock = threading.Lock()
        self._closing = threading.Event()
        threading.Thread(target=self._reap, daemon=True, name="kit-control-reaper").start()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            full = len(self._open) >= self.max_connections
            if not full:
                self._open[request] = time.monotonic() + self.request_s
        if full:
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that broke its connection or sent nonsense: its problem, no traceback."""
        return

    def server_close(self) -> None:
        self._closing.set()
        super().server_close()

    def _forget(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(request, None)

    def _reap(self) -> None:
        while not self._closing.wait(0.1):
            now = time.monotonic()
            with self._open_lock:
                late = [sock for sock, end in self._open.items() if end <= now]
                for sock in late:
                    self._open[sock] = now + 3600  # shut down once; its thread forgets it
            for sock in late:
                self.expired += 1
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # the handler's blocked read returns at once
