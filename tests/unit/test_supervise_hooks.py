"""The small pieces the verbs call (kit/cluster/serving_status.py) and the event record
(kit/supervise/events.py): what `kit status`, `kit logs --events` and `kit status --slurm` show,
SIGTERM unwinding like Ctrl-C, an interrupted `kit up` leaving nothing, stale ranks. The runtime
is a fake here (a list of containers); the real paths are in tests/integration."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from kit.cluster import serving_status
from kit.cluster.nodes import remove_after_interrupt
from kit.cluster.serving import stale_ranks
from kit.cluster.status import render_status
from kit.commands._signals import sigterm_as_interrupt
from kit.commands.status import render_slurm
from kit.runtime.base import NodeHandle
from kit.supervise import events
from kit.supervise.events import Event
from tests.conftest import make_config


def node(name: str, role: str = "worker", rank: int = 1, ip: str | None = None, state: str = "running") -> NodeHandle:
    return NodeHandle(name=name, cluster="c", role=role, rank=rank, state=state, ip=ip)


def test_events_round_trip_through_jsonl_and_slurm_output_lines() -> None:
    first = Event(
        1795641139.544, "detected", "vllm serve exited on node head (code 0)", 1, 0, "head", details=("Traceback", "x")
    )
    second = Event(1795641196.7, "ready", "serving", 2, 1, data={"recovery_s": 57.2})
    text = first.line() + "\n" + "garbage\n" + second.line() + "\n"
    assert events.parse_lines(text.splitlines()) == [first, second]
    slurm = [f"0: {events.EVENT_MARK} {first.line()}", "0: kit: other line", f"0: {events.EVENT_MARK} {second.line()}"]
    assert [e.kind for e in events.parse_lines(slurm)] == ["detected", "ready"]
    assert first.time == "2026-11-25T21:12:19.544Z"
    summary = events.summary(events.parse_lines(slurm))
    assert summary["restarts"] == 1 and summary["last_failure"] == first.reason and not summary["given_up"]
    rendered = events.render(events.parse_lines(slurm))
    assert "detected    gen 1   restarts 0   [head] vllm serve exited" in rendered and "    | Traceback" in rendered


def test_slurm_summary_reads_the_job_output(tmp_path: Path) -> None:
    out = tmp_path / "kit-1.out"
    lines = [Event(1.0, "detected", "engine 0 hung: ...", 1, 0), Event(2.0, "given-up", "gave up", 3, 2)]
    out.write_text("kit: job 1\n" + "".join(f"0: {events.EVENT_MARK} {e.line()}\n" for e in lines))
    summary = serving_status.slurm_summary(str(out))
    assert summary is not None and summary["restarts"] == 2 and summary["given_up"] and summary["events"] == 2
    assert "2 restart(s)" in render_slurm({"supervise": summary}) and "GAVE UP" in render_slurm({"supervise": summary})
    assert serving_status.slurm_summary(str(tmp_path / "missing")) is None and render_slurm({"supervise": None}) == ""


def test_missing_ray_nodes_are_named_when_local_and_counted_when_not() -> None:
    config = make_config(nodes=3)
    local = [node("kit-c-head", "head", 0, "10.0.0.10"), node("kit-c-worker-1", ip="10.0.0.11")]
    # A restarted head's Ray cluster: only the head is alive, nobody is "lost".
    ray = [{"ip": "10.0.0.10", "lost": False}]
    assert serving_status.missing_ray_nodes(config, ray, local) == [
        "kit-c-worker-1 (10.0.0.11)",
        "1 node(s) on other hosts",
    ]
    ray += [{"ip": "10.0.0.11", "lost": False}, {"ip": "10.0.0.12", "lost": False}]
    assert serving_status.missing_ray_nodes(config, ray, local) == []


def test_render_status_says_whether_the_model_is_served() -> None:
    result: dict[str, Any] = {
        "server": {
            "url": "http://h:8000",
            "serving": False,
            "state": "api-down",
            "reason": "/health: refused",
            "engines": [],
        },
        "supervise": {
            "active": True,
            "phase": "waiting",
            "generation": 2,
            "restarts": 1,
            "last_failure": "node worker-1 stopped reporting 6 s ago",
            "last_failure_time": "T",
        },
        "ray_missing": ["kit-c-worker-1 (10.0.0.11)"],
    }
    assert render_status(result) == [
        "server: NOT SERVING at http://h:8000: /health: refused",
        "supervisor: active, waiting, generation 2, 1 restart(s); last failure T: node worker-1 stopped reporting 6 s"
        " ago",
        "Ray: missing kit-c-worker-1 (10.0.0.11)",
    ]
    result["server"] = {"url": "u", "serving": True, "state": "idle-ok", "reason": None, "engines": [{}, {}]}
    assert render_status({"server": result["server"]}) == ["server: idle, answering at u (2 engine(s))"]


def test_sigterm_inside_the_block_is_an_interrupt_and_the_old_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 1)  # let the handler run
    assert signal.getsignal(signal.SIGTERM) == before


class FakeRuntime:
    """Containers by name; records removals."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.removed: list[str] = []
        self.clusters: list[str] = []

    def remove(self, name: str) -> bool:
        self.removed.append(name)
        self.names.remove(name)
        return True

    def find_nodes(self, cluster: str) -> list[NodeHandle]:
        return [node(n) for n in self.names]

    def remove_cluster(self, cluster: str) -> dict[str, list[str]]:
        self.clusters.append(cluster)
        return {"containers": [], "networks": [f"{cluster}-net"]}


@pytest.mark.parametrize(("others", "network_removed"), [([], True), (["kit-c-worker-1"], False)])
def test_an_interrupted_up_removes_its_container_and_the_network_only_when_alone(
    others: list[str], network_removed: bool
) -> None:
    runtime = FakeRuntime(["kit-c-head", *others])
    remove_after_interrupt(runtime, "c", "kit-c-head")  # type: ignore[arg-type]
    assert runtime.removed == ["kit-c-head"]
    assert runtime.clusters == (["c"] if network_removed else [])


def test_stale_ranks_are_ranks_whose_head_is_gone_and_nothing_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    from kit.net import openai as client

    head, worker = node("h", "head", 0), node("w")
    monkeypatch.setattr(client, "health", lambda url, timeout=3: False)
    assert stale_ranks(None, [head, worker], "u", lambda n: n is worker)  # type: ignore[arg-type]
    assert not stale_ranks(None, [head, worker], "u", lambda n: True)  # type: ignore[arg-type]  # head alive
    assert not stale_ranks(None, [head, worker], "u", lambda n: False)  # type: ignore[arg-type]  # nothing runs
    monkeypatch.setattr(client, "health", lambda url, timeout=3: True)
    assert not stale_ranks(None, [head, worker], "u", lambda n: n is worker)  # type: ignore[arg-type]


def test_the_dry_run_says_it_is_supervised_and_shows_the_settings() -> None:
    from click.testing import CliRunner

    from kit.cli import cli

    args = ["serve", "--dry-run", "--supervise", "--set", "backend=mp", "--set", "accelerator=cpu"]
    args += ["--set", "nodes=2", "--set", "timeouts.liveness=12"]
    out = CliRunner().invoke(cli, [*args, "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)["result"]
    assert doc["supervise"]["nodes"] == ["head", "worker-1"] and doc["supervise"]["liveness_s"] == 12
    text = CliRunner().invoke(cli, args).output
    assert "\n# supervised: an agent on 2 node(s)" in text and "liveness 12 s" in text  # stderr: the key warning


def test_render_status_gives_each_router_replica_its_own_supervisor_line() -> None:
    """Router replicas (issue 29): each replica's coordinator state under its row; a replica whose
    first node is on another host has none."""
    sup = {"active": True, "phase": "serving", "generation": 2, "restarts": 1, "last_failure": None}
    row = {"replica": 1, "nodes": [0], "port": 8101, "url": "http://h:8101", "routed": True, "healthy": True}
    router = {
        "url": "http://h:8000",
        "container": "kit-c-router",
        "state": "running",
        "policy": "round_robin",
        "replicas": [
            {**row, "server": {"serving": True}, "supervise": sup},
            {**row, "replica": 2, "nodes": [1], "url": None, "routed": False, "healthy": None},
        ],
        "others": [],
    }
    assert render_status({"router": router}) == [
        "router: kit-c-router running at http://h:8000 (round_robin)",
        "  replica 1 (nodes [0]): http://h:8101: routed, healthy, serving",
        "    supervisor: active, serving, generation 2, 1 restart(s)",
        "  replica 2 (nodes [1]): on another host: NOT ROUTED, -, -",
    ]
