"""The supervisor's coordinator as a network service (issue 27): the real Coordinator on
loopback (its control server, its loop, its files; the API it watches is a function, as in
test_supervise_control.py) under idle, half-sent and malformed connections. It still answers an
authorised request at once, and it keeps supervising (state.json keeps being rewritten) even
while it cannot write its state."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kit.health.liveness import EngineSample, Observation, Probe
from kit.supervise import protocol
from kit.supervise.coordinator import Coordinator, CoordinatorConfig
from kit.supervise.policy import Settings

TOKEN = "s3cret-token"
CAP, REQUEST_S = 4, 0.5


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[tuple[Coordinator, int, list[str]]]:
    settings = Settings(
        nodes=("head",),
        engines=("0",),
        liveness_s=5,
        ready_s=30,
        max_restarts=1,
        backoff_s=1,
        stable_s=300,
        node_wait_s=300,
    )
    config = CoordinatorConfig(
        directory=str(tmp_path),
        host="127.0.0.1",
        port=0,
        token=TOKEN,
        api_url="http://127.0.0.1:9",
        model="tiny",
        api_key_path=None,
        settings=settings,
        interval_s=0.1,
    )
    lines: list[str] = []
    coord = Coordinator(
        config,
        observe=lambda: Observation(time.monotonic(), {"0": EngineSample(0, 0, 0)}),
        probe=lambda engine: Probe(time.monotonic(), engine, None, 0.01),
        out=lines.append,
        max_connections=CAP,
        request_s=REQUEST_S,
    )
    stop = threading.Event()
    thread = threading.Thread(target=coord.run, args=(stop,), daemon=True)
    thread.start()
    assert coord.listening.wait(10)
    yield coord, int(coord.bound[1]), lines
    stop.set()
    thread.join(10)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def exchange(port: int, raw: bytes) -> tuple[int, dict[str, Any]]:
    """Send raw bytes, read the whole answer: (status, JSON body)."""
    with connect(port) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body or b"{}")


def request(method: str, path: str, body: bytes = b"", token: str = TOKEN, **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: x", f"{protocol.TOKEN_HEADER}: {token}"]
    if body or method == "POST":
        lines.append(f"Content-Length: {headers.pop('length', len(body))}")
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closed `sock` (AssertionError past `seconds`)."""
    start = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        raise AssertionError(f"still open after {seconds} s") from None
    except OSError:
        pass
    return time.monotonic() - start


def state_stamp(directory: Path) -> float:
    return float(json.loads((directory / "state.json").read_text())["updated_ts"])


def test_idle_and_half_sent_connections_hold_nothing_for_long(
    coordinator: tuple[Coordinator, int, list[str]], tmp_path: Path
) -> None:
    coord, port, _ = coordinator
    # More idle connections than the cap: those over it are closed at once, the rest at REQUEST_S.
    idle = [connect(port) for _ in range(CAP + 6)]
    half = connect(port)
    half.sendall(request("POST", "/v1/report", b'{"node": "he', length="100"))  # never finished
    times = [closed_within(sock, REQUEST_S + 3) for sock in [*idle, half]]
    assert coord.server is not None
    assert max(times) < REQUEST_S + 2 and coord.server.refused >= 6
    for sock in [*idle, half]:
        sock.close()
    # A request sent a byte at a time, slower than the deadline, is cut at it.
    drip = connect(port)
    start = time.monotonic()
    with pytest.raises(OSError):
        for byte in request("GET", "/v1/status"):
            drip.sendall(bytes([byte]))
            time.sleep(0.2)
            if time.monotonic() - start > REQUEST_S + 3:
                raise AssertionError("a dripped request was not cut")
    drip.close()
    assert coord.server.expired >= 1  # each read got its byte in time: the connection's deadline cut it
    # It still answers an authorised request, and it still supervises.
    before = state_stamp(tmp_path)
    assert exchange(port, request("GET", "/v1/status"))[0] == 200
    time.sleep(0.5)
    assert state_stamp(tmp_path) > before


@pytest.mark.parametrize(
    ("raw", "status", "why"),
    [
        (request("POST", "/v1/report", b"{}", token="wrong"), 401, "missing or wrong token"),
        (request("GET", "/v1/status", token=""), 401, "missing or wrong token"),
        (request("POST", "/v1/report", b"", length="-1"), 400, "Content-Length is not a byte count"),
        (request("POST", "/v1/report", b"", length="1e3"), 400, "Content-Length is not a byte count"),
        (request("POST", "/v1/report", b"", length=str(10**12)), 400, "body over 65536 bytes"),
        (request("POST", "/v1/report", b"[" * 5000 + b"]" * 5000), 400, "nested deeper than 8 levels"),
        (request("POST", "/v1/report", b'{"node": NaN}'), 400, "body is not JSON"),
        (request("POST", "/v1/report", b"\xff\xfe"), 400, "body is not JSON"),
        (request("POST", "/v1/report", b"0\r\n\r\n", Transfer_Encoding="chunked"), 400, "not Transfer-Encoding"),
        (request("POST", "/v1/stop", b"[]"), 400, "not a JSON object"),
    ],
    ids=[
        "token",
        "no-token",
        "negative-length",
        "float-length",
        "huge-length",
        "deep",
        "nan",
        "bytes",
        "chunked",
        "list",
    ],
)
def test_malformed_requests_are_refused_in_one_answer(
    coordinator: tuple[Coordinator, int, list[str]], raw: bytes, status: int, why: str
) -> None:
    _, port, _ = coordinator
    start = time.monotonic()
    code, doc = exchange(port, raw)
    assert (code, why in doc["error"]) == (status, True), doc
    assert time.monotonic() - start < REQUEST_S + 1
    assert exchange(port, request("GET", "/v1/status"))[0] == 200


def test_it_keeps_supervising_while_it_cannot_write_its_state(
    coordinator: tuple[Coordinator, int, list[str]], tmp_path: Path
) -> None:
    """state.json cannot be replaced (a folder in its place: what a full disk or an exhausted
    descriptor table does to a write, on any file system): one line says so, the loop goes on,
    and once the file can be written again it is."""
    coord, port, lines = coordinator
    state = tmp_path / "state.json"
    time.sleep(0.3)
    while not state.is_dir():  # the coordinator rewrites the file every 0.1 s: take its place
        with contextlib.suppress(FileNotFoundError):
            state.unlink()
        with contextlib.suppress(FileExistsError):
            state.mkdir()
    (state / "keep").write_text("x")  # a non-empty folder: rename over it fails
    time.sleep(0.5)
    assert sum("cannot write state.json" in line for line in lines) == 1, lines  # said once
    assert exchange(port, request("GET", "/v1/status"))[0] == 200
    (state / "keep").unlink()
    state.rmdir()
    end = time.monotonic() + 5
    while not state.is_file() and time.monotonic() < end:
        time.sleep(0.05)
    assert state.is_file() and json.loads(state.read_text())["phase"] == coord.state.phase
