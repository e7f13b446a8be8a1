"""Metrics and liveness on the real 2-node CPU cluster with DP=2 (issue 18): vLLM's CPU build, one
engine per node container, the head's API server in front. kit/health/observe.py scrapes the head and
both engines appear with their tokens; `kit metrics --json` reports both; the file_sd target kit
writes serves the metrics and the headless worker serves none; every metric of deploy/grafana's
dashboard exists in the live scrape; a one-token probe pinned to an engine reaches that engine;
and an engine stopped while idle (frozen gauges, /health 200) is judged hung by its pinned probe.
One cluster for the module, torn down in finally."""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from kit.health import liveness, observe
from kit.health import prometheus as metrics
from tests import promql
from tests.integration.clusters import make_kit, two_node_mp_env

# Second octet of this module's Docker subnets: 231 is this module's alone (test_dp_cluster 227).
SECOND_OCTET = 231
ENGINE_PROCESS = "VLLM::EngineCore_DP1"


@pytest.fixture(scope="module")
def cluster(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One 2-node mp cluster serving kit/tiny-llama as 'tiny' with DP=2, TP=1, PP=1."""
    root = tmp_path_factory.mktemp("metrics")
    base_env: dict[str, str] = {}
    kit = make_kit(root / "state", base_env)
    name = f"kmet{os.getpid() % 100000}"
    prep = kit("demo", "--prepare-only", "--json")
    assert prep.returncode == 0, prep.stderr
    hf_cache = json.loads(prep.stdout)["result"]["hf_cache"]
    base_env.update(two_node_mp_env(name, hf_cache, None, second_octet=SECOND_OCTET))
    base_env.update({"KIT_MODEL_TP": "1", "KIT_MODEL_DP": "2"})
    try:
        for role in ("--worker", "--head"):
            up = kit("up", role)
            assert up.returncode == 0, up.stderr
        serve = kit("serve", "--json")
        assert serve.returncode == 0, serve.stderr
        worker = docker_client.containers.get(f"kit-{name}-worker-1")
        yield {"kit": kit, "url": json.loads(serve.stdout)["result"]["url"], "root": root, "worker": worker}
    finally:
        kit("down")


def _chat(url: str, i: int) -> int:
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"Request {i}: hello"}], "max_tokens": 16}
    return requests.post(f"{url}/v1/chat/completions", json=body, timeout=300).status_code


def _signal_engine(worker: Any, signal: str) -> None:
    script = (
        'for p in /proc/[0-9]*; do tr "\\0" " " < "$p/cmdline" 2>/dev/null | grep -q "^$1" '
        '&& kill "-$2" "${p#/proc/}" && echo "${p#/proc/}"; done; true'
    )
    pids = worker.exec_run(["bash", "-c", script, "bash", ENGINE_PROCESS, signal]).output.decode().split()
    assert len(pids) == 1, f"expected one {ENGINE_PROCESS} process, signalled {pids}"


def test_both_engines_report_tokens_through_kits_scraper(cluster: dict[str, Any]) -> None:
    url = cluster["url"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        codes = list(pool.map(lambda i: _chat(url, i), range(32)))
    assert codes == [200] * 32
    engines = metrics.engines(observe.scrape(url))
    assert list(engines) == ["0", "1"]
    for engine in engines.values():
        assert engine.model_name == "tiny"
        assert engine.generation_tokens and engine.generation_tokens > 0, engine
        assert engine.requests_finished > 0 and engine.kv_cache_usage is not None
    assert sum(e.requests_finished for e in engines.values()) >= 32


def test_kit_metrics_json_and_the_file_sd_target(cluster: dict[str, Any]) -> None:
    kit = cluster["kit"]
    shown = kit("metrics", "--json", "--interval", "1")
    assert shown.returncode == 0, shown.stderr
    result = json.loads(shown.stdout)["result"]
    assert result["url"] == cluster["url"] and result["health"] == "ok" and result["missing"] == []
    rows = {row["engine"]: row for row in result["engines"]}
    assert sorted(rows) == ["0", "1"] and (rows["0"]["node_rank"], rows["1"]["node_rank"]) == (0, 1)
    assert all(row["generation_tokens"] > 0 and row["running"] is not None for row in rows.values())

    target_file = Path(cluster["root"]) / "kit-targets.json"
    written = kit("metrics", "--prometheus", str(target_file))
    assert written.returncode == 0, written.stderr
    [group] = json.loads(target_file.read_text())
    assert group["labels"]["role"] == "head" and group["labels"]["component"] == "vllm"
    assert f"http://{group['targets'][0]}" == cluster["url"]
    assert list(metrics.engines(observe.scrape(f"http://{group['targets'][0]}"))) == ["0", "1"]
    # The headless worker serves nothing: why the file lists only the head for the mp backend.
    status = json.loads(kit("status", "--json").stdout)["result"]
    worker_ip = next(c["node_ip"] for c in status["containers"] if c["role"] == "worker")
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{worker_ip}:8000/metrics", timeout=5)


def test_every_dashboard_metric_exists_in_the_live_scrape(cluster: dict[str, Any]) -> None:
    scrape = observe.scrape(cluster["url"])
    assert promql.dashboard_problems(promql.load_dashboard(), scrape) == []


def _finished(url: str) -> dict[str, float]:
    return {name: e.requests_finished for name, e in metrics.engines(observe.scrape(url)).items()}


def test_a_pinned_probe_reaches_the_engine_it_names(cluster: dict[str, Any]) -> None:
    url = cluster["url"]
    for engine, other in (("1", "0"), ("0", "1")):
        before = _finished(url)
        result = observe.probe(url, "tiny", engine=engine, deadline_s=30)
        assert result.error is None, result
        deadline = time.monotonic() + 10  # the API server records stats just after it answers
        while (after := _finished(url))[engine] == before[engine] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert after[engine] == before[engine] + 1 and after[other] == before[other], (engine, before, after)


def test_an_engine_stopped_while_idle_is_hung_by_its_pinned_probe_only(cluster: dict[str, Any]) -> None:
    """SIGSTOP engine 1 on the worker while idle: its gauges freeze at 0 running, 0 waiting and
    /health keeps answering, so only the probe pinned to it tells (the last test: it recovers the
    engine with SIGCONT, but runs after the others)."""
    url = cluster["url"]
    history: list[liveness.Observation] = []
    probes: list[liveness.Probe] = []
    _signal_engine(cluster["worker"], "STOP")
    try:
        for _ in range(3):
            observation, _scrape = observe.observe(url)
            history.append(observation)
            time.sleep(1)
        assert history[-1].health_error is None and history[-1].metrics_error is None
        assert liveness.idle_engines(history[-1]) == ["0", "1"]
        for engine in liveness.idle_engines(history[-1]):
            probes.append(observe.probe(url, "tiny", engine=engine, deadline_s=5))
        history.append(observe.observe(url)[0])
        verdicts = liveness.judge(history, expected=["0", "1"], liveness_s=30, probes=probes)
        assert [(v.engine, v.state) for v in verdicts] == [("0", "idle-ok"), ("1", "hung")], verdicts
        assert "pinned to engine 1 failed" in verdicts[1].reason and "did not answer within 5 s" in verdicts[1].reason
    finally:
        _signal_engine(cluster["worker"], "CONT")
    recovered = observe.probe(url, "tiny", engine="1", deadline_s=60)
    assert recovered.error is None, recovered
    history.append(observe.observe(url)[0])
    verdicts = liveness.judge(history, expected=["0", "1"], liveness_s=30, probes=[*probes, recovered])
    assert [(v.engine, v.state) for v in verdicts] == [("0", "idle-ok"), ("1", "idle-ok")], verdicts
