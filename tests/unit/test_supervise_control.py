"""The control protocol (kit/supervise/protocol.py) and the coordinator's HTTP endpoint, then the
whole loop in one process: a real coordinator on loopback, two real agents running stub serve
scripts (real processes and signals), and a fake observation of the API (a function: the real
server is in tests/integration/test_supervise_cluster.py). A killed "engine" is detected, the
group stopped and restarted on both nodes, and the events and state files say so."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kit.health.liveness import EngineSample, Observation, Probe
from kit.supervise import events, procs, protocol
from kit.supervise.agent import Agent, AgentConfig, http_post
from kit.supervise.coordinator import Coordinator, CoordinatorConfig
from kit.supervise.policy import Settings

STUB = """#!/bin/bash
(exec -a "VLLM::EngineCore_DP${STUB_RANK}" sleep 300) &
exec -a vllm-stub sleep 300
"""


def report(**changes: Any) -> dict[str, Any]:
    doc = {
        "node": "worker-1",
        "instance": "worker-1-abc",
        "boot": "b:1",
        "generation": 1,
        "running": True,
        "exit_code": None,
        "stopped": False,
        "engines": [{"pid": 5, "state": "S", "title": "VLLM::EngineCore_DP1"}],
        "exiting": False,
        "log_tail": ["a"],
    }
    return {**doc, **changes}


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"node": "worker-1; rm -rf /"}, "node must be"),
        ({"node": "../head"}, "node must be"),
        ({"generation": True}, "generation must be an integer"),
        ({"generation": -1}, "out of range"),
        ({"instance": "x" * 81}, "short id"),
        ({"engines": [{"pid": 1, "state": "S", "title": "t"}] * 600}, "too many"),
        ({"engines": ["x"]}, "not an object"),
        ({"running": "yes"}, "running"),
        ({"exit_code": "1"}, "exit_code"),
    ],
)
def test_a_report_that_breaks_the_protocol_is_refused(changes: dict[str, Any], why: str) -> None:
    with pytest.raises(protocol.ProtocolError, match=why):
        protocol.report_from(report(**changes))


def test_a_report_round_trips_and_control_characters_are_neutralised() -> None:
    doc = report(log_tail=["ok", "\x1b[31mred\x07"], boot="b:1\n")
    parsed = protocol.report_from(doc)
    assert parsed.log_tail == ("ok", "?[31mred?") and parsed.boot == "b:1?"
    assert protocol.report_from(parsed.to_dict()) == parsed


def test_orders_and_bodies_are_checked() -> None:
    assert protocol.order_from({"generation": 2, "action": "exit", "exit_code": 6}).exit_code == 6
    with pytest.raises(protocol.ProtocolError):
        protocol.order_from({"generation": 2, "action": "rm", "exit_code": 0})
    with pytest.raises(protocol.ProtocolError):
        protocol.loads(b"[1]")
    with pytest.raises(protocol.ProtocolError):
        protocol.loads(b"{" + b" " * protocol.MAX_BODY + b"}")
    assert protocol.token_ok("abc", "abc") and not protocol.token_ok("abc", "abd")
    assert not protocol.token_ok("", "") and not protocol.token_ok("abc", None)


# ---- the coordinator, for real on loopback -------------------------------------------------------


class World:
    """The fake API: healthy with every engine when every node's stub runs, refused otherwise."""

    def __init__(self) -> None:
        self.agents: list[Agent] = []

    def observe(self) -> Observation:
        live = {p.title for p in procs.engines(procs.all_procs()) if any(p.pgid == a.group.pid for a in self.agents)}
        engines = {t[-1]: EngineSample(0, 0, 0) for t in live if t.startswith("VLLM::EngineCore_DP")}
        if len(engines) < 2:
            return Observation(time.monotonic(), {}, health_error="refused", metrics_error="refused")
        return Observation(time.monotonic(), engines)

    def probe(self, engine: str) -> Probe:
        return Probe(time.monotonic(), engine, None, 0.01)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A coordinator and the agents of head and worker-1, each in a thread, on loopback."""
    (tmp_path / "token").write_text("s3cret")
    world = World()
    settings = Settings(
        nodes=("head", "worker-1"),
        engines=("0", "1"),
        liveness_s=5,
        ready_s=30,
        max_restarts=1,
        backoff_s=1,
        stable_s=300,
        node_wait_s=30,
    )
    config = CoordinatorConfig(
        directory=str(tmp_path),
        host="127.0.0.1",
        port=0,
        token="s3cret",
        api_url="http://127.0.0.1:9",
        model="tiny",
        api_key_path=None,
        settings=settings,
        interval_s=0.2,
    )
    lines: list[str] = []
    coordinator = Coordinator(config, observe=world.observe, probe=world.probe, out=lines.append)
    stop = threading.Event()
    result: dict[str, int] = {}
    threading.Thread(target=lambda: result.update(code=coordinator.run(stop)), daemon=True).start()
    assert coordinator.listening.wait(10)
    url = f"http://127.0.0.1:{coordinator.bound[1]}"
    threads = []
    for node, rank in (("head", 0), ("worker-1", 1)):
        script = tmp_path / f"serve-{node}.sh"
        script.write_text(STUB.replace("${STUB_RANK}", str(rank)))
        log, pid = str(tmp_path / f"{node}.log"), str(tmp_path / f"{node}.pid")
        cfg = AgentConfig(url, "s3cret", node, str(script), log, pid, interval_s=0.2, grace_s=2)
        agent = Agent(cfg, log=lambda _: None, only_own=True)  # other sessions' vLLMs share this /proc
        world.agents.append(agent)

        def loop(agent: Agent = agent) -> None:
            while not stop.is_set():
                if agent.tick() is not None:
                    return
                time.sleep(0.2)
            agent.shutdown()

        threads.append(threading.Thread(target=loop, daemon=True))
        threads[-1].start()
    yield {
        "coordinator": coordinator,
        "agents": world.agents,
        "url": url,
        "dir": tmp_path,
        "lines": lines,
        "result": result,
        "stop": stop,
        "threads": threads,
    }
    stop.set()
    for thread in threads:
        thread.join(10)
    for agent in world.agents:
        agent.group.stop(2)


def kinds(directory: Path) -> list[str]:
    return [e.kind for e in events.parse_lines((directory / "events.jsonl").read_text().splitlines())]


def wait_for_event(directory: Path, kind: str, count: int = 1, seconds: float = 30) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if (directory / "events.jsonl").exists() and kinds(directory).count(kind) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"no {kind} x{count}: {kinds(directory)}")


def http(url: str, *, token: str | None, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    if token is not None:
        request.add_header(protocol.TOKEN_HEADER, token)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_endpoint_wants_the_token_and_a_valid_body(run: dict[str, Any]) -> None:
    url = run["url"]
    assert http(f"{url}/v1/status", token=None)[0] == 401
    assert http(f"{url}/v1/status", token="wrong")[0] == 401
    assert http(f"{url}/v1/report", token="wrong", body=json.dumps(report()).encode())[0] == 401
    code, doc = http(f"{url}/v1/report", token="s3cret", body=b'{"node": "x"}')
    assert code == 400 and "node" in doc["error"]
    code, doc = http(f"{url}/v1/status", token="s3cret")
    assert code == 200 and doc["phase"] in ("waiting", "starting", "serving")
    # A node the run does not have is told to stop, and never counted.
    post = http_post(AgentConfig(url, "s3cret", "worker-7", "", "", ""))
    assert post(report(node="worker-7", instance="worker-7-x"))["action"] == "stop"


def test_a_killed_engine_restarts_the_whole_group_and_the_record_says_so(run: dict[str, Any]) -> None:
    directory, agents = run["dir"], run["agents"]
    wait_for_event(directory, "ready")
    first = {a.config.node: a.group.pid for a in agents}
    engine = next(p for p in procs.engines(procs.all_procs()) if p.pgid == first["worker-1"])
    os.kill(engine.pid, signal.SIGKILL)  # the worker's engine dies; its serve script lives on
    wait_for_event(directory, "ready", 2)
    assert kinds(directory) == [
        "supervising",
        "waiting",
        "started",
        "ready",
        "detected",
        "stopping",
        "restarting",
        "started",
        "ready",
    ]
    found = events.parse_lines((directory / "events.jsonl").read_text().splitlines())
    detected = next(e for e in found if e.kind == "detected")
    # Whichever look sees it first: the worker agent's process scan, or the API (the fake one is
    # down as soon as an engine is missing, as vLLM's API server goes down with its engine).
    assert (detected.node, detected.reason) in (
        ("worker-1", "process VLLM::EngineCore_DP1 is gone from node worker-1"),
        ("head", "the API server is down: /health: refused"),
    )
    assert found[-1].generation == 2 and found[-1].restarts == 1 and found[-1].data["recovery_s"] > 0
    assert all(a.group.generation == 2 and a.group.running() for a in agents)
    assert {a.config.node: a.group.pid for a in agents}.keys() == first.keys()
    assert all(a.group.pid != first[a.config.node] for a in agents), "every node restarted, not only the failed one"
    state = json.loads((directory / "state.json").read_text())
    assert state["phase"] == "serving" and state["restarts"] == 1 and state["last_failure"] == detected.reason
    assert sum(1 for line in run["lines"] if line.startswith(events.EVENT_MARK + " ")) == len(found)


def test_the_limit_gives_up_every_agent_exits_6_and_nothing_is_left(run: dict[str, Any]) -> None:
    directory, agents = run["dir"], run["agents"]
    wait_for_event(directory, "ready")
    for generation in (1, 2):  # max_restarts=1: the second failure in a row gives up
        wait_for_event(directory, "ready", generation)
        pid = next(a.group.pid for a in agents if a.config.node == "head")
        os.kill(pid, signal.SIGKILL)
    wait_for_event(directory, "given-up")
    for thread in run["threads"]:
        thread.join(20)
    end = time.monotonic() + 10
    while "code" not in run["result"] and time.monotonic() < end:
        time.sleep(0.1)
    assert run["result"]["code"] == 6
    assert all(a.exiting and a.group.members() == [] for a in agents)
    given_up = events.parse_lines((directory / "events.jsonl").read_text().splitlines())[-1]
    assert given_up.kind == "given-up" and "vllm serve exited on node head" in given_up.reason
    assert not (directory / "resume").exists()


def test_a_stop_request_ends_the_run_with_code_0(run: dict[str, Any]) -> None:
    directory = run["dir"]
    wait_for_event(directory, "ready")
    code, _ = http(f"{run['url']}/v1/stop", token="s3cret", body=b'{"reason": "kit down"}')
    assert code == 200
    wait_for_event(directory, "stopped")
    end = time.monotonic() + 10
    while "code" not in run["result"] and time.monotonic() < end:
        time.sleep(0.1)
    assert run["result"]["code"] == 0
    assert events.parse_lines((directory / "events.jsonl").read_text().splitlines())[-1].reason == "kit down"
    assert all(a.group.members() == [] for a in run["agents"])


@pytest.mark.parametrize(("answers", "hung", "gaps"), [(True, False, False), (False, True, False), (False, True, True)])
def test_a_stall_under_load_needs_the_pinned_probe_to_fail_too(
    tmp_path: Path, answers: bool, hung: bool, gaps: bool
) -> None:
    """Engine 1 shows a request running and its counters frozen (a SIGSTOP, or an engine starved
    of CPU, or stale gauges). At half the liveness time the coordinator pins a one-token request to
    it: when that answers, the stall is no hang; when it does not, the engine is hung at liveness,
    also when every third scrape of /metrics fails (`gaps`: a busy API server)."""
    (tmp_path / "token").write_text("t")
    now = [0.0]
    sent: list[str] = []

    def observe() -> Observation:
        if gaps and int(now[0]) % 3 == 2:
            return Observation(now[0], {}, metrics_error="timed out")
        return Observation(now[0], {"0": EngineSample(0, 0, 5), "1": EngineSample(1, 0, 7)})

    def probe(engine: str) -> Probe:
        sent.append(engine)
        started = now[0]
        if answers:
            return Probe(started, engine, None, 0.2)
        while now[0] < started + 5:  # a stopped engine: the probe waits for its whole deadline
            time.sleep(0.005)
        return Probe(started, engine, "did not answer within 5 s")

    settings = Settings(("head",), ("0", "1"), 10, 30, 1, 1, 300, 30)
    config = CoordinatorConfig(str(tmp_path), "127.0.0.1", 0, "t", "http://x", "tiny", None, settings)
    coordinator = Coordinator(config, clock=lambda: now[0], observe=observe, probe=probe, out=lambda _: None)
    coordinator.state.phase = "serving"
    states = []
    for second in range(20):
        now[0] = float(second)
        verdicts = {v.engine: v for v in coordinator._judge()}
        time.sleep(0.1)  # the probe threads see the new time
        states.append(verdicts["1"].state)
    if gaps:  # a failed scrape is api-down at that look; every look that answered is hung from 10 s
        answered = {t: s for t, s in enumerate(states) if t % 3 != 2}
        assert all(s == "serving" for t, s in answered.items() if t < 10), states
        # the pinned request, sent at the first answered look 5 s into the stall (6 s), failed at 11 s
        assert [s for t, s in answered.items() if t >= 12] == ["hung"] * 6, states
        return
    assert "1" in sent
    assert states[:10] == ["serving"] * 10
    # Hung from the first look after the pinned request (sent at 5 s) failed at 10 s, and it stays so.
    assert states[11:] == (["hung"] * 9 if hung else ["serving"] * 9), states
    if hung:
        assert sent.count("1") == 1, "one failed pinned request settles it"
    if not hung:
        assert "answered in 0.2 s" in verdicts["1"].reason
