"""The Ray head's barrier (kit/cluster/ray_barrier.py), run in-process against a fake `ray`
module (Ray is not installed beside kit; the real barrier runs in tests/integration with the
test-ray image): it waits for the GCS, then for every node AND the resource total, and never
reports a cluster it has not seen complete."""

from __future__ import annotations

import shlex
import sys
import types
from typing import Any

import pytest

from kit.cluster import ray_barrier
from kit.resources import program_source


class FakeRay(types.ModuleType):
    def __init__(self, init_failures: int, views: list[list[dict[str, Any]]]) -> None:
        super().__init__("ray")
        self.init_failures, self.views = init_failures, views
        self.calls: list[tuple[str, str]] = []

    def init(self, **kwargs: Any) -> None:
        self.calls.append(("init", kwargs["address"]))
        if self.init_failures:
            self.init_failures -= 1
            raise ConnectionError("GCS not ready")

    def nodes(self) -> list[dict[str, Any]]:
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]

    def shutdown(self) -> None:
        self.calls.append(("shutdown", ""))


def node(gpus: float, alive: bool = True) -> dict[str, Any]:
    return {"Alive": alive, "Resources": {"GPU": gpus}}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """time.monotonic advanced by each time.sleep, so the barrier's deadlines pass at once."""
    now = [0.0]
    fake = types.SimpleNamespace(monotonic=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    monkeypatch.setattr("kit.cluster.ray_barrier.time", fake)  # the barrier's clock only
    return now


def run(monkeypatch: pytest.MonkeyPatch, fake: FakeRay, *args: str) -> int:
    monkeypatch.setitem(sys.modules, "ray", fake)
    return ray_barrier.main(list(args))


def test_waits_for_the_gcs_then_every_node_and_the_resource_total(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clock: list[float]
) -> None:
    views = [[node(2)], [node(2), node(0)], [node(2), node(2, alive=False)], [node(2), node(2)]]
    fake = FakeRay(2, views)
    assert run(monkeypatch, fake, "2", "GPU", "4", "60", "10.0.0.1:6379", "KIT_READY") == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "kit: 1/2 nodes and 2/4 GPU alive",
        "kit: 2/2 nodes and 2/4 GPU alive",  # every node, not yet every GPU: not ready
        "kit: 1/2 nodes and 2/4 GPU alive",  # a dead node does not count
        "kit: 2/2 nodes and 4/4 GPU alive",
        "KIT_READY nodes=2 GPU=4",
    ]
    assert fake.calls == [("init", "10.0.0.1:6379")] * 3 + [("shutdown", "")]


def test_a_head_that_never_comes_up_fails_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clock: list[float]
) -> None:
    fake = FakeRay(10**6, [[]])
    assert run(monkeypatch, fake, "2", "GPU", "4", "5", "10.0.0.1:6379", "KIT_READY") == 1
    assert "kit: the Ray head did not come up: GCS not ready" in capsys.readouterr().out
    assert 5 <= clock[0] <= 6


def test_past_the_join_deadline_it_keeps_waiting_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clock: list[float]
) -> None:
    fake = FakeRay(0, [[node(2)]] * 30 + [[node(2), node(2)]])
    assert run(monkeypatch, fake, "2", "GPU", "4", "3", "h:1", "KIT_READY") == 0
    out = capsys.readouterr().out
    assert out.count("join deadline passed") == 1 and out.endswith("KIT_READY nodes=2 GPU=4\n")


def test_the_launchers_carry_this_file() -> None:
    from kit.plan.roles import HEAD
    from kit.plan.scripts import node_script
    from tests.unit.test_cluster import cpu_config

    script = node_script(cpu_config(backend="ray"), HEAD)
    words = [w for w in shlex.split(script, comments=True) if "def main(argv" in w]
    assert words == [program_source("cluster/ray_barrier.py")]  # the whole file, as one word
    assert "<<" not in script
