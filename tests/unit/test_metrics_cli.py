"""`kit metrics` through the CLI: the per-engine view from two scrapes of a stand-in server that
answers real recorded pages (tests/unit/fake_vllm.py), the file_sd file, and every refusal (one
line, its exit code, nothing written). The node containers come from a fake runtime."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kit.errors import ExitCode
from kit.runtime.base import NodeHandle
from tests.conftest import FakeRuntime, run_kit
from tests.unit import fake_vllm

DP2 = ["--set", "nodes=2", "--set", "backend=mp", "--set", "model.dp=2", "--set", "model.tp=1"]
HEAD = NodeHandle("kit-c-head", "c", "head", 0, "running", ip="10.231.5.10")
WORKER = NodeHandle("kit-c-worker-1", "c", "worker", 1, "running", ip="10.231.5.11")


@pytest.fixture(autouse=True)
def _two_nodes(kit_env: Path, use_runtime: Callable[[Any], None]) -> None:
    use_runtime(FakeRuntime(HEAD, WORKER))


@pytest.fixture
def server() -> Iterator[str]:
    pages = [(fake_vllm.FIXTURES / f"vllm-0.32.0-cpu-dp2-{n}.prom").read_bytes() for n in ("idle", "after-32-requests")]
    with fake_vllm.serving(pages) as url:
        yield url


def test_json_reports_both_engines_with_rates_and_their_nodes(server: str) -> None:
    code, out, err = run_kit(["metrics", "--url", server, "--interval", "0.2", "--json", "--cluster", "c", *DP2])
    assert code == 0, err
    result = json.loads(out)["result"]
    assert result["url"] == server and result["health"] == "ok" and result["missing"] == []
    engines = {e["engine"]: e for e in result["engines"]}
    assert list(engines) == ["0", "1"] and (engines["0"]["node_rank"], engines["1"]["node_rank"]) == (0, 1)
    interval = result["interval_s"]
    assert interval >= 0.2
    # idle -> after 32 requests: engine 0 generated 364 tokens, engine 1 84, over the interval
    assert engines["0"]["generation_tokens_per_s"] == pytest.approx(364 / interval, rel=0.01)
    assert engines["1"]["prompt_tokens_per_s"] == pytest.approx(160 / interval, rel=0.01)
    assert engines["1"]["requests_finished"] == 11 and engines["0"]["kv_cache_usage"] == 0


def test_text_table_and_engines_the_plan_expects_but_metrics_lack(server: str) -> None:
    dp4 = ["--set", "nodes=2", "--set", "gpus_per_node=2", "--set", "backend=mp", "--set", "model.dp=4"]
    code, out, err = run_kit(["metrics", "--url", server, "--interval", "0.1", "--set", "model.tp=1", *dp4])
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"{server}: /health ok; rates over")
    assert lines[1].split()[:4] == ["engine", "node", "running", "waiting"]
    assert lines[3].split()[:5] == ["0", "0", "0", "0", "0.0%"] and lines[4].split()[:2] == ["1", "0"]
    assert lines[-2:] == [
        "missing: engine 2 (node rank 1) is in the plan but not in /metrics",
        "missing: engine 3 (node rank 1) is in the plan but not in /metrics",
    ]


def test_default_url_is_the_local_head_container(server: str, use_runtime: Callable[[Any], None]) -> None:
    port = server.rsplit(":", 1)[1]
    head = NodeHandle("kit-c-head", "c", "head", 0, "running", ip="127.0.0.1")
    use_runtime(FakeRuntime(head))
    code, out, err = run_kit(["metrics", "--interval", "0.1", "--json", "--set", f"ports.api={port}"])
    assert code == 0, err
    assert json.loads(out)["result"]["url"] == server


def test_prometheus_file_sd_for_mp_and_ray(tmp_path: Path) -> None:
    target = tmp_path / "sd" / "kit.json"
    target.parent.mkdir()
    code, out, err = run_kit(["metrics", "--prometheus", str(target), "--cluster", "c", *DP2])
    assert code == 0, err
    assert json.loads(target.read_text()) == [
        {
            "targets": ["10.231.5.10:8000"],
            "labels": {"cluster": "c", "node": "head", "role": "head", "rank": "0", "component": "vllm"},
        }
    ]
    assert oct(target.stat().st_mode & 0o777) == "0o644" and os.listdir(target.parent) == ["kit.json"]
    assert out.startswith(f"wrote 1 scrape target(s) to {target}")
    code, out, err = run_kit(["metrics", "--prometheus", "-", "--cluster", "c", "--set", "backend=ray"])
    assert code == 0, err
    groups = json.loads(out)
    assert [(g["targets"][0], g["labels"]["node"], g["labels"]["component"]) for g in groups] == [
        ("10.231.5.10:8000", "head", "vllm"),
        ("10.231.5.10:6382", "head", "ray"),
        ("10.231.5.11:6382", "worker-1", "ray"),
    ]


def test_prometheus_without_a_known_head_or_a_writable_place_writes_nothing(
    tmp_path: Path, use_runtime: Callable[[Any], None]
) -> None:
    missing_dir = tmp_path / "nope" / "kit.json"
    code, out, err = run_kit(["metrics", "--prometheus", str(missing_dir)])
    assert code == ExitCode.CONFIG and out == ""
    assert err.strip().splitlines() == [
        f"kit: error: --prometheus: the folder {missing_dir.parent} does not exist "
        "(fix: create the folder first, or write somewhere else)"
    ]
    use_runtime(FakeRuntime())
    code, out, err = run_kit(["metrics", "--prometheus", str(tmp_path / "kit.json")])
    assert code == ExitCode.CONFIG and not (tmp_path / "kit.json").exists()
    assert err.strip().splitlines() == [
        "kit: error: head_address: the head's address is unknown (fix: run on the head's host, or set head_address)"
    ]
    # with head_address set, a host with no node of the cluster (a monitoring host) can write it
    code, out, err = run_kit(["metrics", "--prometheus", "-", "--set", "head_address=10.9.9.9"])
    assert code == 0 and json.loads(out)[0]["targets"] == ["10.9.9.9:8000"]


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "601", "soon"])
def test_bad_interval_is_a_usage_error(value: str) -> None:
    code, _out, err = run_kit(["metrics", "--interval", value, "--url", "http://127.0.0.1:1"])
    assert code == ExitCode.USAGE and "--interval" in err and "Traceback" not in err


@pytest.mark.parametrize("url", ["ftp://h:8000", "h:8000", "http://", "http://h :8000", "http://h\n:8000"])
def test_bad_url_is_refused_before_any_request(url: str) -> None:
    code, _out, err = run_kit(["metrics", "--url", url, "--interval", "0.1"])
    assert code == ExitCode.CONFIG and len(err.strip().splitlines()) == 1 and "--url" in err


def test_unreachable_server_is_exit_8_one_line_and_json_errors() -> None:
    with fake_vllm.serving() as url:
        pass  # the port is closed again
    code, out, err = run_kit(["metrics", "--url", url, "--interval", "0.1"])
    assert code == ExitCode.SERVER
    assert err.strip().splitlines() == [
        f"kit: error: cannot reach {url}/metrics: connection refused (fix: is the server up? see `kit status`)"
    ]
    code, out, err = run_kit(["metrics", "--url", url, "--interval", "0.1", "--json"])
    assert code == ExitCode.SERVER and json.loads(out)["error"]["type"] == "ServerError"
