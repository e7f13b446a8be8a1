"""kit/health/observe.py against a real local HTTP server (stdlib http.server in a thread) that plays a
vLLM API server: /metrics (a real recorded scrape), /health and /v1/completions, and misbehaves on
demand (too big, trickling, hanging, erroring)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.errors import ConfigError, ServerError
from kit.health import observe
from kit.health import prometheus as metrics
from tests.unit import fake_vllm
from tests.unit.fake_vllm import FakeServer


@pytest.fixture
def server() -> Iterator[str]:
    with fake_vllm.serving() as url:
        yield url


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "api_key"
    path.write_text("sk-first\n")
    return path


def closed_port_url() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_scrape_parses_the_real_page(server: str) -> None:
    scrape = observe.scrape(server)
    assert list(metrics.engines(scrape)) == ["0", "1"]


def test_scrape_refuses_an_oversized_page_and_an_error_status_and_garbage(server: str) -> None:
    with pytest.raises(ServerError, match=r"announced 66466 bytes, more than the 1000 kit reads"):
        observe.scrape(server, max_bytes=1000)
    FakeServer.metrics_status = 500
    with pytest.raises(ServerError, match="/metrics answered 500"):
        observe.scrape(server)
    FakeServer.metrics_status, FakeServer.metrics_body = 200, b"<html>hello</html>\n"
    with pytest.raises(metrics.MetricsParseError, match="line 1"):
        observe.scrape(server)


def test_a_trickling_page_is_cut_at_the_deadline(server: str) -> None:
    FakeServer.trickle_s = 0.05  # the whole page would take ~40 s
    started = time.monotonic()
    with pytest.raises(ServerError, match=r"did not finish answering within 0\.5 s"):
        observe.scrape(server, deadline_s=0.5)
    assert time.monotonic() - started < 5  # far below the 40 s the server would take


def test_unreachable_server_is_a_one_line_server_error() -> None:
    url = closed_port_url()
    with pytest.raises(ServerError) as info:
        observe.scrape(url, deadline_s=2)
    assert info.value.message == f"cannot reach {url}/metrics: connection refused"
    assert observe.health_error(url, deadline_s=2) == info.value.message.replace("/metrics", "/health")


def test_health(server: str) -> None:
    assert observe.health_error(server) is None
    FakeServer.health_status = 503
    assert observe.health_error(server) == f"{server}/health answered 503"


def test_observe_stamps_health_and_engines(server: str) -> None:
    observation, scrape = observe.observe(server, clock=lambda: 42.0)
    assert observation.t == 42.0 and observation.health_error is None and observation.metrics_error is None
    assert scrape is not None and observation.engines["1"].generation_tokens == 84
    FakeServer.metrics_status = 404
    observation, scrape = observe.observe(server)
    assert (
        scrape is None and observation.engines == {} and observation.metrics_error == f"{server}/metrics answered 404"
    )


def test_probe_pins_the_engine_and_reads_the_key_at_each_call(server: str, key_file: Path) -> None:
    result = observe.probe(server, "tiny", engine="1", api_key_file=str(key_file), clock=iter([1.0, 1.25]).__next__)
    assert result == observe.Probe(t=1.0, engine="1", error=None, latency_s=0.25)
    sent = FakeServer.seen[-1]
    assert sent["X-data-parallel-rank"] == "1" and sent["Authorization"] == "Bearer sk-first"
    assert json.loads(sent["body"]) == {"model": "tiny", "prompt": "ping", "max_tokens": 1, "temperature": 0}
    # the key was rotated: the next probe uses the new one (read at call time, never cached)
    FakeServer.key = "sk-second"  # fake_vllm.serving() restores the defaults afterwards
    key_file.write_text("sk-second")
    assert observe.probe(server, "tiny", api_key_file=str(key_file)).error is None
    assert "X-data-parallel-rank" not in FakeServer.seen[-1]


def test_a_wrong_key_raises_without_showing_the_key(server: str, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("sk-WRONG-secret")
    with pytest.raises(ServerError) as info:
        observe.probe(server, "tiny", api_key_file=str(wrong))
    assert "answered 401" in info.value.message and "api_key_file" in (info.value.hint or "")
    assert "sk-WRONG-secret" not in json.dumps(info.value.to_dict())
    with pytest.raises(ConfigError, match="api_key_file"):
        observe.probe(server, "tiny", api_key_file=str(tmp_path / "missing"))


def test_probe_failures_are_results_not_exceptions(server: str, key_file: Path) -> None:
    FakeServer.completion_delay_s = 3
    slow = observe.probe(server, "tiny", engine="0", api_key_file=str(key_file), deadline_s=0.5)
    assert slow.error == f"{server}/v1/completions did not answer within 0.5 s" and slow.engine == "0"
    FakeServer.completion_delay_s, FakeServer.completion_status = 0, 500
    failed = observe.probe(server, "tiny", api_key_file=str(key_file))
    assert failed.error is not None and "answered 500" in failed.error
    FakeServer.completion_status = 200
    FakeServer.completion_body = {"choices": []}
    empty = observe.probe(server, "tiny", api_key_file=str(key_file))
    assert empty.error == f"{server}/v1/completions answered 200 without a completion"
    down = observe.probe(closed_port_url(), "tiny", deadline_s=2)
    assert down.error is not None and "connection refused" in down.error
