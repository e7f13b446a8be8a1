"""Real data parallelism without GPUs (issue 10): two container "nodes", vLLM's CPU build,
DP=2 with one rank per node (TP=1), the head's API answering, and both DP ranks doing work
(vLLM's per-engine metrics and each node's engine log); `kit status` sees each node's rank, and
a dead rank. Metrics and liveness on the same cluster (issue 18): kit/health/observe.py scrapes the
head and both engines appear with their tokens; `kit metrics --json` reports both; the file_sd
target kit writes serves the metrics and the headless worker serves none; every metric of
deploy/grafana's dashboard exists in the live scrape; a one-token probe pinned to an engine
reaches that engine; an engine stopped while idle (frozen gauges, /health 200) is judged hung by
its pinned probe. EP: refused before anything starts for the dense tiny model (no experts); with
a tiny MoE, DP=2 + EP reaches vLLM on both nodes and the server gets healthy, but vLLM's CPU
build refuses the EP dispatch at the first request (its exact NotImplementedError is asserted).

One DP=2 cluster for the module (the metrics tests once brought up an identical one of their own,
issue 26); the tests run in file order, those that break serving last."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
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

# Second octet of this module's Docker subnets (test_cluster_ray 213, test_verify_cluster 214,
# test_serve 215): 227 is this module's alone.
SECOND_OCTET = 227
ENGINE_PROCESS = "VLLM::EngineCore_DP1"
ENGINE_METRIC = re.compile(r"^vllm:request_success_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def dp_cluster(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One 2-node mp cluster serving kit/tiny-llama as 'tiny' with DP=2, TP=1, PP=1."""
    root = tmp_path_factory.mktemp("dp")
    state = root / "state"
    base_env: dict[str, str] = {}

    kit = make_kit(state, base_env)

    name = f"kdp{os.getpid() % 100000}"
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
        url = json.loads(serve.stdout)["result"]["url"]
        yield {"kit": kit, "url": url, "name": name, "root": root, "worker": worker}
    finally:
        kit("down")


def _chat(url: str, i: int) -> dict[str, Any]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"Request {i}: hello"}], "max_tokens": 24}
    response = requests.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    doc: dict[str, Any] = response.json()
    return doc


def _finished_per_engine(scrape: str) -> dict[str, float]:
    """vLLM's request_success_total summed over finish reasons, per engine (= DP rank)."""
    out: dict[str, float] = {}
    for match in ENGINE_METRIC.finditer(scrape):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        out[labels["engine"]] = out.get(labels["engine"], 0.0) + float(match.group("value"))
    return out


def test_dp2_answers_through_the_head_and_both_ranks_work(dp_cluster: dict[str, Any], docker_client: Any) -> None:
    url = dp_cluster["url"]
    # Enough concurrent requests that the API server's DP load balancer (it picks the engine with
    # the shortest queue) has to use both ranks.
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(lambda i: _chat(url, i), range(32)))
    assert len(answers) == 32
    assert all(a["choices"][0]["message"]["content"] is not None for a in answers)
    assert all(a["usage"]["completion_tokens"] > 0 for a in answers)

    per_engine = _finished_per_engine(requests.get(f"{url}/metrics", timeout=30).text)
    assert set(per_engine) == {"0", "1"}, per_engine
    assert per_engine["0"] > 0 and per_engine["1"] > 0, f"one DP rank did no work: {per_engine}"
    assert per_engine["0"] + per_engine["1"] >= 32

    # Each node runs its own rank: the engine process and its log are on that node.
    head = docker_client.containers.get(f"kit-{dp_cluster['name']}-head")
    worker = docker_client.containers.get(f"kit-{dp_cluster['name']}-worker-1")
    head_log = head.exec_run(["cat", "/tmp/kit/serve.log"]).output.decode()
    worker_log = worker.exec_run(["cat", "/tmp/kit/serve.log"]).output.decode()
    assert "EngineCore_DP0" in head_log and "EngineCore_DP1" not in head_log
    assert "EngineCore_DP1" in worker_log and "EngineCore_DP0" not in worker_log
    argv = worker.exec_run(["bash", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]).output.decode()
    assert "--headless" in argv and "--data-parallel-start-rank 1" in argv
    assert "--data-parallel-size 2 --data-parallel-size-local 1" in argv


def _chat_status(url: str, i: int) -> int:
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"Request {i}: hello"}], "max_tokens": 16}
    return requests.post(f"{url}/v1/chat/completions", json=body, timeout=300).status_code


def _signal_engine(worker: Any, signal: str) -> None:
    script = (
        'for p in /proc/[0-9]*; do tr "\\0" " " < "$p/cmdline" 2>/dev/null | grep -q "^$1" '
        '&& kill "-$2" "${p#/proc/}" && echo "${p#/proc/}"; done; true'
    )
    pids = worker.exec_run(["bash", "-c", script, "bash", ENGINE_PROCESS, signal]).output.decode().split()
    assert len(pids) == 1, f"expected one {ENGINE_PROCESS} process, signalled {pids}"


def test_both_engines_report_tokens_through_kits_scraper(dp_cluster: dict[str, Any]) -> None:
    url = dp_cluster["url"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        codes = list(pool.map(lambda i: _chat_status(url, i), range(32)))
    assert codes == [200] * 32
    engines = metrics.engines(observe.scrape(url))
    assert list(engines) == ["0", "1"]
    for engine in engines.values():
        assert engine.model_name == "tiny"
        assert engine.generation_tokens and engine.generation_tokens > 0, engine
        assert engine.requests_finished > 0 and engine.kv_cache_usage is not None
    assert sum(e.requests_finished for e in engines.values()) >= 32


def test_kit_metrics_json_and_the_file_sd_target(dp_cluster: dict[str, Any]) -> None:
    kit = dp_cluster["kit"]
    shown = kit("metrics", "--json", "--interval", "1")
    assert shown.returncode == 0, shown.stderr
    result = json.loads(shown.stdout)["result"]
    assert result["url"] == dp_cluster["url"] and result["health"] == "ok" and result["missing"] == []
    rows = {row["engine"]: row for row in result["engines"]}
    assert sorted(rows) == ["0", "1"] and (rows["0"]["node_rank"], rows["1"]["node_rank"]) == (0, 1)
    assert all(row["generation_tokens"] > 0 and row["running"] is not None for row in rows.values())

    target_file = Path(dp_cluster["root"]) / "kit-targets.json"
    written = kit("metrics", "--prometheus", str(target_file))
    assert written.returncode == 0, written.stderr
    [group] = json.loads(target_file.read_text())
    assert group["labels"]["role"] == "head" and group["labels"]["component"] == "vllm"
    assert f"http://{group['targets'][0]}" == dp_cluster["url"]
    assert list(metrics.engines(observe.scrape(f"http://{group['targets'][0]}"))) == ["0", "1"]
    # The headless worker serves nothing: why the file lists only the head for the mp backend.
    status = json.loads(kit("status", "--json").stdout)["result"]
    worker_ip = next(c["node_ip"] for c in status["containers"] if c["role"] == "worker")
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{worker_ip}:8000/metrics", timeout=5)


def test_every_dashboard_metric_exists_in_the_live_scrape(dp_cluster: dict[str, Any]) -> None:
    scrape = observe.scrape(dp_cluster["url"])
    assert promql.dashboard_problems(promql.load_dashboard(), scrape) == []


def _finished(url: str) -> dict[str, float]:
    return {name: e.requests_finished for name, e in metrics.engines(observe.scrape(url)).items()}


def test_a_pinned_probe_reaches_the_engine_it_names(dp_cluster: dict[str, Any]) -> None:
    url = dp_cluster["url"]
    for engine, other in (("1", "0"), ("0", "1")):
        before = _finished(url)
        result = observe.probe(url, "tiny", engine=engine, deadline_s=30)
        assert result.error is None, result
        deadline = time.monotonic() + 10  # the API server records stats just after it answers
        while (after := _finished(url))[engine] == before[engine] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert after[engine] == before[engine] + 1 and after[other] == before[other], (engine, before, after)


def test_an_engine_stopped_while_idle_is_hung_by_its_pinned_probe_only(dp_cluster: dict[str, Any]) -> None:
    """SIGSTOP engine 1 on the worker while idle: its gauges freeze at 0 running, 0 waiting and
    /health keeps answering, so only the probe pinned to it tells (it recovers the engine with
    SIGCONT; the dead-rank test after it breaks serving)."""
    url = dp_cluster["url"]
    history: list[liveness.Observation] = []
    probes: list[liveness.Probe] = []
    _signal_engine(dp_cluster["worker"], "STOP")
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
        _signal_engine(dp_cluster["worker"], "CONT")
    recovered = observe.probe(url, "tiny", engine="1", deadline_s=60)
    assert recovered.error is None, recovered
    history.append(observe.observe(url)[0])
    verdicts = liveness.judge(history, expected=["0", "1"], liveness_s=30, probes=[*probes, recovered])
    assert [(v.engine, v.state) for v in verdicts] == [("0", "idle-ok"), ("1", "idle-ok")], verdicts


def test_status_shows_each_nodes_rank_and_a_dead_one(dp_cluster: dict[str, Any], docker_client: Any) -> None:
    kit = dp_cluster["kit"]
    status = kit("status", "--json")
    assert status.returncode == 0, status.stderr
    dp = json.loads(status.stdout)["result"]["dp"]
    assert (dp["size"], dp["per_node"]) == (2, 1)
    assert [(n["node_rank"], n["expected"], n["alive"]) for n in dp["nodes"]] == [(0, [0], [0]), (1, [1], [1])]
    text = kit("status").stdout
    assert "data parallel: 2 rank(s), 1 per node (mp); 2 alive on this host" in text

    # Kill rank 1's engine on the worker: status names it missing (the last test: it breaks serving).
    worker = docker_client.containers.get(f"kit-{dp_cluster['name']}-worker-1")
    kill = (
        'for p in /proc/[0-9]*; do tr "\\0" " " < "$p/cmdline" 2>/dev/null | grep -q "^VLLM::EngineCore_DP1" '
        '&& kill -9 "${p#/proc/}"; done; true'
    )
    worker.exec_run(["bash", "-c", kill])
    deadline = time.monotonic() + 30
    while True:
        dp = json.loads(kit("status", "--json").stdout)["result"]["dp"]
        if dp["nodes"][1]["missing"] == [1] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert dp["nodes"][1]["alive"] == [] and dp["nodes"][1]["missing"] == [1], dp
    assert "missing" in kit("status").stdout


def test_ep_on_a_model_without_experts_is_refused_before_start(dp_cluster: dict[str, Any]) -> None:
    # The tiny model's real config.json (in the HF cache) has no experts: refused, nothing started.
    result = dp_cluster["kit"]("up", "--head", "--dry-run", "--cluster", "kdp-ep-refused", env={"KIT_MODEL_EP": "true"})
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.ep" in lines[0] and "has no experts" in lines[0], lines


def test_ep_on_cpu_serves_then_vllm_refuses_the_expert_all_gather(
    dp_cluster: dict[str, Any], docker_client: Any
) -> None:
    """DP=2 + EP with a tiny MoE (4 experts, 2 per rank): kit's plan reaches vLLM on both nodes
    (each rank holds its half of the experts) and the server becomes healthy, but vLLM's CPU build
    cannot run the EP dispatch: its CPU communicator has no `all_gatherv`, so the first request
    fails with vLLM's own NotImplementedError (vllm 0.32.0,
    device_communicators/base_device_communicator.py). This test pins that refusal; EP on GPUs is
    covered by the goldens (tests/unit/test_dp.py)."""
    kit = dp_cluster["kit"]
    head = docker_client.containers.get(f"kit-{dp_cluster['name']}-head")
    hub = head.exec_run(["printenv", "HF_HOME"]).output.decode().strip() + "/hub"
    script = (Path(__file__).parent / "make_tiny_moe.py").read_text()
    made = head.exec_run(["python3", "-c", script, hub])
    assert made.exit_code == 0, made.output.decode()[-2000:]

    moe = {"KIT_MODEL_ID": "kit/tiny-moe", "KIT_MODEL_EP": "true"}
    serve = kit("serve", "--replace", "--json", env=moe)
    assert serve.returncode == 0, serve.stderr
    worker = docker_client.containers.get(f"kit-{dp_cluster['name']}-worker-1")
    for node, rank in ((head, 0), (worker, 1)):
        log = node.exec_run(["cat", "/tmp/kit/serve.log"]).output.decode()
        assert f"[EP Rank {rank}/2] Expert parallelism is enabled" in log
        assert "Local/global number of experts: 2/4" in log

    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    response = requests.post(f"{dp_cluster['url']}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 500, response.text
    assert "EngineCore encountered an issue" in response.text
    deadline = time.monotonic() + 60
    while True:
        log = head.exec_run(["cat", "/tmp/kit/serve.log"]).output.decode()
        if "NotImplementedError" in log or time.monotonic() > deadline:
            break
        time.sleep(1)
    # vLLM's exact refusal, from the head's engine (rank 0) log.
    assert "in all_gatherv" in log and "base_device_communicator.py" in log, log[-3000:]
    assert re.search(r"Worker_DP0_EP0 [^\n]*\] NotImplementedError\r?$", log, re.MULTILINE), log[-3000:]
