"""kit bench's HTTP client (kit/bench/client.py) and the runner on it (issue 21): the response
parser on answers cut into any pieces, arrival stamps (not parse times), keep-alive, and the
runner against loopback servers: first token, deadline, 401, a lost server, timeouts, a body
framed by Content-Length."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
from typing import Any

import pytest

from kit.bench import dataset, schedule
from kit.bench.client import Connection, ConnectionLost, Endpoint, ProtocolError, ResponseParser, new_event_loop
from kit.bench.metrics import RequestRecord, compute
from kit.bench.runner import BUDGET_STOP, Runner, Target
from tests.unit.fake_stream import FakeVLLM, closed_port_url

ALL = schedule.LoadPoint(float("inf"), 1)


def feed_bytewise(parser: ResponseParser, raw: bytes) -> bytes:
    return b"".join(parser.feed(raw[i : i + 1]) for i in range(len(raw)))


def sse(*docs: Any) -> bytes:
    return b"".join(b"data: " + (d if isinstance(d, bytes) else json.dumps(d).encode()) + b"\n\n" for d in docs)


def frame(part: bytes) -> bytes:
    return f"{len(part):x}\r\n".encode() + part + b"\r\n"


def chunked(*parts: bytes) -> bytes:
    return b"".join(f"{len(p):x};ext=1\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\nX-Trailer: t\r\n\r\n"


# ---------------------------------------------------------------- the parser


def test_chunked_answer_in_one_byte_pieces() -> None:
    body = [sse({"choices": [{"delta": {"content": "é"}}]}), sse(b"[DONE]")]
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(*body)
    parser = ResponseParser()
    assert feed_bytewise(parser, raw) == b"".join(body)
    assert parser.status == 200 and parser.done and parser.keep_alive
    assert parser.end() == b""


def test_length_close_and_gzip_bodies() -> None:
    data = sse({"choices": []}) * 3
    length = ResponseParser()
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(data)}\r\n\r\n".encode()
    assert length.feed(head + data[:10]) == data[:10] and not length.done
    assert length.feed(data[10:]) == data[10:] and length.done and length.keep_alive
    close = ResponseParser()
    assert close.feed(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + data) == data and not close.done
    assert close.end() == b"" and close.done and not close.keep_alive
    packed = gzip.compress(data)
    zipped = ResponseParser()
    raw = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(
        packed[:7], packed[7:]
    )
    assert feed_bytewise(zipped, raw) == data and zipped.done


@pytest.mark.parametrize(
    "raw",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20000,
    ],
    ids=["not-http", "chunk-size", "chunk-end", "brotli", "endless-head"],
)
def test_broken_answers_are_protocol_errors(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        ResponseParser().feed(raw)


def test_an_answer_cut_short_is_a_lost_connection() -> None:
    with pytest.raises(ConnectionLost, match="closed before the response"):
        ResponseParser().end()
    cut = ResponseParser()
    cut.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")
    with pytest.raises(ConnectionLost, match="broken mid-response"):
        cut.end()


def test_endpoint_and_request_bytes() -> None:
    ep = Endpoint.parse("https://user@gpu-1.example:8443/prefix/")
    assert (ep.host, ep.port, ep.tls, ep.netloc, ep.prefix) == (
        "gpu-1.example",
        8443,
        True,
        "gpu-1.example:8443",
        "/prefix",
    )
    raw = ep.post("/v1/chat/completions", {"Authorization": "Bearer k"}, b"{}")
    assert raw.startswith(b"POST /prefix/v1/chat/completions HTTP/1.1\r\nHost: gpu-1.example:8443\r\n")
    assert raw.endswith(b"Content-Length: 2\r\nAuthorization: Bearer k\r\n\r\n{}")
    assert Endpoint.parse("http://10.0.0.1").port == 80
    with pytest.raises(ValueError, match="line break"):
        ep.post("/x", {"Authorization": "Bearer k\r\nX-Evil: 1"}, b"")
    with pytest.raises(ValueError, match="not an http"):
        Endpoint.parse("file:///etc/passwd")


# ---------------------------------------------------------------- arrival stamps


class Pieces:
    """Stands in for a Connection: hands out pieces with the arrival times they were given."""

    def __init__(self, pieces: list[tuple[float, bytes]]) -> None:
        self.pieces = pieces

    async def receive(self) -> tuple[float, bytes] | None:
        return self.pieces.pop(0) if self.pieces else None


def test_each_message_keeps_the_arrival_time_of_its_piece() -> None:
    """Timing comes from when each piece arrived, however late it is parsed: two tokens in one
    piece share its time; the usage chunk does not move the end."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    role = sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    token = sse({"choices": [{"delta": {"content": " w"}}]})
    usage = sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}, b"[DONE]")
    pieces = [(10.0, head), (10.2, frame(role)[:-20]), (10.25, frame(role)[-20:]), (10.5, frame(token))]
    pieces += [(11.0, frame(token) + frame(token)), (11.5, frame(usage) + b"0\r\n\r\n")]
    record = RequestRecord(index=0, start=9.0)
    runner = Runner(Target("http://127.0.0.1:9", "m"))
    asyncio.run(runner._read(Pieces(pieces), ResponseParser(), record))  # type: ignore[arg-type]
    assert record.success and record.output_tokens == 3
    assert record.ttft == pytest.approx(1.25)  # the role chunk's last bytes came at 10.25
    assert record.itl == pytest.approx([0.25, 0.5, 0.0])
    assert record.latency == pytest.approx(2.0)  # the last token, not the usage chunk


def test_a_piece_is_stamped_when_the_loop_saw_it_not_after_other_work() -> None:
    """Bytes for B arrive while the loop handles A; in the next iteration asyncio runs A's woken
    task (here: 0.2 s of work) before B's read callback. B's stamp is when the loop's wait
    returned with it, before that work: the client's own parsing stays out of B's times."""
    loop, clock = new_event_loop()
    a_read, a_write = socket.socketpair()
    b_read, b_write = socket.socketpair()

    class First(Connection):
        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            b_write.send(b"b")  # arrives before the loop waits again

    async def main() -> tuple[float, float]:
        running = asyncio.get_running_loop()
        _, a = await running.create_connection(lambda: First(clock), sock=a_read)
        _, b = await running.create_connection(lambda: Connection(clock), sock=b_read)
        a_write.send(b"a")
        got_a = await a.receive()
        time.sleep(0.2)  # this task's work, before B's read callback runs
        got_b = await b.receive()
        assert got_a is not None and got_b is not None
        a.close()
        b.close()
        return got_a[0], got_b[0]

    try:
        stamp_a, stamp_b = loop.run_until_complete(main())
    finally:
        loop.close()
        for s in (a_write, b_write):
            s.close()
    assert stamp_b - stamp_a < 0.1, (stamp_a, stamp_b)


# ---------------------------------------------------------------- the runner against loopback servers


def runner_for(url: str, key: str = "sk-test", **kw: Any) -> Runner:
    return Runner(Target(url, "tiny", api_key=key, timeout_s=kw.pop("timeout_s", 600.0)), **kw)


def test_first_token_is_the_first_chunk_with_choices(fake_server: str) -> None:
    """Headers and an SSE comment come at once, the first chunk with choices 0.25 s later:
    TTFT is that chunk, not the headers or the ping."""
    FakeVLLM.first_delay = 0.25
    run = runner_for(fake_server).run(dataset.fixed(2, 2, 3), ALL)
    assert run.stopped is None and all(r.success for r in run.records)
    for r in run.records:
        assert 0.24 <= r.ttft < 0.24 + 0.25, r.ttft
        assert len(r.itl) == 3 and r.latency == pytest.approx(r.ttft + sum(r.itl))


@pytest.mark.parametrize(("chunked", "connections"), [(True, 2), (False, 8)], ids=["keep-alive", "close"])
def test_connections_are_kept_alive(fake_server: str, chunked: bool, connections: int) -> None:
    """8 requests at concurrency 2 go over 2 connections; a server that closes after each
    answer gets a new one per request."""
    FakeVLLM.chunked = chunked
    runner = runner_for(fake_server)
    run = runner.run(dataset.fixed(8, 2, 2), schedule.LoadPoint(float("inf"), 2))
    assert all(r.success for r in run.records) and len(run.records) == 8
    assert runner.connections_opened == connections and len(FakeVLLM.peers) == connections


def test_the_deadline_cuts_the_stream_and_nothing_starts_after_it(fake_server: str) -> None:
    FakeVLLM.token_delay = 0.2  # 4 s per request
    start = time.monotonic()
    run = runner_for(fake_server, deadline=start + 0.5).run(dataset.fixed(5, 2, 20), ALL)
    # One request alone takes 4 s: well under that means the stream was cut at the deadline (a
    # loose bound: a loaded 2-core CI machine delays the cut, not the 4 s).
    assert time.monotonic() - start < 3.5
    assert run.stopped == BUDGET_STOP and run.not_sent == 4 and FakeVLLM.served == 1
    assert [r.error for r in run.records] == ["stopped"]


def test_401_stops_the_run(fake_server: str) -> None:
    run = runner_for(fake_server, key="wrong").run(dataset.fixed(5, 2, 2), ALL)
    assert run.stopped == "the server answered 401 Unauthorized" and run.not_sent == 4
    (record,) = run.records
    assert record.status == 401 and record.error == 'HTTP 401: {"error": "Unauthorized"}'


def test_a_refused_connection_stops_the_run() -> None:
    run = runner_for(closed_port_url()).run(dataset.fixed(5, 2, 2), ALL)
    assert run.stopped == "the server stopped answering (connection refused)" and run.not_sent == 4


def test_keep_going_counts_and_times_every_failure_instead_of_stopping() -> None:
    """Issue 29: the load of a failover measurement goes on through refused connections."""
    target = Target(closed_port_url(), "tiny", api_key="sk-test", keep_going=True)
    run = Runner(target).run(dataset.fixed(5, 2, 2), schedule.LoadPoint(20.0, 2))
    assert run.stopped is None and run.not_sent == 0 and len(run.records) == 5
    assert all(r.error == "connection refused" and r.failed_after >= 0 for r in run.records)
    failures = compute(run.records, run.duration)["failures"]
    assert failures["count"] == 5 and 0 <= failures["first_s"] <= failures["last_s"]


@pytest.mark.parametrize(
    ("stall", "error", "stopped"),
    [
        ("before-answer", "timed out waiting for the answer", None),
        ("after-headers", "timed out mid-stream", "the server stopped answering (timed out mid-stream)"),
    ],
)
def test_request_timeout(fake_server: str, stall: str, error: str, stopped: str | None) -> None:
    """--request-timeout bounds each wait for bytes: a slow first answer fails that request
    only; a stream that stops mid-way means the server is gone."""
    FakeVLLM.stall = stall
    start = time.monotonic()
    run = runner_for(fake_server, timeout_s=0.3).run(dataset.fixed(2, 2, 2), ALL)
    assert [r.error for r in run.records] == [error] * len(run.records)
    assert run.stopped == stopped and len(run.records) == (2 if stopped is None else 1)
    assert time.monotonic() - start < 0.3 * len(run.records) + 0.5


def test_a_body_framed_by_content_length(fake_server: str) -> None:
    """A proxy that buffers the stream and sends it with Content-Length: every chunk arrives at
    once (TTFT == E2E), the tokens still count, and the connection is kept."""
    FakeVLLM.length_body = True
    runner = runner_for(fake_server)
    run = runner.run(dataset.fixed(3, 2, 4), ALL)
    assert all(r.success and r.output_tokens == 4 and r.ttft == r.latency for r in run.records)
    assert runner.connections_opened == 1
